// Files written by ps::WriteSafetensors load in PyTorch, and files PyTorch
// writes (a batch-norm CNN's state_dict, I64 num_batches_tracked included)
// load here. PyTorch's side is safetensors_interop.py, run with the system's
// python3; the tests skip when no python3 with torch is installed.

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/safetensors.h"
#include "common/testing/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

std::string ScriptPath() { return testing::RunfilePath("common/safetensors_interop.py"); }

class SafetensorsInteropTest : public ::testing::Test {
 protected:
  // Debian's interpreter first: python3-torch lives there, while a python3
  // earlier on PATH (pyenv, a virtualenv) may lack torch.
  static void SetUpTestSuite() {
    const std::string python = testing::FindPython("torch");
    if (!python.empty()) python_ = new std::string(python);
  }

  void SetUp() override {
    if (python_ == nullptr) {
      GTEST_SKIP() << "no python3 with torch (tried /usr/bin/python3 and python3 on PATH); "
                      "install Debian's python3-torch to run the PyTorch interop checks";
    }
  }

  // Runs the helper script with `args`; fails the test on a non-zero exit.
  void RunScript(const std::string& args) {
    std::string output;
    const int code =
        testing::RunCommand(absl::StrCat(*python_, " ", testing::ShellQuote(ScriptPath()), " ", args), &output);
    EXPECT_EQ(code, 0) << "safetensors_interop.py " << args << ":\n" << output;
    std::cout << output;
  }

  static std::string* python_;
};

std::string* SafetensorsInteropTest::python_ = nullptr;

std::vector<uint8_t> U16Bytes(const std::vector<uint16_t>& values) {
  std::vector<uint8_t> out(values.size() * 2);
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// Keep in sync with expected_from_cpp() in safetensors_interop.py.
TEST_F(SafetensorsInteropTest, TorchLoadsWhatWeWrite) {
  std::vector<NamedHostTensor> tensors;
  std::vector<float> w(24);
  for (int i = 0; i < 24; ++i) w[i] = 0.25f * i - 3.f;
  tensors.push_back(*NamedHostTensor::FromFloats("conv1.weight", {2, 3, 2, 2}, w));
  tensors.push_back(*NamedHostTensor::FromFloats("conv1.bias", {2}, {0.5f, -1.5f}));
  tensors.push_back(*NamedHostTensor::FromFloats("scale", {}, {42.f}));
  tensors.push_back(*NamedHostTensor::FromFloats("empty", {0, 3}, {}));
  tensors.push_back(*NamedHostTensor::FromInt64s("bn1.num_batches_tracked", {}, {123}));
  tensors.push_back(*NamedHostTensor::FromInt64s("ids", {3}, {-1, int64_t{1} << 40, 5}));
  tensors.push_back({"half", SafetensorsDType::kF16, {3}, U16Bytes({0x3C00, 0xC000, 0x3800})});
  tensors.push_back({"bf16", SafetensorsDType::kBF16, {2}, U16Bytes({0x3F80, 0xC020})});
  tensors.push_back(*NamedHostTensor::FromFloats("caf\xC3\xA9 \xF0\x9F\x98\x80", {1}, {7.f}));
  const std::string path = testing::TestTmpPath("from_cpp.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}, {"note", "x\"y\n"}}).ok());
  RunScript("check " + testing::ShellQuote(path));
}

struct Expected {
  std::string name;
  std::string dtype;
  Shape shape;
  std::vector<std::string> values;
};

std::vector<Expected> ReadExpected(const std::string& path) {
  std::vector<Expected> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> fields = absl::StrSplit(line, ' ');
    Expected e;
    e.name = absl::HexStringToBytes(fields.at(0));
    e.dtype = fields.at(1);
    const int rank = std::stoi(fields.at(2));
    for (int i = 0; i < rank; ++i) e.shape.push_back(std::stoll(fields.at(3 + i)));
    e.values.assign(fields.begin() + 3 + rank, fields.end());
    out.push_back(std::move(e));
  }
  return out;
}

TEST_F(SafetensorsInteropTest, WeReadWhatTorchWrites) {
  const std::string path = testing::TestTmpPath("from_torch.safetensors");
  const std::string expected_path = testing::TestTmpPath("from_torch.expected");
  RunScript("write " + testing::ShellQuote(path) + " " + testing::ShellQuote(expected_path));
  if (HasFailure()) return;

  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  const std::vector<Expected> expected = ReadExpected(expected_path);
  ASSERT_EQ(expected.size(), 14u);  // the model's 9 tensors and 5 extra ones
  EXPECT_EQ(file->tensors.size(), expected.size());
  for (const Expected& e : expected) {
    SCOPED_TRACE(e.name);
    absl::StatusOr<const NamedHostTensor*> t = file->Find(e.name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(SafetensorsDTypeName((*t)->dtype), e.dtype);
    EXPECT_EQ((*t)->shape, e.shape);
    absl::StatusOr<std::vector<float>> floats = (*t)->ToFloats();
    ASSERT_TRUE(floats.ok()) << floats.status();
    ASSERT_EQ(floats->size(), e.values.size());
    for (size_t i = 0; i < e.values.size(); ++i) {
      if (e.dtype == "I64") {
        const int64_t want = std::stoll(e.values[i]);
        EXPECT_EQ((*(*t)->ToInt64s())[i], want) << i;
        EXPECT_EQ((*floats)[i], static_cast<float>(want)) << i;
      } else {
        // Python printed the exact value (as a double) of every element.
        EXPECT_EQ((*floats)[i], static_cast<float>(std::strtod(e.values[i].c_str(), nullptr)))
            << i << ": " << e.values[i];
      }
    }
  }
  // The batch-norm counter PyTorch keeps as an I64 scalar reads as a float.
  absl::StatusOr<const NamedHostTensor*> counter = file->Find("1.num_batches_tracked");
  ASSERT_TRUE(counter.ok()) << counter.status();
  EXPECT_EQ((*counter)->dtype, SafetensorsDType::kI64);
  EXPECT_TRUE((*counter)->shape.empty());
  EXPECT_EQ(*(*counter)->ToFloats(), std::vector<float>{1.f});
}

}  // namespace
}  // namespace ps
