#include "server/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"
#include "common/optimizer/loss_scale.h"
#include "common/optimizer/optimizer.h"
#include "common/regular_file.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace ps::server {
namespace {

using Json = nlohmann::json;

constexpr absl::string_view kFormat = "ps-checkpoint";
constexpr absl::string_view kParamsPrefix = "params-";
constexpr absl::string_view kMomentumPrefix = "momentum-";
constexpr absl::string_view kManifestPrefix = "checkpoint-";
constexpr absl::string_view kSafetensorsSuffix = ".safetensors";
constexpr absl::string_view kManifestSuffix = ".json";
constexpr absl::string_view kTmpSuffix = ".tmp";
// A manifest nests 4 levels (the object, "signature", an entry, its
// "shape"); anything much deeper is not one, and refusing it before the
// parse keeps a hostile file from building a deep tree.
constexpr int kMaxJsonDepth = 8;
// As common/safetensors.cc: deeper than any framework's tensors go.
constexpr size_t kMaxRank = 64;
// The CRC-32 is computed over reads of this size.
constexpr size_t kReadChunkBytes = 1 << 20;

// ---------------------------------------------------------------------------
// Names and paths.

std::string VersionDigits(int64_t version) { return absl::StrFormat("%012d", version); }

// The version in `name` when it is prefix + VersionDigits(v) + suffix exactly
// (so "checkpoint-42.json" or "checkpoint-+00000000042.json" is no
// checkpoint's).
std::optional<int64_t> VersionInName(absl::string_view name, absl::string_view prefix,
                                     absl::string_view suffix) {
  if (!absl::ConsumePrefix(&name, prefix) || !absl::ConsumeSuffix(&name, suffix)) {
    return std::nullopt;
  }
  if (name.empty() || !std::all_of(name.begin(), name.end(), absl::ascii_isdigit)) {
    return std::nullopt;
  }
  int64_t version;
  if (!absl::SimpleAtoi(name, &version) || VersionDigits(version) != name) return std::nullopt;
  return version;
}

std::string JoinPath(absl::string_view directory, absl::string_view name) {
  if (absl::EndsWith(directory, "/")) return absl::StrCat(directory, name);
  return absl::StrCat(directory, "/", name);
}

absl::Status ErrnoError(int error, absl::string_view path, absl::string_view what) {
  return absl::ErrnoToStatus(error, absl::StrCat(path, ": ", what));
}

// ---------------------------------------------------------------------------
// The file system.

absl::Status FsyncDirectory(const std::string& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, directory, "cannot open the directory to fsync it");
  absl::Status status;
  if (::fsync(fd) != 0) status = ErrnoError(errno, directory, "fsync of the directory");
  ::close(fd);
  return status;
}

// mkdir -p, fsyncing the parent of each directory it creates.
absl::Status MakeDirectories(const std::string& directory) {
  for (size_t end = 0; end != std::string::npos;) {
    end = directory.find('/', end + 1);
    const std::string prefix = directory.substr(0, end);
    if (prefix.empty() || prefix == "/") continue;
    if (::mkdir(prefix.c_str(), 0755) == 0) {
      const size_t slash = prefix.rfind('/');
      const std::string parent =
          slash == std::string::npos ? "." : (slash == 0 ? "/" : prefix.substr(0, slash));
      PS_RETURN_IF_ERROR(FsyncDirectory(parent));
      continue;
    }
    const int error = errno;
    struct stat st;
    if (error != EEXIST) return ErrnoError(error, prefix, "cannot create the directory");
    if (::stat(prefix.c_str(), &st) != 0) return ErrnoError(errno, prefix, "stat");
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(prefix, ": exists and is not a directory"));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, path, "write");
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// `text` to `path` through path + ".tmp": write, fsync, rename. The caller
// fsyncs the directory.
absl::Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp_path = absl::StrCat(path, kTmpSuffix);
  const int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, tmp_path, "cannot create");
  absl::Status status = WriteAll(fd, text.data(), text.size(), tmp_path);
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoError(errno, tmp_path, "fsync");
  if (::close(fd) != 0 && status.ok()) status = ErrnoError(errno, tmp_path, "close");
  if (status.ok() && std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    status = ErrnoError(errno, path, absl::StrCat("cannot rename ", tmp_path, " to it"));
  }
  if (!status.ok()) ::unlink(tmp_path.c_str());
  return status;
}

