#include "server/checkpoint.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/safetensors.h"
#include "common/testing/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

namespace fs = std::filesystem;

// A fresh directory per test under $TEST_TMPDIR, named after the test.
std::string FreshDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/checkpoint_test/",
                                       info->test_suite_name(), ".", info->name());
  fs::remove_all(dir);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::set<std::string> ListDir(const std::string& dir) {
  std::set<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    names.insert(e.path().filename().string());
  }
  return names;
}

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A small signature with a scalar and an empty tensor, and values that only a
// bit-exact path keeps: -0, a denormal, infinities, a NaN with a payload.
CheckpointContents SmallContents(int64_t version, bool with_momentum) {
  CheckpointContents c;
  c.version = version;
  c.steps_per_epoch = 469;
  c.job = {{"num_workers", "2"}, {"lr", "0.9"}, {"momentum", "0.9"}, {"shard", "0/1"}};
  c.signature = {{"fc1.weight", {3, 4}}, {"fc1.bias", {3}}, {"scale", {}}, {"empty", {0, 2}}};
  for (int i = 0; i < 16; ++i) c.parameters.push_back(0.25f * i - 1.f + 0.001f * version);
  c.parameters[1] = -0.f;
  c.parameters[2] = FromBits(0x00000001);  // the smallest denormal
  c.parameters[3] = std::numeric_limits<float>::infinity();
  c.parameters[4] = -std::numeric_limits<float>::infinity();
  c.parameters[5] = FromBits(0x7fc12345);  // a NaN with a payload
  if (with_momentum) {
    for (int i = 0; i < 16; ++i) c.momentum.push_back(-0.125f * i + 0.01f * version);
    c.momentum[7] = FromBits(0x80000001);
  }
  return c;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

void ExpectSameContents(const CheckpointContents& got, const CheckpointContents& want) {
  EXPECT_EQ(got.version, want.version);
  EXPECT_EQ(got.steps_per_epoch, want.steps_per_epoch);
  EXPECT_EQ(got.job, want.job);
  EXPECT_EQ(got.signature, want.signature);
  EXPECT_TRUE(SameBits(got.parameters, want.parameters));
  EXPECT_TRUE(SameBits(got.momentum, want.momentum));
  EXPECT_EQ(got.loss_scale, want.loss_scale);
  EXPECT_EQ(got.loss_scale_clean_iterations, want.loss_scale_clean_iterations);
  EXPECT_EQ(got.loss_scale_skipped_iterations, want.loss_scale_skipped_iterations);
}

std::string Path(const std::string& dir, const std::string& name) {
  return absl::StrCat(dir, "/", name);
}

// Writes versions `versions` (with momentum) with the default keep.
void WriteVersions(const std::string& dir, std::initializer_list<int64_t> versions, int keep = 3) {
  for (int64_t v : versions) {
    absl::StatusOr<std::string> path = WriteCheckpoint({dir, keep}, SmallContents(v, true));
    ASSERT_TRUE(path.ok()) << path.status();
  }
}

// Loads the newest and expects version `want`, having refused exactly
// `refused_count` newer ones; returns the refusals.
std::vector<std::string> ExpectLoads(const std::string& dir, int64_t want, size_t refused_count) {
  std::vector<std::string> refused;
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir, &refused);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  if (loaded.ok()) {
    ExpectSameContents(loaded->contents, SmallContents(want, true));
    EXPECT_EQ(loaded->manifest_path, Path(dir, CheckpointManifestFileName(want)));
  }
  EXPECT_THAT(refused, SizeIs(refused_count)) << ::testing::PrintToString(refused);
  return refused;
}

TEST(CheckpointTest, FileNames) {
  EXPECT_EQ(CheckpointParamsFileName(42), "params-000000000042.safetensors");
  EXPECT_EQ(CheckpointMomentumFileName(0), "momentum-000000000000.safetensors");
  EXPECT_EQ(CheckpointManifestFileName(1234567890123), "checkpoint-1234567890123.json");
}

TEST(CheckpointTest, RoundTripWithoutMomentumIsBitExact) {
  const std::string dir = FreshDir() + "/a/b";  // parents created too
  const CheckpointContents want = SmallContents(7, false);
  absl::StatusOr<std::string> path = WriteCheckpoint({dir}, want);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, Path(dir, "checkpoint-000000000007.json"));
  EXPECT_EQ(ListDir(dir), (std::set<std::string>{"checkpoint-000000000007.json",
                                                  "params-000000000007.safetensors"}));

  std::vector<std::string> refused;
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir, &refused);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_THAT(refused, IsEmpty());
  EXPECT_EQ(loaded->manifest_path, *path);
  ExpectSameContents(loaded->contents, want);
  EXPECT_THAT(loaded->contents.momentum, IsEmpty());

  // The params file is an ordinary safetensors state dict.
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(Path(dir, CheckpointParamsFileName(7)));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata.at("format"), "pt");
  EXPECT_THAT(file->tensors, SizeIs(4));
}

