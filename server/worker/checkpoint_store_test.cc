#include "server/worker/checkpoint_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace muonps {
namespace {

namespace fs = std::filesystem;

// Distinct bit patterns, negative zero and subnormals included, so equality
// is checked on bits rather than on values that happen to round alike.
std::vector<float> Pattern(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    uint32_t bits = (x & 0x807FFFFFu) | ((x >> 9 & 0x7F) + 64) << 23;
    if (i % 97 == 5) bits = 0x80000000u;
    if (i % 89 == 7) bits = 0x00000123u;
    std::memcpy(&v[i], &bits, 4);
  }
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string DataFile(const std::string& dir, int64_t step) {
  return absl::StrFormat("%s/ckpt-%020d.data", dir, step);
}
std::string ManifestFile(const std::string& dir, int64_t step) {
  return absl::StrFormat("%s/ckpt-%020d.manifest", dir, step);
}

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/ckpt-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes a small checkpoint at `step` whose values depend on the step.
  void WriteSmall(int64_t step, int keep_last = 10) {
    values_a_ = Pattern(8 * 16, static_cast<uint32_t>(step));
    values_b_ = Pattern(3 * 5, static_cast<uint32_t>(step) + 1000);
    CheckpointWriteOptions options;
    options.keep_last = keep_last;
    auto written = WriteCheckpoint(
        dir_, step, /*plan_version=*/4, "worker-2",
        {{"layers.0.w", 0, 8, 16, values_a_}, {"moe.w1", 3, 3, 5, values_b_}},
        options);
    ASSERT_TRUE(written.ok()) << written.status();
  }

  void ExpectLatestIsSmall(int64_t step) {
    auto loaded = LoadLatestCheckpoint(dir_);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->manifest.step, step);
    ASSERT_EQ(loaded->tensors.size(), 2u);
    EXPECT_TRUE(SameBits(loaded->tensors[0],
                         Pattern(8 * 16, static_cast<uint32_t>(step))));
    EXPECT_TRUE(SameBits(loaded->tensors[1],
                         Pattern(3 * 5, static_cast<uint32_t>(step) + 1000)));
  }

  void ExpectStepIsDataLossNaming(int64_t step, const std::string& file) {
    auto loaded = LoadCheckpoint(dir_, step);
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss)
        << loaded.status();
    EXPECT_NE(
        loaded.status().message().find(fs::path(file).filename().string()),
        absl::string_view::npos)
        << loaded.status();
  }

  std::string dir_;
  std::vector<float> values_a_;
  std::vector<float> values_b_;
};

TEST_F(CheckpointStoreTest, RoundTripsSeveralTensorsBitForBit) {
  const std::vector<float> big = Pattern(1024 * 4096, 1);
  const std::vector<float> small = Pattern(64 * 32, 2);
  const std::vector<float> odd = Pattern(17 * 5, 3);
  auto written = WriteCheckpoint(dir_, 7, 3, "worker-1",
                                 {{"layers.0.mlp.up", 0, 1024, 4096, big},
                                  {"layers.0.attn.q", 0, 64, 32, small},
                                  {"moe.w1", 3, 17, 5, odd}});
  ASSERT_TRUE(written.ok()) << written.status();

  for (auto loaded : {LoadLatestCheckpoint(dir_), LoadCheckpoint(dir_, 7)}) {
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    const CheckpointManifest& m = loaded->manifest;
    EXPECT_EQ(m.step, 7);
    EXPECT_EQ(m.plan_version, 3);
    EXPECT_EQ(m.worker_id, "worker-1");
    EXPECT_EQ(m.data_bytes, (1024 * 4096 + 64 * 32 + 17 * 5) * 4u);
    ASSERT_EQ(m.tensors.size(), 3u);
    EXPECT_EQ(m.tensors[0].name, "layers.0.mlp.up");
    EXPECT_EQ(m.tensors[0].rows, 1024);
    EXPECT_EQ(m.tensors[0].cols, 4096);
    EXPECT_EQ(m.tensors[1].offset, 1024 * 4096 * 4u);
    EXPECT_EQ(m.tensors[2].name, "moe.w1");
    EXPECT_EQ(m.tensors[2].expert, 3);
    EXPECT_EQ(m.tensors[2].dtype, CheckpointDtype::kFp32);
    EXPECT_TRUE(SameBits(loaded->tensors[0], big));
    EXPECT_TRUE(SameBits(loaded->tensors[1], small));
    EXPECT_TRUE(SameBits(loaded->tensors[2], odd));
  }
}