// The names in `directory` (without "." and ".."). kNotFound when it does
// not exist, kFailedPrecondition when it is not a directory.
absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& directory) {
  DIR* dir = ::opendir(directory.c_str());
  if (dir == nullptr) {
    const int error = errno;
    if (error == ENOENT) return absl::NotFoundError(absl::StrCat(directory, ": no such directory"));
    if (error == ENOTDIR) {
      return absl::FailedPreconditionError(absl::StrCat(directory, ": not a directory"));
    }
    return ErrnoError(error, directory, "cannot list");
  }
  std::vector<std::string> names;
  absl::Status status;
  while (true) {
    errno = 0;
    const dirent* entry = ::readdir(dir);
    if (entry == nullptr) {
      if (errno != 0) status = ErrnoError(errno, directory, "cannot list");
      break;
    }
    const absl::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  ::closedir(dir);
  if (!status.ok()) return status;
  return names;
}

struct FileCheck {
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

// Reads the regular file at `path` whole: its size and zlib's crc32. Reads
// at most `limit` + 1 bytes, so a file larger than expected is not read to
// its end (its size comes from fstat).
absl::StatusOr<FileCheck> CheckFile(const std::string& path, int64_t limit) {
  struct stat st;
  absl::StatusOr<int> opened = OpenRegularFile(path, &st);
  if (absl::IsNotFound(opened.status())) {
    return absl::NotFoundError(absl::StrCat(path, ": missing file"));
  }
  PS_RETURN_IF_ERROR(opened.status());
  const int fd = *opened;
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  FileCheck check;
  check.bytes = static_cast<int64_t>(st.st_size);
  if (check.bytes > limit) return check;  // the caller reports the size
  std::unique_ptr<char[]> buffer(new char[kReadChunkBytes]);
  uLong crc = ::crc32(0L, Z_NULL, 0);
  int64_t total = 0;
  while (true) {
    const ssize_t n = ::read(fd, buffer.get(), kReadChunkBytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, path, "read");
    }
    if (n == 0) break;
    crc = ::crc32(crc, reinterpret_cast<const Bytef*>(buffer.get()), static_cast<uInt>(n));
    total += n;
    if (total > limit) break;
  }
  // What was read is what is there, should the file have changed since fstat.
  check.bytes = total;
  check.crc32 = static_cast<uint32_t>(crc);
  return check;
}

// ---------------------------------------------------------------------------
// Checking what is written.

// The manifest's fields that do not depend on the files written.
Json ManifestWithoutFiles(const CheckpointContents& contents) {
  Json signature = Json::array();
  for (const ParamSpec& spec : contents.signature) {
    signature.push_back(
        Json{{"name", spec.name}, {"dtype", std::string(DTypeName(spec.dtype))}, {"shape", spec.shape}});
  }
  Json manifest{{"format", std::string(kFormat)},
                {"format_version", kCheckpointFormatVersion},
                {"version", contents.version},
                {"steps_per_epoch", contents.steps_per_epoch},
                {"job", contents.job},
                {"signature", std::move(signature)}};
  if (contents.loss_scale != 0) {
    manifest["loss_scale"] = Json{{"scale", contents.loss_scale},
                                  {"clean_iterations", contents.loss_scale_clean_iterations},
                                  {"skipped_iterations", contents.loss_scale_skipped_iterations}};
  }
  return manifest;
}

// Serialises `manifest`; kInvalidArgument when a string in it is not valid
// UTF-8 (nlohmann's dump refuses those).
absl::StatusOr<std::string> DumpManifest(const Json& manifest) {
  try {
    return manifest.dump(1);
  } catch (const Json::type_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("a job entry or signature name is not valid UTF-8 (", e.what(), ")"));
  }
}

absl::Status ValidateForWrite(const CheckpointOptions& options, const CheckpointContents& contents,
                              int64_t* num_elements) {
  if (options.directory.empty()) return absl::InvalidArgumentError("empty checkpoint directory");
  if (options.keep < 1) {
    return absl::InvalidArgumentError(absl::StrCat("keep is ", options.keep, "; it must be >= 1"));
  }
  if (contents.version < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative version ", contents.version));
  }
  if (contents.steps_per_epoch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("negative steps_per_epoch ", contents.steps_per_epoch));
  }
  if (contents.signature.empty()) return absl::InvalidArgumentError("empty signature");
  std::set<absl::string_view> names;
  int64_t total = 0;
  for (const ParamSpec& spec : contents.signature) {
    if (spec.name.empty()) return absl::InvalidArgumentError("a signature entry has no name");
    if (spec.name == "__metadata__") {
      return absl::InvalidArgumentError("\"__metadata__\" is reserved, not a parameter name");
    }
    if (!names.insert(spec.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate parameter '", spec.name, "'"));
    }
    if (spec.dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", spec.name, "' is ", DTypeName(spec.dtype), "; checkpoints hold F32 only"));
    }
    int64_t n;
    if (!CheckedNumElements(spec.shape, &n) || __builtin_add_overflow(total, n, &total)) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", spec.name, "' has shape ",
                                                     ShapeToString(spec.shape),
                                                     ": a negative dimension or too many elements"));
    }
  }
  if (static_cast<int64_t>(contents.parameters.size()) != total) {
    return absl::InvalidArgumentError(absl::StrCat(contents.parameters.size(),
                                                   " parameters; the signature has ", total));
  }
  if (!contents.momentum.empty() && contents.momentum.size() != contents.parameters.size()) {
    return absl::InvalidArgumentError(absl::StrCat(contents.momentum.size(),
                                                   " momentum values; the signature has ", total,
                                                   " parameters (momentum is empty or as many)"));
  }
  *num_elements = total;
  return absl::OkStatus();
}

