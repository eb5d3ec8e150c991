#include "server/worker/staging_windows.h"

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/machine.h"
#include "common/poll_backoff.h"
#include "common/status.h"
#include "lending/shared_memory.h"
#include "server/worker/digest.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

// A random id, never 0 (0 means "no window").
uint64_t RandomId() {
  std::random_device device;
  uint64_t id = 0;
  while (id == 0) {
    id = (static_cast<uint64_t>(device()) << 32) ^ device();
  }
  return id;
}

constexpr char kSegmentPrefix[] = "muonps-staged-";

// This process's PID namespace (the inode /proc/self/ns/pid names; 0 where
// it cannot be read). A pid means a process only within its namespace, and
// containers that share /dev/shm may each have their own.
uint64_t PidNamespace() {
  char link[64] = {};
  const ssize_t n = readlink("/proc/self/ns/pid", link, sizeof(link) - 1);
  if (n <= 0) return 0;
  const char* open = std::strchr(link, '[');
  return open == nullptr ? 0 : std::strtoull(open + 1, nullptr, 10);
}

// "muonps-staged-<pid namespace>-<pid>-": the names of this process's
// staging segments start so.
std::string SegmentPrefix(uint64_t pid_namespace, long pid) {
  return absl::StrCat(kSegmentPrefix, pid_namespace, "-", pid, "-");
}

// Removes the staging segments of workers of this PID namespace that died
// without removing their own (kill -9): their names carry their namespace
// and pid. Segments of other namespaces are left alone: their pids cannot
// be checked from here.
void RemoveSegmentsOfDeadWorkers() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  const std::string ours = absl::StrCat(kSegmentPrefix, PidNamespace(), "-");
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.compare(0, ours.size(), ours) != 0) continue;
    const long pid = std::strtol(name.c_str() + ours.size(), nullptr, 10);
    if (pid <= 0 || kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) {
      continue;
    }
    if (shm_unlink(("/" + name).c_str()) == 0) {
      spdlog::info("removed {}, staging of worker process {} that is gone",
                   name, pid);
    }
  }
  closedir(dir);
}

// A shared memory segment as a block of floats.
class SegmentBuffer final : public kernels::FloatBuffer {
 public:
  explicit SegmentBuffer(SharedMemorySegment segment)
      : segment_(std::move(segment)) {}
  float* data() const override { return static_cast<float*>(segment_.data()); }
  int64_t size() const override {
    return static_cast<int64_t>(segment_.size() / sizeof(float));
  }

 private:
  SharedMemorySegment segment_;
};

class SegmentWindow final : public PeerWindow {
 public:
  explicit SegmentWindow(SharedMemorySegment segment)
      : segment_(std::move(segment)) {}
  void* data() const override { return segment_.data(); }

 private:
  SharedMemorySegment segment_;
};

class SharedMemoryLender final : public WindowLender {
 public:
  absl::StatusOr<kernels::TypedBuffer> Allocate(DType dtype, int64_t count,
                                                const char* what,
                                                WindowRecord* record) override {
    *record = NewWindowRecord(WindowKind::kSharedMemory, dtype, count);
    RemoveSegmentsOfDeadWorkers();
    const std::string name = absl::StrCat(
        "/", SegmentPrefix(PidNamespace(), getpid()), absl::Hex(record->id));
    absl::StatusOr<SharedMemorySegment> segment =
        SharedMemorySegment::Create(name, record->bytes);
    if (!segment.ok()) {
      *record = WindowRecord{};
      return Annotate(segment.status(), what);
    }
    std::memcpy(record->handle, name.c_str(), name.size() + 1);
    return kernels::TypedBuffer::Wrap(
        std::make_unique<SegmentBuffer>(*std::move(segment)), dtype, count);
  }

  absl::Status Signal(Stream /*stream*/, uint64_t* word,
                      uint64_t value) override {
    // The host's stream: everything before this call is done.
    __atomic_store_n(word, value, __ATOMIC_RELEASE);
    return absl::OkStatus();
  }