TEST(CheckpointTest, RoundTripWithMomentumIsBitExact) {
  const std::string dir = FreshDir();
  const CheckpointContents want = SmallContents(12, true);
  ASSERT_TRUE(WriteCheckpoint({dir}, want).ok());
  EXPECT_EQ(ListDir(dir),
            (std::set<std::string>{"checkpoint-000000000012.json", "params-000000000012.safetensors",
                                   "momentum-000000000012.safetensors"}));
  std::vector<std::string> refused;
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir, &refused);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_THAT(refused, IsEmpty());
  ExpectSameContents(loaded->contents, want);
  // A null `refused` is allowed.
  EXPECT_TRUE(LoadNewestCheckpoint(dir, nullptr).ok());
}

// Dynamic loss scaling's state travels with the checkpoint (and a manifest
// without it, as before loss scaling existed, loads with none); a bad one
// is refused by name.
TEST(CheckpointTest, LossScaleRoundTripsAndIsChecked) {
  const std::string dir = FreshDir();
  CheckpointContents want = SmallContents(5, true);
  want.loss_scale = 2048.f;
  want.loss_scale_clean_iterations = 17;
  want.loss_scale_skipped_iterations = 3;
  ASSERT_TRUE(WriteCheckpoint({dir}, want).ok());
  const std::string manifest_path = Path(dir, CheckpointManifestFileName(5));
  const std::string manifest = ReadFile(manifest_path);
  EXPECT_THAT(manifest, HasSubstr("\"loss_scale\""));
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameContents(loaded->contents, want);

  const std::string other = FreshDir();
  ASSERT_TRUE(WriteCheckpoint({other}, SmallContents(5, true)).ok());
  EXPECT_THAT(ReadFile(Path(other, CheckpointManifestFileName(5))),
              Not(HasSubstr("loss_scale")));
  loaded = LoadNewestCheckpoint(other, nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->contents.loss_scale, 0.f);

  {
    std::ofstream out(manifest_path, std::ios::trunc);
    out << absl::StrReplaceAll(manifest, {{"\"clean_iterations\"", "\"clean\""}});
  }
  std::vector<std::string> refused;
  EXPECT_FALSE(LoadNewestCheckpoint(dir, &refused).ok());
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_THAT(refused[0], HasSubstr("loss_scale lacks field 'clean_iterations'"));

  // Numbers a float or a counter cannot hold are refused by name: a scale
  // that would be infinity, or zero ("no scale"), and a version or count
  // that the resumed server would overflow counting on.
  for (const auto& [from, to, problem] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"\"scale\": 2048.0", "\"scale\": 1e39", "loss_scale.scale"},
           {"\"scale\": 2048.0", "\"scale\": 1e-50", "loss_scale.scale"},
           {"\"clean_iterations\": 17", "\"clean_iterations\": 9223372036854775807",
            "loss_scale.clean_iterations"},
       }) {
    const std::string bad = absl::StrReplaceAll(manifest, {{from, to}});
    ASSERT_NE(bad, manifest) << from;
    {
      std::ofstream out(manifest_path, std::ios::trunc);
      out << bad;
    }
    refused.clear();
    EXPECT_FALSE(LoadNewestCheckpoint(dir, &refused).ok()) << to;
    ASSERT_EQ(refused.size(), 1u);
    EXPECT_THAT(refused[0], HasSubstr(problem)) << to;
  }
}

TEST(CheckpointTest, ManifestListsEveryField) {
  const std::string dir = FreshDir();
  ASSERT_TRUE(WriteCheckpoint({dir}, SmallContents(3, true)).ok());
  const std::string manifest = ReadFile(Path(dir, CheckpointManifestFileName(3)));
  for (const char* field : {"\"format\": \"ps-checkpoint\"", "\"format_version\": 1",
                            "\"version\": 3", "\"steps_per_epoch\": 469", "\"num_workers\": \"2\"",
                            "\"shard\": \"0/1\"", "\"fc1.weight\"", "\"F32\"", "\"crc32\"",
                            "\"bytes\"", "\"params-000000000003.safetensors\"",
                            "\"momentum-000000000003.safetensors\""}) {
    EXPECT_THAT(manifest, HasSubstr(field));
  }
  // The CRC-32 listed is zlib's of the whole file.
  const std::string params = ReadFile(Path(dir, CheckpointParamsFileName(3)));
  const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(params.data()),
                          static_cast<uInt>(params.size()));
  EXPECT_THAT(manifest, HasSubstr(absl::StrCat("\"crc32\": ", crc)));
  EXPECT_THAT(manifest, HasSubstr(absl::StrCat("\"bytes\": ", params.size())));
}

