#include "server/worker/staging_windows.h"

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

  // The host's work is done when it is enqueued: a signal is a store after
  // it, a wait a poll of the word before what follows.
  absl::Status Signal(Stream stream, void* word, uint64_t value) override {
    MUONPS_RETURN_IF_ERROR(HostStream(stream));
    __atomic_store_n(static_cast<uint64_t*>(word), value, __ATOMIC_RELEASE);
    return absl::OkStatus();
  }

  absl::Status AwaitSignal(Stream stream, const void* word, uint64_t at_least,
                           absl::Duration timeout) override {
    MUONPS_RETURN_IF_ERROR(HostStream(stream));
    const auto* w = static_cast<const uint64_t*>(word);
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration pause = absl::Microseconds(20);
    while (__atomic_load_n(w, __ATOMIC_ACQUIRE) < at_least) {
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("no signal within ", absl::FormatDuration(timeout)));
      }
      absl::SleepFor(pause);
      pause = std::min(pause * 2, absl::Milliseconds(1));
    }
    return absl::OkStatus();
  }

  absl::Status Release(void* word, uint64_t value) override {
    __atomic_store_n(static_cast<uint64_t*>(word), value, __ATOMIC_RELEASE);
    return absl::OkStatus();
  }

 private:
  static absl::Status HostStream(Stream stream) {
    if (stream == kHostStream) return absl::OkStatus();
    return absl::InvalidArgumentError(
        "shared memory windows signal on the host stream only");
  }
};

}  // namespace

uint64_t HostIdentity() {
  std::string id;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  if (!std::getline(boot, id) || id.empty()) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    id = name;
  }
  Digest digest;
  digest.Mix(id);
  return digest.value();
}

WindowRecord NewWindowRecord(WindowKind kind, DType dtype, int64_t count) {
  WindowRecord record{};
  record.id = RandomId();
  record.host = HostIdentity();
  record.kind = static_cast<int32_t>(kind);
  // Whole floats (the buffer is a FloatBuffer), at least one element.
  record.bytes =
      (static_cast<uint64_t>(std::max<int64_t>(count, 1)) * DTypeSize(dtype) +
       3) /
      4 * 4;
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

LandingLayout::LandingLayout(absl::Span<const scheduler::MatrixSpec> matrices,
                             const scheduler::OwnershipPlan& ownership,
                             int trainers)
    : trainers_(trainers), owners_(ownership.owners) {
  const int size = static_cast<int>(ownership.worker_ids.size());
  // The signal words, rounded up to 256 bytes.
  const int64_t header = (2 * int64_t{size} + 63) / 64 * 64;
  floats_.assign(size, 0);
  at_.resize(matrices.size());
  sizes_.resize(matrices.size());
  for (size_t m = 0; m < matrices.size(); ++m) {
    const scheduler::MatrixSpec& spec = matrices[m];
    sizes_[m] = spec.rows * spec.cols;
    at_[m].assign(spec.experts, -1);
    if (spec.layout != scheduler::Layout::kUnreduced || m >= owners_.size()) {
      continue;
    }
    for (int32_t e = 0;
         e < spec.experts && e < static_cast<int32_t>(owners_[m].size()); ++e) {
      const int owner = owners_[m][e];
      if (owner < 0 || owner >= size) continue;
      const int sources = owner < trainers ? trainers - 1 : trainers;
      if (sources <= 0) continue;
      if (floats_[owner] == 0) floats_[owner] = header;
      at_[m][e] = floats_[owner];
      floats_[owner] += sources * sizes_[m];
    }
  }
}

int64_t LandingLayout::SlotAt(int32_t m, int32_t e, int source) const {
  const int owner = owners_[m][e];
  // The owner's own trainer has no slot: its gradient is read in place.
  const int index = owner < trainers_ && source > owner ? source - 1 : source;
  return at_[m][e] + index * sizes_[m];
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

bool PeerWindows::OpenLanding(absl::Span<const WindowRecord> records, int self,
                              bool has_trainer, const LandingLayout& layout,
                              WindowLender* lender) {
  gradient_writes_ = false;
  landing_.clear();
  landing_.resize(records.size());
  const uint64_t host = HostIdentity();
  bool all = true;
  for (size_t r = 0; r < records.size(); ++r) {
    const int rank = static_cast<int>(r);
    if (rank == self || layout.floats(rank) == 0) continue;
    const WindowRecord& record = records[r];
    if (record.id == 0 || lender == nullptr || record.host != host) {
      all = false;
      continue;
    }
    absl::StatusOr<std::unique_ptr<PeerWindow>> window = lender->Open(record);
    if (!window.ok()) {
      spdlog::info(
          "rank {}: rank {}'s gradient landing window not opened ({}); "
          "gradients to owners travel by the transport",
          self, r, window.status().ToString());
      all = false;
      continue;
    }
    landing_[r] = *std::move(window);
  }
  return all || !has_trainer;
}

void PeerWindows::SetWriters(std::vector<int32_t> writers, bool gradient_writes,
                             uint64_t digest) {
  writers_ = std::move(writers);
  gradient_writes_ = gradient_writes;
  known_ = digest;
}

void PeerWindows::Count(const char* op, int64_t bytes, bool sent) const {
  if (sent && counters_.calls != nullptr) counters_.calls->Increment({op});
  Counter* bytes_counter = sent ? counters_.sent : counters_.received;
  if (bytes_counter != nullptr) {
    bytes_counter->Increment({op}, static_cast<double>(bytes));
  }
}

std::shared_ptr<WindowLender> SharedMemoryWindowLender() {
  return std::make_shared<SharedMemoryLender>();
}

}  // namespace worker
}  // namespace muonps
