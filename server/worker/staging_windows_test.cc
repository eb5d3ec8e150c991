// Staging windows on the CPU: a lent buffer opened by name and written
// through, what a peer of another host or with no window gets, the offsets
// of a whole-parameter staging, the digest of the window ids, and the
// staging left behind by a worker that was killed; where gradient writes
// land, and their signals through a window.
#include "server/worker/staging_windows.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "lending/shared_memory.h"

namespace muonps {
namespace worker {
namespace {

TEST(StagingWindowsTest, APeerWritesIntoALentBufferThroughItsWindow) {
  std::shared_ptr<WindowLender> lender = SharedMemoryWindowLender();
  WindowRecord record{};
  absl::StatusOr<kernels::TypedBuffer> lent =
      lender->Allocate(DType::kBFloat16, 5, "staged updates", &record);
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_NE(record.id, 0u);
  EXPECT_EQ(record.host, HostIdentity());
  EXPECT_EQ(record.kind, static_cast<int32_t>(WindowKind::kSharedMemory));
  EXPECT_EQ(lent->size(), 5);
  EXPECT_EQ(lent->dtype(), DType::kBFloat16);

  PeerWindows windows;
  std::vector<WindowRecord> records = {WindowRecord{}, record};
  // Rank 0 writes into rank 1's window.
  EXPECT_TRUE(windows.Open(records, 0, {0, 1}, lender.get()));
  windows.SetWriters({1, 0}, false, PeerWindows::Digest({0, record.id}));
  EXPECT_TRUE(windows.Writes(0));
  EXPECT_FALSE(windows.Writes(1));
  const uint16_t values[2] = {0x3f80, 0x4000};
  std::memcpy(windows.At(1, 2 * 2), values, sizeof(values));
  EXPECT_EQ(std::memcmp(lent->at(2), values, sizeof(values)), 0);
}

TEST(StagingWindowsTest, WindowsOfAnotherHostOrNoneAreNotWrittenInto) {
  std::shared_ptr<WindowLender> lender = SharedMemoryWindowLender();
  WindowRecord record{};
  absl::StatusOr<kernels::TypedBuffer> lent =
      lender->Allocate(DType::kFloat32, 4, "staged updates", &record);
  ASSERT_TRUE(lent.ok()) << lent.status();
  PeerWindows windows;
  WindowRecord elsewhere = record;
  elsewhere.host ^= 1;
  EXPECT_FALSE(
      windows.Open({WindowRecord{}, elsewhere}, 0, {0, 1}, lender.get()));
  // A trainer with no window (it keeps only its rows) is not written into.
  EXPECT_FALSE(
      windows.Open({WindowRecord{}, WindowRecord{}}, 0, {0, 1}, lender.get()));
  // Nor is anything without a lender.
  EXPECT_FALSE(windows.Open({WindowRecord{}, record}, 0, {0, 1}, nullptr));
  // A window that is gone (its segment removed) is not opened.
  WindowRecord gone = record;
  std::strcpy(gone.handle, "/muonps-staged-0-gone");
  EXPECT_FALSE(windows.Open({WindowRecord{}, gone}, 0, {0, 1}, lender.get()));
  // Ranks with no trainer need no window.
  EXPECT_TRUE(
      windows.Open({WindowRecord{}, WindowRecord{}}, 0, {0}, lender.get()));
  EXPECT_EQ(windows.known(), 0u);
}

TEST(StagingWindowsTest, WholeParameterStagingFollowsTheJobsMatrices) {
  std::vector<scheduler::MatrixSpec> matrices(3);
  matrices[0].rows = 4;
  matrices[0].cols = 6;
  matrices[1].rows = 2;
  matrices[1].cols = 3;
  matrices[1].experts = 5;
  matrices[2].rows = 7;
  matrices[2].cols = 1;
  EXPECT_EQ(FullStagedAt(matrices), (std::vector<int64_t>{0, 24, 54}));
}

TEST(StagingWindowsTest, TheDigestIsZeroOnlyWithoutWindows) {
  EXPECT_EQ(PeerWindows::Digest({0, 0, 0}), 0u);
  EXPECT_NE(PeerWindows::Digest({0, 7, 0}), 0u);
  EXPECT_NE(PeerWindows::Digest({7, 0}), PeerWindows::Digest({0, 7}));
}

// Three ranks, the first two with a trainer: matrix 0 (two experts) and
// matrix 2 are unreduced, matrix 1 replicated.
TEST(StagingWindowsTest, GradientsLandInASlotPerOtherTrainer) {
  std::vector<scheduler::MatrixSpec> matrices(3);
  for (scheduler::MatrixSpec& spec : matrices) {
    spec.layout = scheduler::Layout::kUnreduced;
  }
  matrices[0].rows = 2;
  matrices[0].cols = 3;
  matrices[0].experts = 2;
  matrices[1].rows = 4;
  matrices[1].cols = 4;
  matrices[1].layout = scheduler::Layout::kReplicated;
  matrices[2].rows = 5;
  matrices[2].cols = 1;
  scheduler::OwnershipPlan ownership;
  ownership.worker_ids = {"w0", "w1", "d"};
  ownership.dedicated = 1;
  // Expert 0 of matrix 0 on rank 1, expert 1 on the dedicated rank 2;
  // matrix 1 (replicated) on rank 1, matrix 2 on rank 1.
  ownership.owners = {{1, 2}, {1}, {1}};
  const LandingLayout layout(matrices, ownership, 2);
  // Rank 0 owns nothing; rank 1 takes one slot (rank 0's) per item; the
  // dedicated rank 2 one per trainer. Each window starts with 64 floats of
  // signal words.
  EXPECT_EQ(layout.floats(0), 0);
  EXPECT_EQ(layout.floats(1), 64 + 6 + 5);
  EXPECT_EQ(layout.floats(2), 64 + 2 * 6);
  EXPECT_EQ(layout.SlotAt(0, 0, 0), 64);
  EXPECT_EQ(layout.SlotAt(2, 0, 0), 64 + 6);
  EXPECT_EQ(layout.SlotAt(0, 1, 0), 64);
  EXPECT_EQ(layout.SlotAt(0, 1, 1), 64 + 6);
  EXPECT_EQ(LandingLayout::SignalBytes(1), 8);
  // Later rounds and later buckets signal more.
  EXPECT_LT(LandingLayout::Value(3, LandingLayout::kLastPosition),
            LandingLayout::Value(4, 0));
  EXPECT_LT(LandingLayout::Value(4, 0), LandingLayout::Value(4, 1));
}

TEST(StagingWindowsTest, AWaitPassesOnceTheWriterSignalsAndTimesOutWithout) {
  // Rank 1 owns an unreduced 2x2 matrix; rank 0 writes its gradient.
  std::vector<scheduler::MatrixSpec> matrices(1);
  matrices[0].rows = 2;
  matrices[0].cols = 2;
  matrices[0].layout = scheduler::Layout::kUnreduced;
  scheduler::OwnershipPlan ownership;
  ownership.worker_ids = {"w0", "w1"};
  ownership.owners = {{1}};
  const LandingLayout layout(matrices, ownership, 2);
  std::shared_ptr<WindowLender> lender = SharedMemoryWindowLender();
  WindowRecord record{};
  absl::StatusOr<kernels::TypedBuffer> lent = lender->Allocate(
      DType::kFloat32, layout.floats(1), "gradient landing", &record);
  ASSERT_TRUE(lent.ok()) << lent.status();
  PeerWindows windows;
  ASSERT_TRUE(windows.OpenLanding({WindowRecord{}, record}, 0, true, layout,
                                  lender.get()));
  // Without rank 1's window rank 0 cannot write; a rank with no trainer
  // writes nothing and needs none.
  PeerWindows none;
  EXPECT_FALSE(none.OpenLanding({WindowRecord{}, WindowRecord{}}, 0, true,
                                layout, lender.get()));
  EXPECT_TRUE(none.OpenLanding({WindowRecord{}, WindowRecord{}}, 0, false,
                               layout, lender.get()));

  void* word = static_cast<char*>(lent->at(0)) + LandingLayout::SignalBytes(0);
  const absl::Status late = lender->AwaitSignal(
      kHostStream, word, LandingLayout::Value(1, 0), absl::Milliseconds(30));
  EXPECT_TRUE(absl::IsDeadlineExceeded(late)) << late;
  // Rank 0 writes through its opened window, then signals.
  const float gradient[4] = {1, 2, 3, 4};
  std::memcpy(static_cast<float*>(windows.Landing(1)) + layout.SlotAt(0, 0, 0),
              gradient, sizeof(gradient));
  ASSERT_TRUE(lender
                  ->Signal(kHostStream,
                           static_cast<char*>(windows.Landing(1)) +
                               LandingLayout::SignalBytes(0),
                           LandingLayout::Value(1, 0))
                  .ok());
  EXPECT_TRUE(lender
                  ->AwaitSignal(kHostStream, word, LandingLayout::Value(1, 0),
                                absl::Seconds(5))
                  .ok());
  EXPECT_EQ(std::memcmp(static_cast<float*>(lent->at(0)) + 64, gradient,
                        sizeof(gradient)),
            0);
  // A released word lets every wait of its round pass, none of the next.
  ASSERT_TRUE(
      lender
          ->Release(word, LandingLayout::Value(1, LandingLayout::kLastPosition))
          .ok());
  EXPECT_TRUE(lender
                  ->AwaitSignal(kHostStream, word, LandingLayout::Value(1, 9),
                                absl::Milliseconds(1))
                  .ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(lender->AwaitSignal(
      kHostStream, word, LandingLayout::Value(2, 0), absl::Milliseconds(1))));
}

TEST(StagingWindowsTest, StagingOfAKilledWorkerIsRemovedByTheNextOne) {
  // A pid that is gone: a child that exited and was reaped.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  char link[64] = {};
  ASSERT_GT(readlink("/proc/self/ns/pid", link, sizeof(link) - 1), 0);
  const std::string pid_namespace =
      std::to_string(std::strtoull(std::strchr(link, '[') + 1, nullptr, 10));
  const std::string stale =
      absl::StrCat("/muonps-staged-", pid_namespace, "-", child, "-1");
  // Another PID namespace's segment: its pid means nothing here.
  const std::string foreign =
      absl::StrCat("/muonps-staged-", pid_namespace, "1-", child, "-1");
  // Left behind as a kill -9 leaves it: the name, nobody mapping it.
  for (const std::string& name : {stale, foreign}) {
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << name;
    ASSERT_EQ(ftruncate(fd, 64), 0);
    close(fd);
  }
  ASSERT_TRUE(SharedMemorySegment::Open(stale, 64).ok());
  WindowRecord record{};
  ASSERT_TRUE(SharedMemoryWindowLender()
                  ->Allocate(DType::kFloat32, 4, "staged updates", &record)
                  .ok());
  EXPECT_TRUE(absl::IsNotFound(SharedMemorySegment::Open(stale, 64).status()));
  EXPECT_TRUE(SharedMemorySegment::Open(foreign, 64).ok());
  shm_unlink(foreign.c_str());
}

}  // namespace
}  // namespace worker
}  // namespace muonps