// The tensors of `values` (flat, in signature order), one per entry.
absl::StatusOr<std::vector<NamedHostTensor>> SignatureTensors(const std::vector<ParamSpec>& signature,
                                                              absl::Span<const float> values) {
  std::vector<NamedHostTensor> tensors;
  tensors.reserve(signature.size());
  size_t offset = 0;
  for (const ParamSpec& spec : signature) {
    const size_t n = static_cast<size_t>(NumElements(spec.shape));
    PS_ASSIGN_OR_RETURN(NamedHostTensor t,
                        NamedHostTensor::FromFloats(spec.name, spec.shape, values.subspan(offset, n)));
    tensors.push_back(std::move(t));
    offset += n;
  }
  return tensors;
}

// Writes one data file and returns its manifest entry.
absl::StatusOr<Json> WriteDataFile(const std::string& directory, const std::string& name,
                                   const std::vector<ParamSpec>& signature,
                                   absl::Span<const float> values) {
  const std::string path = JoinPath(directory, name);
  {
    // Scoped: the copy is freed before the file is read back.
    PS_ASSIGN_OR_RETURN(std::vector<NamedHostTensor> tensors, SignatureTensors(signature, values));
    PS_RETURN_IF_ERROR(WriteSafetensors(path, tensors, {{"format", "pt"}}));
  }
  PS_ASSIGN_OR_RETURN(FileCheck check, CheckFile(path, std::numeric_limits<int64_t>::max()));
  return Json{{"name", name}, {"bytes", check.bytes}, {"crc32", check.crc32}};
}

// Which of our files a directory entry is.
struct NameInfo {
  enum Kind { kNone, kManifest, kData, kTmp } kind = kNone;
  int64_t version = -1;  // kManifest and kData
};

NameInfo ClassifyName(absl::string_view name) {
  NameInfo info;
  if (absl::ConsumeSuffix(&name, kTmpSuffix)) {
    if (VersionInName(name, kManifestPrefix, kManifestSuffix) ||
        VersionInName(name, kParamsPrefix, kSafetensorsSuffix) ||
        VersionInName(name, kMomentumPrefix, kSafetensorsSuffix)) {
      info.kind = NameInfo::kTmp;
    }
    return info;
  }
  if (std::optional<int64_t> v = VersionInName(name, kManifestPrefix, kManifestSuffix)) {
    info.kind = NameInfo::kManifest;
    info.version = *v;
  } else if (std::optional<int64_t> v = VersionInName(name, kParamsPrefix, kSafetensorsSuffix)) {
    info.kind = NameInfo::kData;
    info.version = *v;
  } else if (std::optional<int64_t> v = VersionInName(name, kMomentumPrefix, kSafetensorsSuffix)) {
    info.kind = NameInfo::kData;
    info.version = *v;
  }
  return info;
}