TEST(CheckpointTest, KeepsOnlyTheNewest) {
  const std::string dir = FreshDir();
  WriteVersions(dir, {1, 2, 3, 4}, /*keep=*/2);
  // Leftovers of crashed writes: data without a manifest, temporary files.
  WriteFile(Path(dir, CheckpointParamsFileName(9)), "partial");
  WriteFile(Path(dir, CheckpointManifestFileName(8) + ".tmp"), "{");
  WriteFile(Path(dir, CheckpointMomentumFileName(4) + ".tmp"), "x");
  WriteFile(Path(dir, "notes.txt"), "not ours");
  WriteVersions(dir, {5}, /*keep=*/2);
  EXPECT_EQ(ListDir(dir),
            (std::set<std::string>{"checkpoint-000000000004.json", "params-000000000004.safetensors",
                                   "momentum-000000000004.safetensors",
                                   "checkpoint-000000000005.json", "params-000000000005.safetensors",
                                   "momentum-000000000005.safetensors", "notes.txt"}));
  ExpectLoads(dir, 5, 0);
}

TEST(CheckpointTest, KeepOneNeverDeletesTheCheckpointJustWritten) {
  const std::string dir = FreshDir();
  WriteVersions(dir, {5}, /*keep=*/1);
  // A server resumed from an older checkpoint writes below a newer one.
  WriteVersions(dir, {3}, /*keep=*/1);
  EXPECT_EQ(ListDir(dir),
            (std::set<std::string>{"checkpoint-000000000003.json", "params-000000000003.safetensors",
                                   "momentum-000000000003.safetensors"}));
  ExpectLoads(dir, 3, 0);
}

// A server that resumed from version 3 (4 and 5 refused at its start, say)
// writes 4 over the abandoned 4 and deletes the abandoned 5 rather than
// keeping it among the newest: a later start would resume from 5 and throw
// the run since away. Older ones fill the keep.
TEST(CheckpointTest, NewerCheckpointsOfAnAbandonedHistoryAreDeleted) {
  const std::string dir = FreshDir();
  WriteVersions(dir, {1, 2, 3, 4, 5}, /*keep=*/10);
  WriteVersions(dir, {4}, /*keep=*/3);
  EXPECT_EQ(ListDir(dir),
            (std::set<std::string>{"checkpoint-000000000002.json", "params-000000000002.safetensors",
                                   "momentum-000000000002.safetensors",
                                   "checkpoint-000000000003.json", "params-000000000003.safetensors",
                                   "momentum-000000000003.safetensors",
                                   "checkpoint-000000000004.json", "params-000000000004.safetensors",
                                   "momentum-000000000004.safetensors"}));
  ExpectLoads(dir, 4, 0);
}

