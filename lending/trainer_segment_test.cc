#include "lending/trainer_segment.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <random>
#include <string>

#include "gtest/gtest.h"
#include "lending/shared_memory.h"

namespace muonps {
namespace {

// A pid that no process has now: a child's, after it exited and was
// reaped (pids are reused only after the counter wraps).
pid_t DeadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  return child;
}

// A job name no other run of this test shares.
std::string UniqueJob() {
  return "segtest." + std::to_string(getpid()) + "." +
         std::to_string(std::random_device()());
}

bool SegmentExists(const std::string& name) {
  struct stat info;
  return stat(("/dev/shm" + name).c_str(), &info) == 0;
}

TEST(TrainerSegmentNameTest, ClientNamesPassTheWorkersCheck) {
  const std::string name = TrainerSegmentName("my-job.1", 3, 4242, 99);
  EXPECT_EQ(name, "/muonps-my-job.1-r3-4242-99");
  EXPECT_TRUE(CheckTrainerSegmentName(name, "my-job.1", 3, 4242).ok());
  EXPECT_TRUE(CheckTrainerSegmentName(name, "my-job.1", 3, 0).ok());
}

TEST(TrainerSegmentNameTest, RefusesOtherJobsRanksPidsAndFormsNamingSegment) {
  const std::string name = TrainerSegmentName("job", 1, 4242, 99);
  for (const absl::Status& status :
       {CheckTrainerSegmentName(name, "other", 1, 4242),
        CheckTrainerSegmentName(name, "job", 2, 4242),
        CheckTrainerSegmentName(name, "job", 1, 4243),
        CheckTrainerSegmentName("/muonps-job-r1-4242", "job", 1, 0),
        CheckTrainerSegmentName("/muonps-job-r1-4242-99-x", "job", 1, 0),
        CheckTrainerSegmentName("/muonps-job-r1-42a-99", "job", 1, 0),
        CheckTrainerSegmentName("/some-other-segment", "job", 1, 0)}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("segment"), std::string::npos) << status;
  }
}

TEST(RemoveStaleTrainerSegmentsTest, RemovesDeadPidsSegmentsAndKeepsLiveOnes) {
  const std::string job = UniqueJob();
  const std::string dead_name = TrainerSegmentName(job, 0, DeadPid(), 1);
  const std::string live_name = TrainerSegmentName(job, 1, getpid(), 2);
  absl::StatusOr<SharedMemorySegment> dead =
      SharedMemorySegment::Create(dead_name, 4096);
  absl::StatusOr<SharedMemorySegment> live =
      SharedMemorySegment::Create(live_name, 4096);
  ASSERT_TRUE(dead.ok()) << dead.status();
  ASSERT_TRUE(live.ok()) << live.status();
  absl::StatusOr<int> removed =
      RemoveStaleTrainerSegments("/dev/shm", job, geteuid());
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_GE(*removed, 1);
  EXPECT_FALSE(SegmentExists(dead_name));
  EXPECT_TRUE(SegmentExists(live_name));
}

TEST(RemoveStaleTrainerSegmentsTest, LeavesOtherUsersSegments) {
  const std::string job = UniqueJob();
  const std::string name = TrainerSegmentName(job, 0, DeadPid(), 1);
  absl::StatusOr<SharedMemorySegment> segment =
      SharedMemorySegment::Create(name, 4096);
  ASSERT_TRUE(segment.ok()) << segment.status();
  ASSERT_TRUE(RemoveStaleTrainerSegments("/dev/shm", job, geteuid() + 1).ok());
  EXPECT_TRUE(SegmentExists(name));
}

TEST(RemoveStaleTrainerSegmentsTest, LeavesOtherJobsSegments) {
  // A trainer of another job may live in another PID namespace sharing
  // /dev/shm, where its live pid looks dead from here.
  const std::string name = TrainerSegmentName(UniqueJob(), 0, DeadPid(), 1);
  absl::StatusOr<SharedMemorySegment> segment =
      SharedMemorySegment::Create(name, 4096);
  ASSERT_TRUE(segment.ok()) << segment.status();
  ASSERT_TRUE(
      RemoveStaleTrainerSegments("/dev/shm", UniqueJob(), geteuid()).ok());
  EXPECT_TRUE(SegmentExists(name));
}

TEST(SharedMemoryOwnerTest, RefusesToMapASegmentOfAnotherUid) {
  const std::string name = TrainerSegmentName(UniqueJob(), 0, getpid(), 3);
  absl::StatusOr<SharedMemorySegment> segment =
      SharedMemorySegment::Create(name, 4096);
  ASSERT_TRUE(segment.ok()) << segment.status();
  if (chown(("/dev/shm" + name).c_str(), 65534, 65534) != 0) {
    GTEST_SKIP() << "needs root outside a user namespace to chown";
  }
  absl::StatusOr<SharedMemorySegment> opened =
      SharedMemorySegment::Open(name, 4096);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(opened.status().message().find("owned by uid 65534"),
            std::string::npos)
      << opened.status();
}

}  // namespace
}  // namespace muonps
