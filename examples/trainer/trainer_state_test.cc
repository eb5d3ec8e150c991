#include "examples/trainer/trainer_state.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace muonps {
namespace example {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir == nullptr ? "/tmp" : dir) + "/" + name;
}

TEST(TrainerStateTest, RoundTripsAndReplacesTheFileWhole) {
  const std::string path = TempPath("round_trip.state");
  std::remove(path.c_str());
  absl::StatusOr<std::optional<TrainerState>> none = LoadTrainerState(path);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());
  TrainerState state;
  state.step = 41;
  state.adamw_steps = 42;
  state.initial_loss = 1.25;
  state.retries = 7;
  state.resumes = 2;
  state.params = {1.5f, -2.0f, 3.25f};
  state.exp_avg = {{0.5f}, {}};
  state.exp_avg_sq = {{0.25f}, {}};
  ASSERT_TRUE(SaveTrainerState(path, state).ok());
  state.step = 42;
  ASSERT_TRUE(SaveTrainerState(path, state).ok());
  absl::StatusOr<std::optional<TrainerState>> loaded = LoadTrainerState(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(loaded->has_value());
  const TrainerState& got = **loaded;
  EXPECT_EQ(got.step, 42);
  EXPECT_EQ(got.adamw_steps, 42);
  EXPECT_EQ(got.initial_loss, 1.25);
  EXPECT_EQ(got.retries, 7);
  EXPECT_EQ(got.resumes, 2);
  EXPECT_EQ(got.params, state.params);
  EXPECT_EQ(got.exp_avg, state.exp_avg);
  EXPECT_EQ(got.exp_avg_sq, state.exp_avg_sq);
}

TEST(TrainerStateTest, ATruncatedFileIsDataLossNamingIt) {
  const std::string path = TempPath("truncated.state");
  TrainerState state;
  state.params.assign(100, 1.0f);
  ASSERT_TRUE(SaveTrainerState(path, state).ok());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), bytes.size() - 3);
  }
  absl::StatusOr<std::optional<TrainerState>> loaded = LoadTrainerState(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_TRUE(absl::IsDataLoss(loaded.status())) << loaded.status();
  EXPECT_TRUE(absl::StrContains(loaded.status().message(), path));
}

}  // namespace
}  // namespace example
}  // namespace muonps