// Deletes every checkpoint but `written` and the keep - 1 newest older ones
// (newer ones are of an abandoned history, see CheckpointOptions::keep),
// then the data files of versions without a manifest and our ".tmp" files:
// manifests first, so that no manifest ever outlives its data.
absl::Status DeleteOldCheckpoints(const std::string& directory, int64_t written, int keep) {
  PS_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(directory));
  std::vector<int64_t> others;
  for (const std::string& name : names) {
    const NameInfo info = ClassifyName(name);
    if (info.kind == NameInfo::kManifest && info.version < written) others.push_back(info.version);
  }
  std::sort(others.begin(), others.end(), std::greater<int64_t>());
  std::set<int64_t> kept = {written};
  for (size_t i = 0; i < others.size() && static_cast<int64_t>(i) < keep - 1; ++i) {
    kept.insert(others[i]);
  }
  std::vector<std::string> manifests;
  std::vector<std::string> rest;
  for (const std::string& name : names) {
    const NameInfo info = ClassifyName(name);
    if (info.kind == NameInfo::kManifest && kept.count(info.version) == 0) {
      manifests.push_back(name);
    } else if ((info.kind == NameInfo::kData && kept.count(info.version) == 0) ||
               info.kind == NameInfo::kTmp) {
      rest.push_back(name);
    }
  }
  std::vector<std::string> errors;
  absl::StatusCode code = absl::StatusCode::kOk;
  auto remove = [&](const std::vector<std::string>& batch) {
    for (const std::string& name : batch) {
      const std::string path = JoinPath(directory, name);
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
        const absl::Status status = ErrnoError(errno, path, "cannot delete");
        if (code == absl::StatusCode::kOk) code = status.code();
        errors.push_back(std::string(status.message()));
      }
    }
  };
  remove(manifests);
  if (!manifests.empty()) {
    if (absl::Status status = FsyncDirectory(directory); !status.ok()) return status;
  }
  remove(rest);
  if (!errors.empty()) return absl::Status(code, absl::StrJoin(errors, "; "));
  if (!rest.empty()) return FsyncDirectory(directory);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Reading and checking a manifest.

// kInvalidArgument when `text` nests arrays and objects deeper than `limit`
// (strings skipped); the JSON's own syntax is the parser's to check.
absl::Status CheckJsonDepth(absl::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad JSON: nested deeper than ", limit, " levels at byte ", i));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return absl::OkStatus();
}

absl::Status FieldError(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, what));
}

// Every key of `object` is in `allowed`, and every one of `required` is there.
absl::Status CheckKeys(const Json& object, absl::string_view where,
                       std::initializer_list<absl::string_view> required,
                       std::initializer_list<absl::string_view> also_allowed = {}) {
  if (!object.is_object()) return FieldError(where, " is not a JSON object");
  for (absl::string_view key : required) {
    if (!object.contains(std::string(key))) {
      return FieldError(where, absl::StrCat(" lacks field '", key, "'"));
    }
  }
  for (const auto& item : object.items()) {
    const std::string& key = item.key();
    if (std::find(required.begin(), required.end(), key) == required.end() &&
        std::find(also_allowed.begin(), also_allowed.end(), key) == also_allowed.end()) {
      return FieldError(where, absl::StrCat(" has an unknown field '", key, "'"));
    }
  }
  return absl::OkStatus();
}

// `value` as an int64 in [min, max]; `where` names it in the error.
absl::StatusOr<int64_t> GetInt(const Json& value, absl::string_view where, int64_t min,
                               int64_t max = std::numeric_limits<int64_t>::max()) {
  if (!value.is_number_integer()) return FieldError(where, " is not an integer");
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(max)) {
      return FieldError(where, absl::StrCat(" is ", u, ", above ", max));
    }
    return static_cast<int64_t>(u);
  }
  const int64_t v = value.get<int64_t>();
  if (v < min || v > max) {
    return FieldError(where, absl::StrCat(" is ", v, ", outside [", min, ", ", max, "]"));
  }
  return v;
}

absl::StatusOr<std::string> GetString(const Json& value, absl::string_view where) {
  if (!value.is_string()) return FieldError(where, " is not a string");
  return value.get<std::string>();
}

