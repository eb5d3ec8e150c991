// Checks that ReadTensor reads back the floats written, and refuses wrong
// sizes, missing files and paths outside the folder.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/golden_replay/golden_manifest.h"
#include "tools/golden_replay/scratch_dir.h"

namespace muonps {
namespace golden {
namespace {

namespace fs = std::filesystem;
using manifest_test::ScratchDir;
using ::testing::HasSubstr;

std::string FloatBytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(float));
}

TEST(ReadTensorTest, ReadsBackTheFloatsWritten) {
  const ScratchDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::vector<float> values = {1.5f, -2.0f, 0.0f, 3.25e-7f};
  ASSERT_TRUE(dir.Write("t.bin", FloatBytes(values)));
  const absl::StatusOr<std::vector<float>> tensor =
      ReadTensor(dir.path(), "t.bin", 4);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(*tensor, values);
}

TEST(ReadTensorTest, WrongSizeIsDataLossNamingTheFile) {
  const ScratchDir dir;
  ASSERT_FALSE(dir.path().empty());
  ASSERT_TRUE(dir.Write("short.bin", FloatBytes({1, 2, 3})));
  for (const int64_t elements : {4, 2}) {
    SCOPED_TRACE(elements);
    const absl::StatusOr<std::vector<float>> tensor =
        ReadTensor(dir.path(), "short.bin", elements);
    ASSERT_FALSE(tensor.ok());
    EXPECT_EQ(tensor.status().code(), absl::StatusCode::kDataLoss);
    const std::string message(tensor.status().message());
    EXPECT_THAT(message, HasSubstr("short.bin"));
    EXPECT_THAT(message, HasSubstr("holds 12 bytes"));
    EXPECT_THAT(message, HasSubstr(std::to_string(elements * 4)));
  }
}

TEST(ReadTensorTest, MissingFileIsNotFound) {
  const ScratchDir dir;
  ASSERT_FALSE(dir.path().empty());
  const absl::StatusOr<std::vector<float>> tensor =
      ReadTensor(dir.path(), "absent.bin", 4);
  ASSERT_FALSE(tensor.ok());
  EXPECT_EQ(tensor.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(tensor.status().message()), HasSubstr("absent.bin"));
}

TEST(ReadTensorTest, NamesLeavingTheFolderAreInvalidEvenIfTheFileExists) {
  const ScratchDir outer;
  ASSERT_FALSE(outer.path().empty());
  ASSERT_TRUE(outer.Write("x", FloatBytes({1, 2})));
  const std::string inner = outer.path() + "/golden";
  ASSERT_TRUE(fs::create_directory(inner));
  for (const std::string& file :
       {std::string("../x"), outer.path() + "/x", std::string("")}) {
    SCOPED_TRACE(file);
    const absl::StatusOr<std::vector<float>> tensor =
        ReadTensor(inner, file, 2);
    ASSERT_FALSE(tensor.ok());
    EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(tensor.status().message()),
                HasSubstr("\"" + file + "\""));
  }
}

}  // namespace
}  // namespace golden
}  // namespace muonps
