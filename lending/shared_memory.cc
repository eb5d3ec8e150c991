#include "lending/shared_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace {

// The errno of a failed system call as a status whose code says whether a
// retry or a larger /dev/shm could help.
absl::Status SystemError(absl::string_view call, const std::string& name,
                         int error) {
  absl::StatusCode code;
  switch (error) {
    case ENOENT:
      code = absl::StatusCode::kNotFound;
      break;
    case EEXIST:
      code = absl::StatusCode::kAlreadyExists;
      break;
    case EACCES:
    case EPERM:
      code = absl::StatusCode::kPermissionDenied;
      break;
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EFBIG:
      code = absl::StatusCode::kResourceExhausted;
      break;
    default:
      code = absl::StatusCode::kInternal;
  }
  return absl::Status(
      code, absl::StrCat("shared memory segment ", Quoted(name), ": ", call,
                         ": ", std::strerror(error)));
}

absl::Status ValidateName(const std::string& name) {
  if (name.size() < 2 || name.size() > 1 + SharedMemorySegment::kMaxNameBytes) {
    return InvalidField(
        "name", absl::StrCat(Quoted(name), " must be \"/\" followed by 1 to ",
                             SharedMemorySegment::kMaxNameBytes, " bytes"));
  }
  if (name[0] != '/') {
    return InvalidField("name",
                        absl::StrCat(Quoted(name), " must start with \"/\""));
  }
  if (name.find('/', 1) != std::string::npos) {
    return InvalidField(
        "name",
        absl::StrCat(Quoted(name), " must have no \"/\" after the first"));
  }
  if (name.find('\0') != std::string::npos) {
    return InvalidField("name",
                        absl::StrCat(Quoted(name), " must not contain NUL"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SharedMemorySegment> SharedMemorySegment::Create(
    const std::string& name, size_t bytes) {
  MUONPS_RETURN_IF_ERROR(ValidateName(name));
  if (bytes == 0) return InvalidField("bytes", "must be > 0");
  if (bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
    return InvalidField("bytes", absl::StrCat(bytes, " exceeds the largest ",
                                              "file size (off_t)"));
  }

  // O_EXCL: two trainers must never share a buffer by accident.
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return SystemError("shm_open", name, errno);

  // From here on a failure removes the name again.
  auto fail = [&name, fd](absl::string_view call, int error) {
    const absl::Status status = SystemError(call, name, error);
    close(fd);
    shm_unlink(name.c_str());
    return status;
  };
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    return fail("ftruncate", errno);
  }
  // posix_fallocate returns the error instead of setting errno.
  const int fallocate_error = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (fallocate_error != 0) return fail("posix_fallocate", fallocate_error);
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return fail("mmap", errno);
  // The descriptor stays open for CheckSize.
  return SharedMemorySegment(name, data, bytes, /*owner=*/true, fd);
}

absl::StatusOr<SharedMemorySegment> SharedMemorySegment::Open(
    const std::string& name, size_t expected_bytes) {
  MUONPS_RETURN_IF_ERROR(ValidateName(name));
  if (expected_bytes == 0) return InvalidField("expected_bytes", "must be > 0");

  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return SystemError("shm_open", name, errno);

  struct stat info;
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    return SystemError("fstat", name, error);
  }
  if (info.st_uid != geteuid()) {
    close(fd);
    return absl::PermissionDeniedError(
        absl::StrCat("shared memory segment ", Quoted(name), ": owned by uid ",
                     info.st_uid, ", not by this process's uid ", geteuid()));
  }
  if (info.st_size < 0 ||
      static_cast<uint64_t>(info.st_size) != expected_bytes) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory segment ", Quoted(name), ": has ",
                     info.st_size, " bytes, expected ", expected_bytes));
  }
  void* data =
      mmap(nullptr, expected_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int mmap_error = errno;
  if (data == MAP_FAILED) {
    close(fd);
    return SystemError("mmap", name, mmap_error);
  }
  return SharedMemorySegment(name, data, expected_bytes, /*owner=*/false, fd);
}

SharedMemorySegment::SharedMemorySegment(SharedMemorySegment&& other) noexcept
    : name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      owner_(std::exchange(other.owner_, false)),
      fd_(std::exchange(other.fd_, -1)) {
  other.name_.clear();
}

SharedMemorySegment& SharedMemorySegment::operator=(
    SharedMemorySegment&& other) noexcept {
  if (this != &other) {
    Release();
    name_ = std::move(other.name_);
    other.name_.clear();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owner_ = std::exchange(other.owner_, false);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

SharedMemorySegment::~SharedMemorySegment() { Release(); }

void SharedMemorySegment::Release() {
  if (data_ != nullptr) munmap(data_, size_);
  // Unlinking fails only if someone else already removed the name; there is
  // nothing left to clean up then.
  if (owner_) shm_unlink(name_.c_str());
  if (fd_ >= 0) close(fd_);
  name_.clear();
  data_ = nullptr;
  size_ = 0;
  owner_ = false;
  fd_ = -1;
}

absl::Status SharedMemorySegment::CheckSize() const {
  if (fd_ < 0) return absl::OkStatus();  // empty (moved-from) object
  struct stat info;
  if (fstat(fd_, &info) != 0) return SystemError("fstat", name_, errno);
  if (info.st_size < 0 || static_cast<uint64_t>(info.st_size) < size_) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory segment ", Quoted(name_), ": truncated to ",
                     info.st_size, " of its ", size_, " bytes while attached"));
  }
  return absl::OkStatus();
}

}  // namespace muonps