struct FileEntry {
  std::string name;
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

absl::StatusOr<FileEntry> ParseFileEntry(const Json& entry, absl::string_view role,
                                         const std::string& expected_name) {
  const std::string where = absl::StrCat("files.", role);
  PS_RETURN_IF_ERROR(CheckKeys(entry, where, {"name", "bytes", "crc32"}));
  FileEntry file;
  PS_ASSIGN_OR_RETURN(file.name, GetString(entry["name"], where + ".name"));
  if (file.name != expected_name) {
    return FieldError(where, absl::StrCat(".name is '", file.name, "'; checkpoint files are named '",
                                          expected_name, "'"));
  }
  PS_ASSIGN_OR_RETURN(file.bytes, GetInt(entry["bytes"], where + ".bytes", 0));
  PS_ASSIGN_OR_RETURN(const int64_t crc, GetInt(entry["crc32"], where + ".crc32", 0, 0xffffffff));
  file.crc32 = static_cast<uint32_t>(crc);
  return file;
}

struct Manifest {
  CheckpointContents contents;  // without parameters and momentum
  int64_t num_elements = 0;
  FileEntry params;
  std::optional<FileEntry> momentum;
};

absl::StatusOr<Manifest> ParseManifest(const std::string& text, int64_t file_version) {
  PS_RETURN_IF_ERROR(CheckJsonDepth(text, kMaxJsonDepth));
  Json json;
  try {
    json = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad JSON: ", e.what()));
  }
  PS_RETURN_IF_ERROR(CheckKeys(json, "the manifest",
                               {"format", "format_version", "version", "steps_per_epoch", "job",
                                "signature", "files"},
                               {"loss_scale"}));
  PS_ASSIGN_OR_RETURN(const std::string format, GetString(json["format"], "format"));
  if (format != kFormat) {
    return FieldError("format", absl::StrCat(" is '", format, "', not '", kFormat, "'"));
  }
  PS_ASSIGN_OR_RETURN(const int64_t format_version,
                      GetInt(json["format_version"], "format_version", 0));
  if (format_version != kCheckpointFormatVersion) {
    return FieldError("format_version", absl::StrCat(" is ", format_version, "; this reader knows ",
                                                     kCheckpointFormatVersion));
  }
  Manifest m;
  // Counters a resumed server goes on counting from: bounded so that they
  // cannot overflow however long it runs (2^62 steps).
  constexpr int64_t kMaxCount = int64_t{1} << 62;
  PS_ASSIGN_OR_RETURN(m.contents.version, GetInt(json["version"], "version", 0, kMaxCount));
  if (m.contents.version != file_version) {
    return FieldError("version", absl::StrCat(" is ", m.contents.version,
                                              ", but the file name says ", file_version));
  }
  PS_ASSIGN_OR_RETURN(m.contents.steps_per_epoch,
                      GetInt(json["steps_per_epoch"], "steps_per_epoch", 0, kMaxCount));
  if (json.contains("loss_scale")) {
    const Json& scale = json["loss_scale"];
    PS_RETURN_IF_ERROR(
        CheckKeys(scale, "loss_scale", {"scale", "clean_iterations", "skipped_iterations"}));
    // Checked as the float it becomes: a power of two a loss scale may be
    // (1e39 would be infinity, 1e-50 zero: "no scale").
    if (!scale["scale"].is_number() || !IsValidLossScale(scale["scale"].get<float>())) {
      return FieldError("loss_scale.scale",
                        " is not a power of two from 2^-24 to 2^24 (as a float)");
    }
    m.contents.loss_scale = scale["scale"].get<float>();
    PS_ASSIGN_OR_RETURN(
        m.contents.loss_scale_clean_iterations,
        GetInt(scale["clean_iterations"], "loss_scale.clean_iterations", 0, kMaxCount));
    PS_ASSIGN_OR_RETURN(
        m.contents.loss_scale_skipped_iterations,
        GetInt(scale["skipped_iterations"], "loss_scale.skipped_iterations", 0, kMaxCount));
  }
  const Json& job = json["job"];
  if (!job.is_object()) return FieldError("job", " is not a JSON object");
  for (const auto& item : job.items()) {
    PS_ASSIGN_OR_RETURN(m.contents.job[item.key()],
                        GetString(item.value(), absl::StrCat("job.", item.key())));
  }

  const Json& signature = json["signature"];
  if (!signature.is_array()) return FieldError("signature", " is not a JSON array");
  if (signature.empty()) return FieldError("signature", " is empty");
  std::set<std::string> names;
  for (size_t i = 0; i < signature.size(); ++i) {
    const std::string where = absl::StrCat("signature[", i, "]");
    const Json& entry = signature[i];
    PS_RETURN_IF_ERROR(CheckKeys(entry, where, {"name", "dtype", "shape"}));
    ParamSpec spec;
    PS_ASSIGN_OR_RETURN(spec.name, GetString(entry["name"], where + ".name"));
    if (spec.name.empty() || !names.insert(spec.name).second) {
      return FieldError(where, absl::StrCat(".name '", spec.name, "' is empty or a duplicate"));
    }
    PS_ASSIGN_OR_RETURN(const std::string dtype, GetString(entry["dtype"], where + ".dtype"));
    if (dtype != "F32") {
      return FieldError(where, absl::StrCat(" ('", spec.name, "') has dtype '", dtype, "', not F32"));
    }
    const Json& shape = entry["shape"];
    if (!shape.is_array() || shape.size() > kMaxRank) {
      return FieldError(where, absl::StrCat(".shape is not an array of at most ", kMaxRank,
                                            " dimensions"));
    }
    for (size_t d = 0; d < shape.size(); ++d) {
      PS_ASSIGN_OR_RETURN(const int64_t dim, GetInt(shape[d], absl::StrCat(where, ".shape[", d, "]"), 0));
      spec.shape.push_back(dim);
    }
    int64_t n;
    if (!CheckedNumElements(spec.shape, &n) || __builtin_add_overflow(m.num_elements, n, &m.num_elements) ||
        m.num_elements > std::numeric_limits<int64_t>::max() / 4) {
      return FieldError(where, " makes the signature too large for 64-bit sizes");
    }
    m.contents.signature.push_back(std::move(spec));
  }

  const Json& files = json["files"];
  PS_RETURN_IF_ERROR(CheckKeys(files, "files", {"params"}, {"momentum"}));
  PS_ASSIGN_OR_RETURN(m.params,
                      ParseFileEntry(files["params"], "params", CheckpointParamsFileName(file_version)));
  if (files.contains("momentum")) {
    PS_ASSIGN_OR_RETURN(m.momentum, ParseFileEntry(files["momentum"], "momentum",
                                                   CheckpointMomentumFileName(file_version)));
  }
  return m;
}

absl::StatusOr<std::string> ReadManifestText(const std::string& path) {
  struct stat st;
  absl::StatusOr<int> opened = OpenRegularFile(path, &st);
  if (absl::IsNotFound(opened.status())) return absl::NotFoundError("missing file");
  if (absl::IsFailedPrecondition(opened.status())) {
    return absl::FailedPreconditionError("not a regular file");
  }
  if (!opened.ok()) return absl::Status(opened.status().code(), "cannot open");
  std::FILE* file = ::fdopen(*opened, "rb");
  if (file == nullptr) {
    const int error = errno;
    ::close(*opened);
    return absl::ErrnoToStatus(error, "fdopen");
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(file, &std::fclose);
  if (st.st_size > kMaxManifestBytes) {
    return absl::InvalidArgumentError(absl::StrCat(st.st_size, " bytes, above the limit of ",
                                                   kMaxManifestBytes, " for a manifest"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  const size_t n = std::fread(text.data(), 1, text.size(), file);
  if (std::ferror(file)) return absl::ErrnoToStatus(errno, "read");
  text.resize(n);  // shorter if it shrank since fstat; the parse judges
  return text;
}

// Checks one data file against its manifest entry and the signature and
// returns its values flat in signature order. Errors name the file.
absl::StatusOr<std::vector<float>> LoadDataFile(const std::string& directory, const FileEntry& entry,
                                                const Manifest& manifest) {
  const std::string path = JoinPath(directory, entry.name);
  // 1. Size and CRC-32, against the manifest. The signature's data must fit
  //    the listed size, so nothing below is sized beyond the real file.
  if (manifest.num_elements * 4 > entry.bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": the signature needs ", manifest.num_elements * 4,
        " bytes of data, more than the file's listed size of ", entry.bytes));
  }
  PS_ASSIGN_OR_RETURN(const FileCheck check, CheckFile(path, entry.bytes));
  if (check.bytes < entry.bytes) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: ", check.bytes,
                                            " bytes, the manifest lists ", entry.bytes));
  }
  if (check.bytes > entry.bytes) {
    return absl::DataLossError(absl::StrCat(path, ": size mismatch: ", check.bytes,
                                            " bytes or more, the manifest lists ", entry.bytes));
  }
  if (check.crc32 != entry.crc32) {
    return absl::DataLossError(absl::StrFormat(
        "%s: CRC-32 mismatch: the file's is 0x%08x, the manifest lists 0x%08x", path, check.crc32,
        entry.crc32));
  }
  // 2. The tensors, against the signature.
  PS_ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
  const std::vector<ParamSpec>& signature = manifest.contents.signature;
  std::set<absl::string_view> signature_names;
  for (const ParamSpec& spec : signature) signature_names.insert(spec.name);
  std::map<absl::string_view, NamedHostTensor*> by_name;
  for (NamedHostTensor& t : file.tensors) {
    if (signature_names.count(t.name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", t.name, "' is not in the manifest's signature"));
    }
    by_name[t.name] = &t;
  }
  std::vector<float> values(static_cast<size_t>(manifest.num_elements));
  size_t offset = 0;
  for (const ParamSpec& spec : signature) {
    auto it = by_name.find(spec.name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": no tensor '", spec.name, "' of the manifest's signature"));
    }
    NamedHostTensor& t = *it->second;
    if (t.dtype != SafetensorsDType::kF32 || t.shape != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", spec.name, "' is ", SafetensorsDTypeName(t.dtype), " ",
          ShapeToString(t.shape), "; the signature says F32 ", ShapeToString(spec.shape)));
    }
    // ReadSafetensors' invariant: data holds exactly prod(shape) F32s.
    if (!t.data.empty()) std::memcpy(values.data() + offset, t.data.data(), t.data.size());
    offset += t.data.size() / 4;
    std::vector<uint8_t>().swap(t.data);
  }
  return values;
}