  absl::Status AwaitSignal(Stream /*stream*/, const uint64_t* word,
                           uint64_t value, absl::Time deadline) override {
    PollBackoff backoff;
    while (static_cast<int64_t>(__atomic_load_n(word, __ATOMIC_ACQUIRE) -
                                value) < 0) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("landing word at ", value, " not reached"));
      }
      backoff.Pause();
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<PeerWindow>> Open(
      const WindowRecord& record) override {
    if (record.kind != static_cast<int32_t>(WindowKind::kSharedMemory)) {
      return absl::FailedPreconditionError(
          absl::StrCat("window kind ", record.kind, " is not shared memory"));
    }
    const std::string name(record.handle,
                           strnlen(record.handle, sizeof(record.handle)));
    MUONPS_ASSIGN_OR_RETURN(SharedMemorySegment segment,
                            SharedMemorySegment::Open(name, record.bytes));
    return std::unique_ptr<PeerWindow>(new SegmentWindow(std::move(segment)));
  }
};

}  // namespace

uint64_t HostIdentity() {
  Digest digest;
  digest.Mix(MachineIdentity());
  return digest.value();
}

WindowRecord NewWindowRecord(WindowKind kind, DType dtype, int64_t count) {
  WindowRecord record{};
  record.id = RandomId();
  record.host = HostIdentity();
  record.kind = static_cast<int32_t>(kind);
  // Whole 64-bit words (the landing words' alignment; the buffer is a
  // FloatBuffer), at least one element, then the landing words.
  record.bytes =
      (static_cast<uint64_t>(std::max<int64_t>(count, 1)) * DTypeSize(dtype) +
       7) /
          8 * 8 +
      kLandingWords * sizeof(uint64_t);
  return record;
}

std::vector<int64_t> FullStagedAt(
    absl::Span<const scheduler::MatrixSpec> matrices) {
  std::vector<int64_t> at(matrices.size());
  int64_t next = 0;
  for (size_t m = 0; m < matrices.size(); ++m) {
    at[m] = next;
    next += matrices[m].experts * matrices[m].rows * matrices[m].cols;
  }
  return at;
}

uint64_t PeerWindows::Digest(absl::Span<const uint64_t> ids) {
  if (std::all_of(ids.begin(), ids.end(),
                  [](uint64_t id) { return id == 0; })) {
    return 0;
  }
  worker::Digest digest;  // the class, not this function
  digest.Mix(ids.data(), ids.size() * sizeof(uint64_t));
  return digest.value() == 0 ? 1 : digest.value();
}

bool PeerWindows::Open(absl::Span<const WindowRecord> records, int self,
                       absl::Span<const int> targets, WindowLender* lender) {
  // Unknown until the writers are agreed (SetWriters): a round that fails
  // before then exchanges again.
  known_ = 0;
  writers_.clear();
  open_.clear();
  open_.resize(records.size());
  landing_at_.assign(records.size(), 0);
  const uint64_t host = HostIdentity();
  for (size_t r = 0; r < records.size(); ++r) {
    const WindowRecord& record = records[r];
    if (static_cast<int>(r) == self || record.id == 0 || lender == nullptr ||
        record.host != host) {
      continue;
    }
    absl::StatusOr<std::unique_ptr<PeerWindow>> window = lender->Open(record);
    if (!window.ok()) {
      spdlog::info(
          "rank {}: rank {}'s staging window not opened ({}); its "
          "updates from here travel by the transport",
          self, r, window.status().ToString());
      continue;
    }
    open_[r] = *std::move(window);
    landing_at_[r] = LandingWordsAt(record.bytes);
  }
  for (const int target : targets) {
    if (target == self) continue;
    if (target < 0 || target >= static_cast<int>(open_.size()) ||
        open_[target] == nullptr) {
      return false;
    }
  }
  return true;
}

int PeerWindows::LandingSlot(int rank) const {
  if (!Writes(rank)) return -1;
  int slot = 0;
  for (int r = 0; r < rank; ++r) slot += writers_[r] != 0 ? 1 : 0;
  return slot < kLandingWords ? slot : -1;
}

void PeerWindows::SetWriters(std::vector<int32_t> writers, uint64_t digest) {
  writers_ = std::move(writers);
  known_ = digest;
}

void PeerWindows::CountWrite(int64_t bytes) const {
  if (counters_.calls != nullptr) counters_.calls->Increment({"peer_write"});
  if (counters_.sent != nullptr) {
    counters_.sent->Increment({"peer_write"}, static_cast<double>(bytes));
  }
}

void PeerWindows::CountReceived(int64_t bytes) const {
  if (counters_.received != nullptr) {
    counters_.received->Increment({"peer_write"}, static_cast<double>(bytes));
  }
}

std::shared_ptr<WindowLender> SharedMemoryWindowLender() {
  return std::make_shared<SharedMemoryLender>();
}

}  // namespace worker
}  // namespace muonps