// A restore to version 3: one version loaded exactly, the versions listed,
// the newer ones moved aside (not deleted) so the resume scan finds 3, and
// a later write keeps its usual clean-up without touching them.
TEST(CheckpointTest, RestoreLoadsOneVersionAndSetsTheNewerAside) {
  const std::string dir = FreshDir();
  absl::StatusOr<std::vector<int64_t>> none = ListCheckpointVersions(dir);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_THAT(*none, IsEmpty());
  WriteVersions(dir, {2, 3, 4, 5}, /*keep=*/10);
  EXPECT_THAT(ListCheckpointVersions(dir).value(), ElementsAre(2, 3, 4, 5));
  absl::StatusOr<LoadedCheckpoint> three = LoadCheckpointOfVersion(dir, 3);
  ASSERT_TRUE(three.ok()) << three.status();
  ExpectSameContents(three->contents, SmallContents(3, true));
  EXPECT_EQ(three->manifest_path, Path(dir, CheckpointManifestFileName(3)));
  // Absent, negative and corrupt versions are refused by name.
  EXPECT_EQ(LoadCheckpointOfVersion(dir, 7).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(LoadCheckpointOfVersion(dir, 7).status().message(),
              HasSubstr(CheckpointManifestFileName(7)));
  EXPECT_EQ(LoadCheckpointOfVersion(dir, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string params2 = Path(dir, CheckpointParamsFileName(2));
  ASSERT_EQ(::truncate(params2.c_str(), fs::file_size(params2) - 5), 0);
  EXPECT_THAT(LoadCheckpointOfVersion(dir, 2).status().message(), HasSubstr("truncated"));

  ASSERT_TRUE(SetAsideCheckpointsAfter(dir, 3).ok());
  EXPECT_EQ(ListDir(dir),
            (std::set<std::string>{"checkpoint-000000000002.json", "params-000000000002.safetensors",
                                   "momentum-000000000002.safetensors",
                                   "checkpoint-000000000003.json", "params-000000000003.safetensors",
                                   "momentum-000000000003.safetensors", "abandoned"}));
  EXPECT_EQ(ListDir(Path(dir, "abandoned")),
            (std::set<std::string>{"checkpoint-000000000004.json", "params-000000000004.safetensors",
                                   "momentum-000000000004.safetensors",
                                   "checkpoint-000000000005.json", "params-000000000005.safetensors",
                                   "momentum-000000000005.safetensors"}));
  ExpectLoads(dir, 3, 0);
  // Nothing newer: nothing moved, no error.
  ASSERT_TRUE(SetAsideCheckpointsAfter(dir, 3).ok());
  WriteVersions(dir, {4}, /*keep=*/2);
  EXPECT_TRUE(ListDir(dir).count("abandoned"));
  ExpectLoads(dir, 4, 0);
}

TEST(CheckpointTest, RewritingAVersionReplacesIt) {
  const std::string dir = FreshDir();
  CheckpointContents first = SmallContents(4, true);
  first.parameters[0] = 123.f;
  ASSERT_TRUE(WriteCheckpoint({dir}, first).ok());
  ASSERT_TRUE(WriteCheckpoint({dir}, SmallContents(4, false)).ok());
  EXPECT_EQ(ListDir(dir), (std::set<std::string>{"checkpoint-000000000004.json",
                                                  "params-000000000004.safetensors"}));
  std::vector<std::string> refused;
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir, &refused);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameContents(loaded->contents, SmallContents(4, false));
}

TEST(CheckpointTest, TruncatedParamsFileIsRefusedAndThePreviousLoaded) {
  const std::string dir = FreshDir();
  WriteVersions(dir, {1, 2});
  const std::string params = Path(dir, CheckpointParamsFileName(2));
  ASSERT_EQ(::truncate(params.c_str(), fs::file_size(params) - 5), 0);
  const std::vector<std::string> refused = ExpectLoads(dir, 1, 1);
  ASSERT_THAT(refused, SizeIs(1));
  EXPECT_THAT(refused[0], HasSubstr(params));
  EXPECT_THAT(refused[0], HasSubstr("truncated"));
  EXPECT_THAT(refused[0], HasSubstr(Path(dir, CheckpointManifestFileName(2))));
}

// A FIFO where a data file or the newest manifest belongs is refused by
// name (opening it to read would wait for a writer forever), and the
// previous checkpoint is loaded.
TEST(CheckpointTest, AFifoInPlaceOfAFileIsRefusedNotWaitedOn) {
  for (const bool manifest : {false, true}) {
    const std::string dir = FreshDir();
    WriteVersions(dir, {1, 2});
    const std::string fifo =
        Path(dir, manifest ? CheckpointManifestFileName(2) : CheckpointParamsFileName(2));
    ASSERT_EQ(::unlink(fifo.c_str()), 0);
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    const std::vector<std::string> refused = ExpectLoads(dir, 1, 1);
    ASSERT_THAT(refused, SizeIs(1));
    EXPECT_THAT(refused[0], HasSubstr("not a regular file"));
  }
}

TEST(CheckpointTest, LongerFileIsRefused) {
  const std::string dir = FreshDir();
  WriteVersions(dir, {1, 2});
  const std::string momentum = Path(dir, CheckpointMomentumFileName(2));
  WriteFile(momentum, ReadFile(momentum) + "extra");
  const std::vector<std::string> refused = ExpectLoads(dir, 1, 1);
  ASSERT_THAT(refused, SizeIs(1));
  EXPECT_THAT(refused[0], HasSubstr(momentum));
  EXPECT_THAT(refused[0], HasSubstr("size mismatch"));
}

TEST(CheckpointTest, FlippedBitIsACrcMismatch) {
  for (const bool in_momentum : {false, true}) {
    SCOPED_TRACE(in_momentum ? "momentum" : "params");
    const std::string dir = FreshDir();
    WriteVersions(dir, {1, 2});
    const std::string path = Path(dir, in_momentum ? CheckpointMomentumFileName(2)
                                                   : CheckpointParamsFileName(2));
    std::string bytes = ReadFile(path);
    bytes[bytes.size() - 7] ^= 0x10;  // in the data, not the header
    WriteFile(path, bytes);
    const std::vector<std::string> refused = ExpectLoads(dir, 1, 1);
    ASSERT_THAT(refused, SizeIs(1));
    EXPECT_THAT(refused[0], HasSubstr(path));
    EXPECT_THAT(refused[0], HasSubstr("CRC-32 mismatch"));
  }
}

TEST(CheckpointTest, MissingDataFileIsRefused) {
  const std::string dir = FreshDir();
  WriteVersions(dir, {1, 2});
  const std::string momentum = Path(dir, CheckpointMomentumFileName(2));
  ASSERT_EQ(::unlink(momentum.c_str()), 0);
  const std::vector<std::string> refused = ExpectLoads(dir, 1, 1);
  ASSERT_THAT(refused, SizeIs(1));
  EXPECT_THAT(refused[0], HasSubstr(momentum));
  EXPECT_THAT(refused[0], HasSubstr("missing file"));
}

// Rewrites checkpoint `version`'s manifest with `edit` applied to its text.
void EditManifest(const std::string& dir, int64_t version,
                  const std::function<std::string(std::string)>& edit) {
  const std::string path = Path(dir, CheckpointManifestFileName(version));
  WriteFile(path, edit(ReadFile(path)));
}

struct ManifestCase {
  const char* name;
  std::function<std::string(std::string)> edit;
  const char* message;  // in the refusal
};

TEST(CheckpointTest, CorruptManifestsAreRefusedByName) {
  const std::vector<ManifestCase> cases = {
      {"bad JSON", [](std::string s) { return s.substr(0, s.size() / 2); }, "bad JSON"},
      {"empty", [](std::string) { return std::string(); }, "bad JSON"},
      {"not an object", [](std::string) { return std::string("[1, 2]"); }, "not a JSON object"},
      {"too deep", [](std::string) { return std::string(100000, '[') + std::string(100000, ']'); },
       "nested deeper"},
      {"missing field",
       [](std::string s) { return absl::StrReplaceAll(s, {{"\"steps_per_epoch\"", "\"spe\""}}); },
       "lacks field 'steps_per_epoch'"},
      {"wrong type",
       [](std::string s) { return absl::StrReplaceAll(s, {{"\"version\": 2", "\"version\": \"2\""}}); },
       "version is not an integer"},
      {"wrong version",
       [](std::string s) { return absl::StrReplaceAll(s, {{"\"version\": 2", "\"version\": 3"}}); },
       "file name says 2"},
      {"future format",
       [](std::string s) {
         return absl::StrReplaceAll(s, {{"\"format_version\": 1", "\"format_version\": 2"}});
       },
       "format_version is 2"},
      {"job value not a string",
       [](std::string s) { return absl::StrReplaceAll(s, {{"\"2\"", "2"}}); },
       "job.num_workers is not a string"},
      {"not F32",
       [](std::string s) { return absl::StrReplaceAll(s, {{"\"F32\"", "\"F16\""}}); },
       "not F32"},
      {"data file elsewhere",
       [](std::string s) {
         return absl::StrReplaceAll(
             s, {{"\"params-000000000002.safetensors\"", "\"../params-000000000002.safetensors\""}});
       },
       "checkpoint files are named 'params-000000000002.safetensors'"},
      {"crc out of range",
       [](std::string s) {
         return absl::StrReplaceAll(s, {{"\"crc32\": ", "\"crc32\": 99999999999"}});
       },
       "crc32 is"},
  };
  for (const ManifestCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = FreshDir();
    WriteVersions(dir, {1, 2});
    EditManifest(dir, 2, c.edit);
    const std::vector<std::string> refused = ExpectLoads(dir, 1, 1);
    ASSERT_THAT(refused, SizeIs(1));
    EXPECT_THAT(refused[0], HasSubstr(Path(dir, CheckpointManifestFileName(2))));
    EXPECT_THAT(refused[0], HasSubstr(c.message));
  }
}

// A manifest whose numbers promise far more than the files hold is refused
// before anything is sized from it.
TEST(CheckpointTest, HostileSizesAllocateNothing) {
  const std::string dir = FreshDir();
  WriteVersions(dir, {1, 2});
  // 2^50 elements: a 4 PiB buffer if it were believed.
  EditManifest(dir, 2, [](std::string s) {
    return absl::StrReplaceAll(s, {{"\"shape\": [\n    3,\n    4\n   ]",
                                    "\"shape\": [\n    1125899906842624\n   ]"}});
  });
  ASSERT_THAT(ReadFile(Path(dir, CheckpointManifestFileName(2))), HasSubstr("1125899906842624"));
  std::vector<std::string> refused = ExpectLoads(dir, 1, 1);
  ASSERT_THAT(refused, SizeIs(1));
  EXPECT_THAT(refused[0], HasSubstr("signature needs"));

  // A huge listed size meets the real file's.
  WriteVersions(dir, {2});
  EditManifest(dir, 2, [](std::string s) {
    const size_t at = s.find("\"bytes\": ") + 9;
    return s.substr(0, at) + "9000000000000000000" + s.substr(s.find(',', at));
  });
  refused = ExpectLoads(dir, 1, 1);
  ASSERT_THAT(refused, SizeIs(1));
  EXPECT_THAT(refused[0], HasSubstr("truncated"));

  // Overflowing shapes.
  WriteVersions(dir, {2});
  EditManifest(dir, 2, [](std::string s) {
    return absl::StrReplaceAll(s, {{"\"shape\": [\n    3,\n    4\n   ]",
                                    "\"shape\": [\n    4294967296,\n    4294967296\n   ]"}});
  });
  refused = ExpectLoads(dir, 1, 1);
  ASSERT_THAT(refused, SizeIs(1));
  EXPECT_THAT(refused[0], HasSubstr("too large"));
}

// The data files carry the right size and CRC-32 but not the signature's
// tensors: a file from another model.
TEST(CheckpointTest, TensorsNotMatchingTheSignatureAreRefused) {
  const std::vector<std::vector<NamedHostTensor>> files = {
      // A different shape with the same number of elements.
      {*NamedHostTensor::FromFloats("fc1.weight", {4, 3}, std::vector<float>(12)),
       *NamedHostTensor::FromFloats("fc1.bias", {3}, std::vector<float>(3)),
       *NamedHostTensor::FromFloats("scale", {}, {1.f}),
       *NamedHostTensor::FromFloats("empty", {0, 2}, {})},
      // A tensor missing.
      {*NamedHostTensor::FromFloats("fc1.weight", {3, 4}, std::vector<float>(12)),
       *NamedHostTensor::FromFloats("scale", {}, {1.f}),
       *NamedHostTensor::FromFloats("empty", {0, 2}, {})},
      // One more.
      {*NamedHostTensor::FromFloats("fc1.weight", {3, 4}, std::vector<float>(12)),
       *NamedHostTensor::FromFloats("fc1.bias", {3}, std::vector<float>(3)),
       *NamedHostTensor::FromFloats("scale", {}, {1.f}),
       *NamedHostTensor::FromFloats("empty", {0, 2}, {}),
       *NamedHostTensor::FromFloats("fc2.bias", {1}, {1.f})},
      // Not F32.
      {*NamedHostTensor::FromFloats("fc1.weight", {3, 4}, std::vector<float>(12)),
       *NamedHostTensor::FromInt64s("fc1.bias", {3}, {1, 2, 3}),
       *NamedHostTensor::FromFloats("scale", {}, {1.f}),
       *NamedHostTensor::FromFloats("empty", {0, 2}, {})},
  };
  const std::vector<std::string> messages = {"is F32 [4, 3]; the signature says F32 [3, 4]",
                                             "no tensor 'fc1.bias'", "'fc2.bias' is not in",
                                             "'fc1.bias' is I64"};
  for (size_t i = 0; i < files.size(); ++i) {
    SCOPED_TRACE(messages[i]);
    const std::string dir = FreshDir();
    WriteVersions(dir, {1, 2});
    const std::string params = Path(dir, CheckpointParamsFileName(2));
    const std::string old_bytes = ReadFile(params);
    ASSERT_TRUE(WriteSafetensors(params, files[i]).ok());
    const std::string bytes = ReadFile(params);
    const uLong old_crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(old_bytes.data()),
                                static_cast<uInt>(old_bytes.size()));
    const uLong crc = crc32(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()),
                            static_cast<uInt>(bytes.size()));
    EditManifest(dir, 2, [&](std::string s) {
      const std::string old_entry =
          absl::StrCat("\"bytes\": ", old_bytes.size(), ",\n   \"crc32\": ", old_crc);
      EXPECT_THAT(s, HasSubstr(old_entry));
      return absl::StrReplaceAll(
          s, {{old_entry, absl::StrCat("\"bytes\": ", bytes.size(), ",\n   \"crc32\": ", crc)}});
    });
    const std::vector<std::string> refused = ExpectLoads(dir, 1, 1);
    ASSERT_THAT(refused, SizeIs(1));
    EXPECT_THAT(refused[0], HasSubstr(params));
    EXPECT_THAT(refused[0], HasSubstr(messages[i]));
  }
}