absl::StatusOr<CheckpointContents> LoadCheckpoint(const std::string& directory, int64_t version) {
  const std::string path = JoinPath(directory, CheckpointManifestFileName(version));
  absl::StatusOr<std::string> text = ReadManifestText(path);
  absl::StatusOr<Manifest> manifest =
      text.ok() ? ParseManifest(*text, version) : absl::StatusOr<Manifest>(text.status());
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        absl::StrCat(path, ": ", manifest.status().message()));
  }
  PS_ASSIGN_OR_RETURN(manifest->contents.parameters,
                      LoadDataFile(directory, manifest->params, *manifest));
  if (manifest->momentum.has_value()) {
    PS_ASSIGN_OR_RETURN(manifest->contents.momentum,
                        LoadDataFile(directory, *manifest->momentum, *manifest));
  }
  return std::move(manifest->contents);
}

}  // namespace

std::string CheckpointParamsFileName(int64_t version) {
  return absl::StrCat(kParamsPrefix, VersionDigits(version), kSafetensorsSuffix);
}
std::string CheckpointMomentumFileName(int64_t version) {
  return absl::StrCat(kMomentumPrefix, VersionDigits(version), kSafetensorsSuffix);
}
std::string CheckpointManifestFileName(int64_t version) {
  return absl::StrCat(kManifestPrefix, VersionDigits(version), kManifestSuffix);
}

