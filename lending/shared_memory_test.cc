#include "lending/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace muonps {
namespace {

// Names carry the pid and a random token: concurrent runs (other configs,
// --runs_per_test) share /dev/shm, and Bazel's sandbox gives each its own PID
// namespace, where every test process has the same small pid.
std::string UniqueName(absl::string_view tag) {
  static const uint64_t token =
      (uint64_t{std::random_device()()} << 32) | std::random_device()();
  return absl::StrCat("/muonps-test-", getpid(), "-", absl::Hex(token), "-",
                      tag);
}

// Whether the name exists, checked without creating or mapping anything.
bool NameExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

void ExpectInvalidNaming(const absl::StatusOr<SharedMemorySegment>& segment,
                         absl::string_view field) {
  ASSERT_FALSE(segment.ok()) << "accepted: " << segment->name();
  EXPECT_EQ(segment.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(segment.status().message().find(field), absl::string_view::npos)
      << "message does not name \"" << field << "\": " << segment.status();
}

TEST(SharedMemorySegmentTest, CreateGivesZeroedPageAlignedOwnedMapping) {
  const std::string name = UniqueName("zeroed");
  absl::StatusOr<SharedMemorySegment> segment =
      SharedMemorySegment::Create(name, 10000);
  ASSERT_TRUE(segment.ok()) << segment.status();
  EXPECT_EQ(segment->name(), name);
  EXPECT_EQ(segment->size(), 10000u);
  EXPECT_TRUE(segment->is_owner());
  ASSERT_NE(segment->data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(segment->data()) %
                static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)),
            0u);
  const auto* bytes = static_cast<const unsigned char*>(segment->data());
  for (size_t i = 0; i < segment->size(); ++i) {
    ASSERT_EQ(bytes[i], 0) << "byte " << i;
  }
}

// A segment truncated under a mapping would raise SIGBUS on the lost
// pages: CheckSize says so first, naming the segment.
TEST(SharedMemorySegmentTest, CheckSizeNoticesATruncatedSegment) {
  const std::string name = UniqueName("truncated");
  absl::StatusOr<SharedMemorySegment> owner =
      SharedMemorySegment::Create(name, 1 << 16);
  ASSERT_TRUE(owner.ok()) << owner.status();
  absl::StatusOr<SharedMemorySegment> opened =
      SharedMemorySegment::Open(name, 1 << 16);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(opened->CheckSize().ok());
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  const absl::Status truncated = opened->CheckSize();
  EXPECT_EQ(truncated.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(truncated.message().find(name), absl::string_view::npos)
      << truncated;
  EXPECT_NE(truncated.message().find("truncated to 4096"),
            absl::string_view::npos)
      << truncated;
  EXPECT_FALSE(owner->CheckSize().ok());
}

TEST(SharedMemorySegmentTest, WritesThroughOneMappingAreSeenThroughTheOther) {
  const std::string name = UniqueName("two-mappings");
  constexpr size_t kFloats = 4096;
  absl::StatusOr<SharedMemorySegment> creator =
      SharedMemorySegment::Create(name, kFloats * sizeof(float));
  ASSERT_TRUE(creator.ok()) << creator.status();
  absl::StatusOr<SharedMemorySegment> opener =
      SharedMemorySegment::Open(name, kFloats * sizeof(float));
  ASSERT_TRUE(opener.ok()) << opener.status();
  EXPECT_FALSE(opener->is_owner());
  // Two distinct mappings of the same pages, not one pointer twice.
  ASSERT_NE(creator->data(), opener->data());

  auto* written = static_cast<float*>(creator->data());
  const auto* read = static_cast<const float*>(opener->data());
  for (size_t i = 0; i < kFloats; ++i) written[i] = 0.5f * i;
  for (size_t i = 0; i < kFloats; ++i) ASSERT_EQ(read[i], 0.5f * i) << i;

  // And the other way round.
  static_cast<float*>(opener->data())[7] = -3.0f;
  EXPECT_EQ(written[7], -3.0f);
}

TEST(SharedMemorySegmentTest, ForkedChildSeesParentWritesAndParentSeesChilds) {
  const std::string name = UniqueName("fork");
  constexpr size_t kInts = 1 << 16;
  absl::StatusOr<SharedMemorySegment> parent =
      SharedMemorySegment::Create(name, kInts * sizeof(int32_t));
  ASSERT_TRUE(parent.ok()) << parent.status();
  auto* values = static_cast<int32_t*>(parent->data());
  values[0] = 12345;

  const pid_t child = fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    // The child maps the segment by name, as a worker process would; it
    // leaves with _exit so no gtest or static destructors run twice.
    absl::StatusOr<SharedMemorySegment> mine =
        SharedMemorySegment::Open(name, kInts * sizeof(int32_t));
    if (!mine.ok()) _exit(10);
    auto* shared = static_cast<int32_t*>(mine->data());
    if (shared[0] != 12345) _exit(11);
    for (size_t i = 1; i < kInts; ++i) shared[i] = static_cast<int32_t>(3 * i);
    _exit(0);
  }
  int wait_status = 0;
  ASSERT_EQ(waitpid(child, &wait_status, 0), child);
  ASSERT_TRUE(WIFEXITED(wait_status)) << "child status " << wait_status;
  ASSERT_EQ(WEXITSTATUS(wait_status), 0)
      << "10: child could not open; 11: child did not see the parent's write";
  for (size_t i = 1; i < kInts; ++i) {
    ASSERT_EQ(values[i], static_cast<int32_t>(3 * i)) << "index " << i;
  }
}

