// Staging windows on the CPU: a lent buffer opened by name and written
// through, its landed words as the lender and its peers see them, what a
// peer of another host or with no window gets, an owner rank that cannot
// signal, the offsets of a whole-parameter staging, the digest of the window
// ids, and the staging left behind by a worker that was killed.
#include "server/worker/staging_windows.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
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

TEST(StagingWindowsTest, LandedWordsFollowTheUpdatesZeroFilled) {
  std::shared_ptr<WindowLender> lender = SharedMemoryWindowLender();
  WindowRecord record{};
  // 300 bf16 updates: 600 bytes, so the words start at 768.
  absl::StatusOr<kernels::TypedBuffer> lent =
      lender->Allocate(DType::kBFloat16, 300, "staged updates", &record);
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_EQ(LandedOffset(600), 768);
  EXPECT_EQ(LandedOffset(768), 768);
  EXPECT_EQ(record.landed, 768u);
  EXPECT_EQ(record.bytes, 768u + kLandedBytes);
  EXPECT_EQ(kLandedBytes, 1024 * 64 * 8);
  // The updates keep their place; the words follow them.
  EXPECT_EQ(lent->size(), 300);
  uint64_t* first = OwnLandedWord(*lent, record, 0, 0);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(reinterpret_cast<char*>(first),
            static_cast<char*>(lent->at(0)) + 768);
  EXPECT_EQ(OwnLandedWord(*lent, record, 3, 5), first + 3 * 64 + 5);
  EXPECT_EQ(OwnLandedWord(*lent, record, kLandedOwners - 1, kLastRunSlot),
            first + kLandedOwners * kLandedSlots - 1);
  for (int64_t i = 0; i < kLandedOwners * kLandedSlots; ++i) {
    ASSERT_EQ(first[i], 0u) << "word " << i;
  }
  // Nothing lent: no words.
  EXPECT_EQ(OwnLandedWord(*lent, WindowRecord{}, 0, 0), nullptr);
  EXPECT_EQ(OwnLandedWord(kernels::TypedBuffer(), record, 0, 0), nullptr);
}

TEST(StagingWindowsTest, PeersFindTheLandedWordsTheLenderWaitsOn) {
  std::shared_ptr<WindowLender> lender = SharedMemoryWindowLender();
  WindowRecord record{};
  absl::StatusOr<kernels::TypedBuffer> lent =
      lender->Allocate(DType::kFloat32, 5, "staged updates", &record);
  ASSERT_TRUE(lent.ok()) << lent.status();
  // Ranks 0 and 2 each open rank 1's window (their own mappings of it):
  // only rank 1 has a trainer.
  const std::vector<WindowRecord> records = {WindowRecord{}, record,
                                             WindowRecord{}};
  PeerWindows rank0, rank2;
  ASSERT_TRUE(rank0.Open(records, 0, {1}, lender.get()));
  ASSERT_TRUE(rank2.Open(records, 2, {1}, lender.get()));
  const std::pair<int, PeerWindows*> owners[] = {{0, &rank0}, {2, &rank2}};
  for (const auto& [owner, windows] : owners) {
    for (const int slot :
         {0, LandedSlotOfRun(7), LandedSlotOfRun(100), kLastRunSlot}) {
      uint64_t* theirs = windows->LandedWord(1, owner, slot);
      uint64_t* mine = OwnLandedWord(*lent, record, owner, slot);
      // The same place in the window...
      EXPECT_EQ(reinterpret_cast<char*>(theirs) -
                    static_cast<char*>(windows->At(1, 0)),
                reinterpret_cast<char*>(mine) - static_cast<char*>(lent->at(0)))
          << "owner " << owner << " slot " << slot;
      // ...so what the owner writes there, the lender reads.
      const uint64_t token = 1000 * owner + slot + 1;
      *theirs = token;
      EXPECT_EQ(*mine, token) << "owner " << owner << " slot " << slot;
    }
  }
  EXPECT_EQ(LandedSlotOfRun(100), 62);
  // Owners' words do not overlap: owner 0's last word is untouched by
  // owner 2's.
  EXPECT_EQ(*OwnLandedWord(*lent, record, 0, kLastRunSlot),
            uint64_t{kLastRunSlot + 1});
  EXPECT_EQ(*OwnLandedWord(*lent, record, 1, 0), 0u);
}

TEST(StagingWindowsTest, AnOwnerThatCannotSignalWritesIntoNoWindow) {
  std::shared_ptr<WindowLender> lender = SharedMemoryWindowLender();
  WindowRecord record{};
  absl::StatusOr<kernels::TypedBuffer> lent =
      lender->Allocate(DType::kFloat32, 4, "staged updates", &record);
  ASSERT_TRUE(lent.ok()) << lent.status();
  std::vector<WindowRecord> records(kLandedOwners + 1);
  records[0] = record;
  PeerWindows windows;
  // Rank kLandedOwners - 1 signals in its own words; one more cannot.
  EXPECT_TRUE(windows.Open(records, kLandedOwners - 1, {0}, lender.get()));
  EXPECT_FALSE(windows.Open(records, kLandedOwners, {0}, lender.get()));
  EXPECT_FALSE(
      windows.Open(records, kLandedOwners, {kLandedOwners}, lender.get()));
  // A record whose words lie past its bytes is not opened.
  WindowRecord short_record = record;
  short_record.landed = record.bytes - 8;
  records[0] = short_record;
  EXPECT_FALSE(windows.Open(records, 1, {0}, lender.get()));
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