absl::StatusOr<std::string> WriteCheckpoint(const CheckpointOptions& options,
                                            const CheckpointContents& contents) {
  // 1. Check everything before touching the disk; the dump finds non-UTF-8
  //    strings.
  int64_t num_elements = 0;
  PS_RETURN_IF_ERROR(ValidateForWrite(options, contents, &num_elements));
  Json manifest = ManifestWithoutFiles(contents);
  PS_RETURN_IF_ERROR(DumpManifest(manifest).status());

  // 2. The directory, and no manifest of this version over the data about
  //    to be replaced.
  const std::string& directory = options.directory;
  PS_RETURN_IF_ERROR(MakeDirectories(directory));
  const std::string manifest_path =
      JoinPath(directory, CheckpointManifestFileName(contents.version));
  if (::unlink(manifest_path.c_str()) == 0) {
    PS_RETURN_IF_ERROR(FsyncDirectory(directory));
  } else if (errno != ENOENT) {
    return ErrnoError(errno, manifest_path, "cannot delete the old manifest of this version");
  }
  if (contents.momentum.empty()) {
    // An earlier write of this version may have had momentum.
    const std::string stale = JoinPath(directory, CheckpointMomentumFileName(contents.version));
    if (::unlink(stale.c_str()) != 0 && errno != ENOENT) {
      return ErrnoError(errno, stale, "cannot delete the old momentum of this version");
    }
  }

  // 3. The data files, each durable in place (WriteSafetensors fsyncs the
  //    file and, after its rename, the directory).
  Json files = Json::object();
  PS_ASSIGN_OR_RETURN(files["params"],
                      WriteDataFile(directory, CheckpointParamsFileName(contents.version),
                                    contents.signature, contents.parameters));
  if (!contents.momentum.empty()) {
    PS_ASSIGN_OR_RETURN(files["momentum"],
                        WriteDataFile(directory, CheckpointMomentumFileName(contents.version),
                                      contents.signature, contents.momentum));
  }

  // 4. The manifest: the commit point.
  manifest["files"] = std::move(files);
  PS_ASSIGN_OR_RETURN(std::string text, DumpManifest(manifest));
  text += '\n';
  PS_RETURN_IF_ERROR(WriteFileAtomically(manifest_path, text));
  if (absl::Status status = FsyncDirectory(directory); !status.ok()) {
    return absl::Status(status.code(), absl::StrCat(status.message(), " (", manifest_path,
                                                    " is in place but may not be durable)"));
  }

  // 5. Older checkpoints and leftovers.
  if (absl::Status status = DeleteOldCheckpoints(directory, contents.version, options.keep);
      !status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("checkpoint ", manifest_path,
                                     " is committed, but cleaning up failed: ", status.message()));
  }
  return manifest_path;
}