TEST(SharedMemorySegmentTest,
     OpenWithAnotherSizeIsFailedPreconditionGivingBoth) {
  const std::string name = UniqueName("size");
  absl::StatusOr<SharedMemorySegment> creator =
      SharedMemorySegment::Create(name, 4096);
  ASSERT_TRUE(creator.ok()) << creator.status();
  for (size_t wrong : {size_t{4095}, size_t{4097}, size_t{8192}}) {
    absl::StatusOr<SharedMemorySegment> opener =
        SharedMemorySegment::Open(name, wrong);
    ASSERT_FALSE(opener.ok()) << wrong;
    EXPECT_EQ(opener.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string message(opener.status().message());
    EXPECT_NE(message.find("4096"), std::string::npos) << message;
    EXPECT_NE(message.find(absl::StrCat(wrong)), std::string::npos) << message;
  }
}

TEST(SharedMemorySegmentTest, OpenOfMissingNameIsNotFound) {
  absl::StatusOr<SharedMemorySegment> opener =
      SharedMemorySegment::Open(UniqueName("never-created"), 4096);
  ASSERT_FALSE(opener.ok());
  EXPECT_EQ(opener.status().code(), absl::StatusCode::kNotFound)
      << opener.status();
}

TEST(SharedMemorySegmentTest, SecondCreateIsAlreadyExistsAndKeepsTheFirst) {
  const std::string name = UniqueName("duplicate");
  absl::StatusOr<SharedMemorySegment> first =
      SharedMemorySegment::Create(name, 4096);
  ASSERT_TRUE(first.ok()) << first.status();
  static_cast<char*>(first->data())[0] = 'x';

  absl::StatusOr<SharedMemorySegment> second =
      SharedMemorySegment::Create(name, 8192);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists)
      << second.status();

  // The failed Create neither removed nor resized the first one.
  absl::StatusOr<SharedMemorySegment> opener =
      SharedMemorySegment::Open(name, 4096);
  ASSERT_TRUE(opener.ok()) << opener.status();
  EXPECT_EQ(static_cast<const char*>(opener->data())[0], 'x');
}

TEST(SharedMemorySegmentTest, MalformedNamesAreInvalidArgumentNamingName) {
  const std::string nul_inside = std::string("/muonps-a") + '\0' + "b";
  for (const std::string& bad :
       {std::string(""), std::string("/"), std::string("muonps-no-slash"),
        std::string("/muonps/nested"), std::string("/muonps-trailing/"),
        "/" + std::string(SharedMemorySegment::kMaxNameBytes + 1, 'a'),
        nul_inside}) {
    ExpectInvalidNaming(SharedMemorySegment::Create(bad, 4096), "name");
    ExpectInvalidNaming(SharedMemorySegment::Open(bad, 4096), "name");
  }
  // The longest allowed name works.
  std::string longest = UniqueName("long-");
  longest.resize(1 + SharedMemorySegment::kMaxNameBytes, 'z');
  absl::StatusOr<SharedMemorySegment> segment =
      SharedMemorySegment::Create(longest, 4096);
  EXPECT_TRUE(segment.ok()) << segment.status();
}

TEST(SharedMemorySegmentTest, ZeroBytesIsInvalidArgumentNamingTheSize) {
  const std::string name = UniqueName("zero");
  ExpectInvalidNaming(SharedMemorySegment::Create(name, 0), "bytes");
  EXPECT_FALSE(NameExists(name));
  absl::StatusOr<SharedMemorySegment> creator =
      SharedMemorySegment::Create(name, 4096);
  ASSERT_TRUE(creator.ok()) << creator.status();
  ExpectInvalidNaming(SharedMemorySegment::Open(name, 0), "expected_bytes");
}

