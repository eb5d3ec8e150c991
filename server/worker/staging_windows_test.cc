// Staging windows on the CPU: a lent buffer opened by name and written
// through, what a peer of another host or with no window gets, the offsets
// of a whole-parameter staging, the digest of the window ids, and the
// staging left behind by a worker that was killed.
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
  windows.SetWriters({1, 0}, PeerWindows::Digest({0, record.id}));
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