TEST_F(CheckpointStoreTest, KeepsTheLastKAndLoadsTheNewest) {
  for (int64_t step : {10, 20, 30, 40, 50}) WriteSmall(step, /*keep_last=*/3);
  auto steps = ListCheckpointSteps(dir_);
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(*steps, (std::vector<int64_t>{30, 40, 50}));
  EXPECT_FALSE(fs::exists(DataFile(dir_, 10)));
  EXPECT_FALSE(fs::exists(DataFile(dir_, 20)));
  ExpectLatestIsSmall(50);
  auto older = LoadCheckpoint(dir_, 30);
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ(older->manifest.step, 30);
  EXPECT_EQ(LoadCheckpoint(dir_, 20).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointStoreTest, FlippedDataByteFallsBackToThePreviousCheckpoint) {
  WriteSmall(1);
  WriteSmall(2);
  {
    std::fstream f(DataFile(dir_, 2),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8 * 16 * 4 + 9);
    char c;
    f.seekg(8 * 16 * 4 + 9);
    f.get(c);
    f.seekp(8 * 16 * 4 + 9);
    f.put(static_cast<char>(c ^ 0x10));
  }
  ExpectStepIsDataLossNaming(2, DataFile(dir_, 2));
  ExpectLatestIsSmall(1);
}

TEST_F(CheckpointStoreTest, TruncatedDataFileFallsBackToThePreviousCheckpoint) {
  WriteSmall(1);
  WriteSmall(2);
  fs::resize_file(DataFile(dir_, 2), 100);
  ExpectStepIsDataLossNaming(2, DataFile(dir_, 2));
  ExpectLatestIsSmall(1);
}

TEST_F(CheckpointStoreTest, TruncatedManifestFallsBackToThePreviousCheckpoint) {
  WriteSmall(1);
  WriteSmall(2);
  fs::resize_file(ManifestFile(dir_, 2),
                  fs::file_size(ManifestFile(dir_, 2)) - 7);
  ExpectStepIsDataLossNaming(2, ManifestFile(dir_, 2));
  ExpectLatestIsSmall(1);
}

TEST_F(CheckpointStoreTest, ManifestNamingMissingDataFallsBackToThePrevious) {
  WriteSmall(1);
  WriteSmall(2);
  fs::remove(DataFile(dir_, 2));
  ExpectStepIsDataLossNaming(2, DataFile(dir_, 2));
  ExpectLatestIsSmall(1);
}

TEST_F(CheckpointStoreTest, ManifestUnderAnotherStepsNameIsDataLoss) {
  WriteSmall(1);
  fs::copy_file(ManifestFile(dir_, 1), ManifestFile(dir_, 5));
  fs::copy_file(DataFile(dir_, 1), DataFile(dir_, 5));
  ExpectStepIsDataLossNaming(5, ManifestFile(dir_, 5));
  ExpectLatestIsSmall(1);
}

TEST_F(CheckpointStoreTest, NotFoundWhenNoCompleteCheckpointExists) {
  EXPECT_EQ(LoadLatestCheckpoint(dir_).status().code(),
            absl::StatusCode::kNotFound);
  WriteSmall(1);
  fs::remove(DataFile(dir_, 1));
  auto loaded = LoadLatestCheckpoint(dir_);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(loaded.status().message().find("1 corrupt"),
            absl::string_view::npos)
      << loaded.status();
}

TEST_F(CheckpointStoreTest, RefusesToRewriteAStepThatExists) {
  WriteSmall(1);
  const std::vector<float> v = Pattern(4, 9);
  auto again = WriteCheckpoint(dir_, 1, 4, "worker-2", {{"w", 0, 2, 2, v}});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  ExpectLatestIsSmall(1);
}

TEST_F(CheckpointStoreTest, RejectsMalformedTensorsNamingThem) {
  const std::vector<float> v = Pattern(6, 9);
  auto wrong_size = WriteCheckpoint(dir_, 1, 1, "w", {{"m.a", 0, 2, 2, v}});
  EXPECT_EQ(wrong_size.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_size.status().message().find("\"m.a\""),
            absl::string_view::npos);
  auto twice = WriteCheckpoint(dir_, 1, 1, "w",
                               {{"m.a", 1, 2, 3, v}, {"m.a", 1, 3, 2, v}});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  auto empty_shape = WriteCheckpoint(dir_, 1, 1, "w", {{"m.b", 0, 0, 6, v}});
  EXPECT_EQ(empty_shape.status().code(), absl::StatusCode::kInvalidArgument);
  CheckpointWriteOptions keep_none;
  keep_none.keep_last = 0;
  EXPECT_EQ(WriteCheckpoint(dir_, 1, 1, "w", {}, keep_none).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto steps = ListCheckpointSteps(dir_);
  ASSERT_TRUE(steps.ok());
  EXPECT_TRUE(steps->empty());
}

}  // namespace
}  // namespace muonps
