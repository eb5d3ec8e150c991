// Kills a checkpoint writer at every step of the write protocol and proves
// that the directory then loads the last complete checkpoint, never a torn
// one, and that the next write cleans up what the killed one left.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/worker/checkpoint_store.h"

namespace muonps {
namespace {

namespace fs = std::filesystem;

std::vector<float> ValuesOfStep(int64_t step, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = static_cast<float>(step) * 1000.0f + static_cast<float>(i) * 0.25f;
  }
  return v;
}

// Three tensors, so that the kill also lands between tensors of the data
// file.
absl::StatusOr<CheckpointManifest> WriteStep(const std::string& dir,
                                             int64_t step,
                                             CheckpointWriteOptions options) {
  const std::vector<float> a = ValuesOfStep(step, 64 * 128);
  const std::vector<float> b = ValuesOfStep(step + 1, 32 * 8);
  const std::vector<float> c = ValuesOfStep(step + 2, 5 * 7);
  options.keep_last = 2;
  return WriteCheckpoint(dir, step, /*plan_version=*/1, "worker-0",
                         {{"mlp.up", 0, 64, 128, a},
                          {"mlp.down", 0, 32, 8, b},
                          {"moe.w1", 2, 5, 7, c}},
                         options);
}

void ExpectLoadsStep(const std::string& dir, int64_t step,
                     const std::string& context) {
  auto loaded = LoadLatestCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << context << ": " << loaded.status();
  EXPECT_EQ(loaded->manifest.step, step) << context;
  ASSERT_EQ(loaded->tensors.size(), 3u) << context;
  const std::vector<float> a = ValuesOfStep(step, 64 * 128);
  EXPECT_EQ(std::memcmp(loaded->tensors[0].data(), a.data(), a.size() * 4), 0)
      << context;
}

std::vector<std::string> ProtocolSteps() {
  std::vector<std::string> steps;
  std::string tmpl = ::testing::TempDir() + "/ckpt-steps-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) return steps;
  CheckpointWriteOptions options;
  options.crash_hook = [&](absl::string_view s) { steps.emplace_back(s); };
  EXPECT_TRUE(WriteStep(tmpl, 1, options).ok());
  fs::remove_all(tmpl);
  return steps;
}

// Forks a child that writes `step` into `dir` and SIGKILLs itself at the
// `kill_at`-th call of the crash hook; returns whether it died that way.
bool WriteAndDieAt(const std::string& dir, int64_t step, size_t kill_at) {
  const pid_t pid = fork();
  if (pid == 0) {
    size_t calls = 0;
    CheckpointWriteOptions options;
    options.crash_hook = [&](absl::string_view) {
      if (calls++ == kill_at) raise(SIGKILL);
    };
    (void)WriteStep(dir, step, options);
    _exit(3);  // Not killed: the parent reports it.
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return false;
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

TEST(CheckpointCrashTest, KillAtEveryProtocolStepLeavesLastCompleteCheckpoint) {
  const std::vector<std::string> steps = ProtocolSteps();
  ASSERT_GE(steps.size(), 9u);
  size_t manifest_renamed = steps.size();
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i] == "manifest_renamed") manifest_renamed = i;
  }
  ASSERT_LT(manifest_renamed, steps.size());

  for (bool has_previous : {true, false}) {
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::string context =
          "killed at " + steps[i] + " (#" + std::to_string(i) + ")" +
          (has_previous ? " after step 1" : " in an empty directory");
      std::string tmpl = ::testing::TempDir() + "/ckpt-crash-XXXXXX";
      ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
      const std::string dir = tmpl;
      if (has_previous) {
        ASSERT_TRUE(WriteStep(dir, 1, {}).ok()) << context;
      }

      ASSERT_TRUE(WriteAndDieAt(dir, 2, i)) << context;
      if (i >= manifest_renamed) {
        ExpectLoadsStep(dir, 2, context);
      } else if (has_previous) {
        ExpectLoadsStep(dir, 1, context);
        EXPECT_EQ(LoadCheckpoint(dir, 2).status().code(),
                  absl::StatusCode::kNotFound)
            << context;
      } else {
        EXPECT_EQ(LoadLatestCheckpoint(dir).status().code(),
                  absl::StatusCode::kNotFound)
            << context;
      }

      // The next write succeeds beside the leftovers and removes them.
      auto next = WriteStep(dir, 3, {});
      ASSERT_TRUE(next.ok()) << context << ": " << next.status();
      ExpectLoadsStep(dir, 3, context);
      for (const auto& entry : fs::directory_iterator(dir)) {
        const std::string name = entry.path().filename().string();
        EXPECT_FALSE(absl::StartsWith(name, ".tmp-"))
            << context << ": " << name;
        const bool kept_step2 = i >= manifest_renamed;
        const bool kept_step1 = !kept_step2 && has_previous;
        const bool expected =
            absl::StrContains(name, "00000000000000000003.") ||
            (kept_step2 && absl::StrContains(name, "00000000000000000002.")) ||
            (kept_step1 && absl::StrContains(name, "00000000000000000001."));
        EXPECT_TRUE(expected) << context << ": left " << name;
      }
      fs::remove_all(dir);
    }
  }
}

}  // namespace
}  // namespace muonps