absl::StatusOr<LoadedCheckpoint> LoadNewestCheckpoint(const std::string& directory,
                                                      std::vector<std::string>* refused) {
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(directory);
  if (!names.ok()) return names.status();
  std::vector<int64_t> versions;
  for (const std::string& name : *names) {
    if (std::optional<int64_t> v = VersionInName(name, kManifestPrefix, kManifestSuffix)) {
      versions.push_back(*v);
    }
  }
  if (versions.empty()) {
    return absl::NotFoundError(absl::StrCat(directory, ": no checkpoint (no ", kManifestPrefix,
                                            "<version>", kManifestSuffix, ")"));
  }
  std::sort(versions.begin(), versions.end(), std::greater<int64_t>());
  std::vector<std::string> reasons;
  for (int64_t version : versions) {
    absl::StatusOr<CheckpointContents> contents = LoadCheckpoint(directory, version);
    if (contents.ok()) {
      LoadedCheckpoint loaded;
      loaded.contents = *std::move(contents);
      loaded.manifest_path = JoinPath(directory, CheckpointManifestFileName(version));
      return loaded;
    }
    // LoadCheckpoint names the manifest when it is at fault, else the data
    // file: name the checkpoint in both cases.
    std::string reason(contents.status().message());
    const std::string manifest_path = JoinPath(directory, CheckpointManifestFileName(version));
    if (!absl::StartsWith(reason, manifest_path)) reason = absl::StrCat(manifest_path, ": ", reason);
    if (refused != nullptr) refused->push_back(reason);
    reasons.push_back(std::move(reason));
  }
  return absl::DataLossError(absl::StrCat(directory, ": none of its ", versions.size(),
                                          " checkpoints is valid: ", absl::StrJoin(reasons, "; ")));
}

absl::StatusOr<std::vector<int64_t>> ListCheckpointVersions(const std::string& directory) {
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(directory);
  if (absl::IsNotFound(names.status())) return std::vector<int64_t>();
  if (!names.ok()) return names.status();
  std::vector<int64_t> versions;
  for (const std::string& name : *names) {
    if (std::optional<int64_t> v = VersionInName(name, kManifestPrefix, kManifestSuffix)) {
      versions.push_back(*v);
    }
  }
  std::sort(versions.begin(), versions.end());
  return versions;
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpointOfVersion(const std::string& directory,
                                                         int64_t version) {
  if (version < 0) {
    return absl::InvalidArgumentError(absl::StrCat("no checkpoint has version ", version));
  }
  LoadedCheckpoint loaded;
  loaded.manifest_path = JoinPath(directory, CheckpointManifestFileName(version));
  absl::StatusOr<CheckpointContents> contents = LoadCheckpoint(directory, version);
  if (!contents.ok()) {
    std::string reason(contents.status().message());
    if (!absl::StartsWith(reason, loaded.manifest_path)) {
      reason = absl::StrCat(loaded.manifest_path, ": ", reason);
    }
    return absl::Status(contents.status().code(), reason);
  }
  loaded.contents = *std::move(contents);
  return loaded;
}

absl::Status SetAsideCheckpointsAfter(const std::string& directory, int64_t version) {
  PS_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(directory));
  std::vector<std::string> manifests, data;
  for (const std::string& name : names) {
    const NameInfo info = ClassifyName(name);
    if (info.version <= version) continue;
    if (info.kind == NameInfo::kManifest) manifests.push_back(name);
    if (info.kind == NameInfo::kData) data.push_back(name);
  }
  if (manifests.empty() && data.empty()) return absl::OkStatus();
  const std::string aside = JoinPath(directory, kAbandonedCheckpointsDirectory);
  PS_RETURN_IF_ERROR(MakeDirectories(aside));
  // Manifests first: a crash midway leaves every checkpoint either whole
  // where it was or out of the scan, never a manifest without its data.
  auto move = [&](const std::vector<std::string>& batch) -> absl::Status {
    for (const std::string& name : batch) {
      const std::string from = JoinPath(directory, name);
      if (::rename(from.c_str(), JoinPath(aside, name).c_str()) != 0) {
        return ErrnoError(errno, from, "cannot move aside");
      }
    }
    return absl::OkStatus();
  };
  PS_RETURN_IF_ERROR(move(manifests));
  PS_RETURN_IF_ERROR(FsyncDirectory(directory));
  PS_RETURN_IF_ERROR(move(data));
  PS_RETURN_IF_ERROR(FsyncDirectory(aside));
  return FsyncDirectory(directory);
}

}  // namespace ps::server