TEST(SharedMemorySegmentTest, CreateLargerThanDevShmIsResourceExhausted) {
  struct statvfs fs;
  ASSERT_EQ(statvfs("/dev/shm", &fs), 0) << std::strerror(errno);
  if (fs.f_blocks == 0) GTEST_SKIP() << "/dev/shm has no size limit";
  const size_t too_big = 2 * static_cast<size_t>(fs.f_blocks) * fs.f_frsize;
  const std::string name = UniqueName("too-big");
  absl::StatusOr<SharedMemorySegment> segment =
      SharedMemorySegment::Create(name, too_big);
  ASSERT_FALSE(segment.ok());
  EXPECT_EQ(segment.status().code(), absl::StatusCode::kResourceExhausted)
      << segment.status();
  EXPECT_FALSE(NameExists(name)) << "a failed Create left its name behind";
}

TEST(SharedMemorySegmentTest, CreatorDestructionRemovesNameButNotOpenMappings) {
  const std::string name = UniqueName("unlink");
  absl::StatusOr<SharedMemorySegment> opener =
      absl::FailedPreconditionError("not opened yet");
  {
    absl::StatusOr<SharedMemorySegment> creator =
        SharedMemorySegment::Create(name, 4096);
    ASSERT_TRUE(creator.ok()) << creator.status();
    opener = SharedMemorySegment::Open(name, 4096);
    ASSERT_TRUE(opener.ok()) << opener.status();
    static_cast<char*>(creator->data())[100] = 'k';
  }
  EXPECT_FALSE(NameExists(name));
  absl::StatusOr<SharedMemorySegment> reopened =
      SharedMemorySegment::Open(name, 4096);
  ASSERT_FALSE(reopened.ok());
  EXPECT_EQ(reopened.status().code(), absl::StatusCode::kNotFound);
  // The opener's mapping outlives the name.
  EXPECT_EQ(static_cast<const char*>(opener->data())[100], 'k');
  // The name is free for a new segment.
  EXPECT_TRUE(SharedMemorySegment::Create(name, 4096).ok());
}

TEST(SharedMemorySegmentTest, OpenerDestructionLeavesTheNameInPlace) {
  const std::string name = UniqueName("opener");
  absl::StatusOr<SharedMemorySegment> creator =
      SharedMemorySegment::Create(name, 4096);
  ASSERT_TRUE(creator.ok()) << creator.status();
  { EXPECT_TRUE(SharedMemorySegment::Open(name, 4096).ok()); }
  EXPECT_TRUE(NameExists(name));
  EXPECT_TRUE(SharedMemorySegment::Open(name, 4096).ok());
}

TEST(SharedMemorySegmentTest, MoveConstructionTransfersMappingAndOwnership) {
  const std::string name = UniqueName("move");
  absl::StatusOr<SharedMemorySegment> created =
      SharedMemorySegment::Create(name, 4096);
  ASSERT_TRUE(created.ok()) << created.status();
  void* const data = created->data();

  SharedMemorySegment moved(std::move(*created));
  EXPECT_EQ(created->data(), nullptr);
  EXPECT_EQ(created->size(), 0u);
  EXPECT_EQ(created->name(), "");
  EXPECT_FALSE(created->is_owner());
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(moved.size(), 4096u);
  EXPECT_EQ(moved.name(), name);
  EXPECT_TRUE(moved.is_owner());

  // Destroying the moved-from object neither unmaps nor unlinks.
  created = absl::CancelledError("dropped");
  EXPECT_TRUE(NameExists(name));
  static_cast<char*>(moved.data())[0] = 'm';
  EXPECT_EQ(static_cast<const char*>(moved.data())[0], 'm');
}

TEST(SharedMemorySegmentTest, MoveAssignmentReleasesTheSegmentItHeld) {
  const std::string first_name = UniqueName("assign-first");
  const std::string second_name = UniqueName("assign-second");
  absl::StatusOr<SharedMemorySegment> first =
      SharedMemorySegment::Create(first_name, 4096);
  absl::StatusOr<SharedMemorySegment> second =
      SharedMemorySegment::Create(second_name, 8192);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();

  *first = std::move(*second);
  EXPECT_FALSE(NameExists(first_name)) << "the overwritten owner must unlink";
  EXPECT_TRUE(NameExists(second_name));
  EXPECT_EQ(first->name(), second_name);
  EXPECT_EQ(first->size(), 8192u);
  EXPECT_TRUE(first->is_owner());
  EXPECT_EQ(second->data(), nullptr);

  // Self-assignment (through a reference, to keep the compiler quiet) is a
  // no-op.
  SharedMemorySegment& alias = *first;
  *first = std::move(alias);
  EXPECT_EQ(first->name(), second_name);
  EXPECT_TRUE(NameExists(second_name));

  first = absl::CancelledError("dropped");
  EXPECT_FALSE(NameExists(second_name));
}

}  // namespace
}  // namespace muonps