TEST(CheckpointTest, DataFilesWithoutAManifestAreIgnored) {
  const std::string dir = FreshDir();
  WriteVersions(dir, {1});
  // A crashed write of version 2: its data is in place, its manifest is not.
  fs::copy_file(Path(dir, CheckpointParamsFileName(1)), Path(dir, CheckpointParamsFileName(2)));
  WriteFile(Path(dir, CheckpointManifestFileName(2) + ".tmp"), "{\"format\"");
  ExpectLoads(dir, 1, 0);

  // Only leftovers: no checkpoint at all.
  const std::string only_leftovers = FreshDir() + "_leftovers";
  fs::create_directories(only_leftovers);
  WriteFile(Path(only_leftovers, CheckpointParamsFileName(3)), "x");
  WriteFile(Path(only_leftovers, "checkpoint-3.json"), "{}");  // not our name
  std::vector<std::string> refused;
  EXPECT_EQ(LoadNewestCheckpoint(only_leftovers, &refused).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(refused, IsEmpty());
}

TEST(CheckpointTest, EmptyOrMissingDirectoryIsNotFound) {
  const std::string dir = FreshDir();
  std::vector<std::string> refused;
  EXPECT_EQ(LoadNewestCheckpoint(dir, &refused).status().code(), absl::StatusCode::kNotFound);
  fs::create_directories(dir);
  EXPECT_EQ(LoadNewestCheckpoint(dir, &refused).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(refused, IsEmpty());

  WriteFile(dir + "/file", "x");
  EXPECT_EQ(LoadNewestCheckpoint(dir + "/file", &refused).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CheckpointTest, AllCorruptIsDataLossListingEach) {
  const std::string dir = FreshDir();
  WriteVersions(dir, {1, 2, 3});
  const std::string params1 = Path(dir, CheckpointParamsFileName(1));
  ASSERT_EQ(::truncate(params1.c_str(), 10), 0);
  EditManifest(dir, 2, [](std::string s) { return s + "}"; });
  const std::string momentum3 = Path(dir, CheckpointMomentumFileName(3));
  ASSERT_EQ(::unlink(momentum3.c_str()), 0);

  std::vector<std::string> refused = {"earlier"};
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir, &refused);
  ASSERT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
  ASSERT_THAT(refused, SizeIs(4));  // appended, newest first
  EXPECT_EQ(refused[0], "earlier");
  EXPECT_THAT(refused[1], HasSubstr(momentum3));
  EXPECT_THAT(refused[2], HasSubstr(Path(dir, CheckpointManifestFileName(2))));
  EXPECT_THAT(refused[2], HasSubstr("bad JSON"));
  EXPECT_THAT(refused[3], HasSubstr(params1));
  for (size_t i = 1; i < refused.size(); ++i) {
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(refused[i]));
  }
}

TEST(CheckpointTest, InvalidContentsTouchNothing) {
  const std::string dir = FreshDir();
  struct Case {
    const char* name;
    CheckpointOptions options;
    std::function<void(CheckpointContents&)> edit;
  };
  const std::vector<Case> cases = {
      {"empty directory", {"", 3}, [](CheckpointContents&) {}},
      {"keep 0", {dir, 0}, [](CheckpointContents&) {}},
      {"negative version", {dir, 3}, [](CheckpointContents& c) { c.version = -1; }},
      {"negative steps", {dir, 3}, [](CheckpointContents& c) { c.steps_per_epoch = -1; }},
      {"empty signature", {dir, 3}, [](CheckpointContents& c) { c.signature.clear(); }},
      {"not F32", {dir, 3}, [](CheckpointContents& c) { c.signature[1].dtype = DType::kF16; }},
      {"negative dim", {dir, 3}, [](CheckpointContents& c) { c.signature[3].shape = {-1, 0}; }},
      {"duplicate", {dir, 3}, [](CheckpointContents& c) { c.signature[2].name = "fc1.bias"; }},
      {"empty name", {dir, 3}, [](CheckpointContents& c) { c.signature[2].name = ""; }},
      {"reserved", {dir, 3}, [](CheckpointContents& c) { c.signature[2].name = "__metadata__"; }},
      {"bad UTF-8 name", {dir, 3}, [](CheckpointContents& c) { c.signature[2].name = "\xff"; }},
      {"bad UTF-8 job", {dir, 3}, [](CheckpointContents& c) { c.job["x"] = "\xc3"; }},
      {"short parameters", {dir, 3}, [](CheckpointContents& c) { c.parameters.pop_back(); }},
      {"short momentum", {dir, 3}, [](CheckpointContents& c) { c.momentum.pop_back(); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    CheckpointContents contents = SmallContents(1, true);
    c.edit(contents);
    EXPECT_EQ(WriteCheckpoint(c.options, contents).status().code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(fs::exists(dir));
  }
}

TEST(CheckpointTest, UnwritableDirectoryIsAnError) {
  const std::string dir = FreshDir();
  fs::create_directories(dir);
  WriteFile(dir + "/file", "x");
  absl::StatusOr<std::string> path = WriteCheckpoint({dir + "/file/sub"}, SmallContents(1, false));
  EXPECT_EQ(path.status().code(), absl::StatusCode::kFailedPrecondition) << path.status();
}

// ---------------------------------------------------------------------------
// PyTorch loads the params file into a model (strict=False: the batch-norm
// buffers are not parameters) and gives back the bits written.

TEST(CheckpointTorchTest, TorchLoadsTheParamsIntoAModel) {
  const std::string python = testing::FindPython("torch");
  if (python.empty()) {
    GTEST_SKIP() << "no python3 with torch (tried /usr/bin/python3 and python3 on PATH); "
                    "install Debian's python3-torch to run the PyTorch check";
  }
  // Linear(4, 3) -> BatchNorm1d(3) -> Linear(3, 2)'s trainable parameters.
  CheckpointContents c;
  c.version = 17;
  c.signature = {{"0.weight", {3, 4}}, {"0.bias", {3}}, {"1.weight", {3}},
                 {"1.bias", {3}},      {"2.weight", {2, 3}}, {"2.bias", {2}}};
  for (int i = 0; i < 12 + 3 + 3 + 3 + 6 + 2; ++i) {
    c.parameters.push_back(std::ldexp(static_cast<float>(i * 7919 % 1000) - 500.f, -7 - i % 5));
  }
  c.parameters[0] = -0.f;
  c.parameters[1] = FromBits(0x00000003);
  c.momentum.assign(c.parameters.size(), 0.5f);
  const std::string dir = FreshDir();
  ASSERT_TRUE(WriteCheckpoint({dir}, c).ok());

  const std::string out = dir + "/torch.txt";
  std::string output;
  const std::string script = testing::RunfilePath("server/checkpoint_test_torch.py");
  const int code =
      testing::RunCommand(absl::StrCat(python, " ", testing::ShellQuote(script), " ",
                                       testing::ShellQuote(Path(dir, CheckpointParamsFileName(17))),
                                       " ", testing::ShellQuote(out)),
                          &output);
  ASSERT_EQ(code, 0) << output;
  std::cout << output;

  std::vector<float> got;
  std::vector<std::string> names;
  std::ifstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> fields = absl::StrSplit(line, ' ');
    names.push_back(fields[0]);
    for (size_t i = 1; i < fields.size(); ++i) {
      got.push_back(static_cast<float>(std::strtod(fields[i].c_str(), nullptr)));
    }
  }
  EXPECT_THAT(names, ElementsAre("0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"));
  EXPECT_TRUE(SameBits(got, c.parameters));
}

// ---------------------------------------------------------------------------
// What a checkpoint costs at a realistic size: 11M parameters (ResNet-18's
// 11.2M) with momentum, timed once and logged for the server's integrator.

TEST(CheckpointTimingTest, ElevenMillionParameters) {
  constexpr int64_t kRows = 11'000;
  constexpr int64_t kCols = 1'000;
  CheckpointContents c;
  c.version = 1000;
  c.signature = {{"big.weight", {kRows, kCols}}};
  c.parameters.resize(kRows * kCols);
  c.momentum.resize(kRows * kCols);
  for (size_t i = 0; i < c.parameters.size(); ++i) {
    c.parameters[i] = static_cast<float>(i % 1013) * 0.001f;
    c.momentum[i] = -static_cast<float>(i % 997) * 0.002f;
  }
  const std::string dir = FreshDir();
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  absl::StatusOr<std::string> path = WriteCheckpoint({dir}, c);
  const Clock::time_point t1 = Clock::now();
  ASSERT_TRUE(path.ok()) << path.status();
  std::vector<std::string> refused;
  absl::StatusOr<LoadedCheckpoint> loaded = LoadNewestCheckpoint(dir, &refused);
  const Clock::time_point t2 = Clock::now();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(SameBits(loaded->contents.parameters, c.parameters));
  EXPECT_TRUE(SameBits(loaded->contents.momentum, c.momentum));
  auto ms = [](Clock::duration d) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  };
  std::cout << "checkpoint of " << c.parameters.size() << " parameters + momentum ("
            << 2 * c.parameters.size() * 4 / 1000000 << " MB of data): write " << ms(t1 - t0)
            << " ms (fsyncs and CRC read-back included), load " << ms(t2 - t1) << " ms\n";
}

}  // namespace
}  // namespace ps::server
