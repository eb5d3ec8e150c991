// Staging windows: a trainer's staged updates (AttachedTrainer::updates)
// lent to the other workers of its host, so that the owner of a matrix
// writes the matrix's update straight into every trainer's staging with a
// peer copy instead of broadcasting it. On a GPU the copy engines move those
// bytes: no SMs are taken from Newton-Schulz, and no receive is posted (an
// NCCL receive launched before its data spins on the SMs the compute
// needs: docs/performance.md). Windows are CUDA IPC memory on a GPU and
// POSIX shared memory on the CPU; the backend lends and opens them
// (WindowLender).
//
// Why a step stays all-or-nothing (step_run.h): an owner writes a step's
// updates only between the round's agreement and its own vote, on its
// transfer stream, and its host waits for that stream before it votes yes;
// a worker reads its trainer's staging only when it commits, after rank 0
// decided from every vote. So a commit reads only updates that landed, and
// a writer that dies mid-copy never voted. The next step's writes come after
// the next round's agreement, which a rank joins only once its commit is
// done; a round whose resolution commits a staged step from its staging
// holds every rank at a barrier before anyone writes again (RoundAgreement).
//
// Landing words: each window ends with kLandingWords 64-bit words, one per
// writer (LandingSlot), that the writer advances in its stream's order
// after each run of its copies (LandingValue: the round and the run), so
// the receiver's compute stream can wait, on the device, for the updates it
// applies before the votes (StepStaging::ApplyAsLanded) without its host
// hearing from the writer. A writer that never writes its word (it died,
// or its round failed) leaves that wait blocked until the receiver writes
// the word itself (LandingReleased): every end of a round that does not
// commit the step does, before it waits for the applies to undo them.
// Values only grow from round to round (the round is rank 0's, above every
// round any live rank took part in: RoundAgreement), so a word a failed
// round left behind never satisfies a later wait.
//
// A worker publishes its window only when its trainer keeps the whole
// parameter of every matrix, its staging laid out as FullStagedAt says, so
// a writer finds every update's place in a peer's staging from the plan
// alone. Which owners write (every other trainer's window opened) is agreed
// by all ranks once per change of the windows, so the receivers know which
// updates they need not receive.
#ifndef MUONPS_SERVER_WORKER_STAGING_WINDOWS_H_
#define MUONPS_SERVER_WORKER_STAGING_WINDOWS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/device.h"
#include "common/dtype.h"
#include "common/metrics.h"
#include "kernels/device_ops.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace worker {

enum class WindowKind : int32_t {
  kNone = 0,
  kCudaIpc = 1,       // handle: a cudaIpcMemHandle_t
  kSharedMemory = 2,  // handle: the POSIX shared memory name
};

// What a peer needs to open a window (a control message: a whole number
// of floats).
struct WindowRecord {
  uint64_t id;      // random, per buffer; 0: no window
  uint64_t host;    // HostIdentity() of the lender
  int32_t kind;     // WindowKind
  int32_t device;   // CUDA ordinal
  uint64_t offset;  // of the buffer in its allocation (CUDA IPC)
  uint64_t bytes;
  char handle[200];
};
static_assert(sizeof(WindowRecord) % 4 == 0,
              "a window record travels as floats");

// The landing words at the end of every window, and where they start in a
// window of `bytes` bytes (WindowRecord::bytes).
inline constexpr int kLandingWords = 64;
inline uint64_t LandingWordsAt(uint64_t bytes) {
  return bytes - kLandingWords * sizeof(uint64_t);
}
// What a writer's landing word holds once its copies of run `run` (the
// step's runs of updates-back phases, numbered from 0 in the schedule's
// order) of round `round` landed; runs past kMostLandingRuns - 1 are not
// signalled (their updates wait for the commit). Compared as CUDA compares
// a stream wait's "at least": the signed difference.
inline constexpr int kMostLandingRuns = 0xFFFF;
inline uint64_t LandingValue(uint64_t round, int run) {
  return (round << 16) | static_cast<uint64_t>(run + 1);
}
// What the receiver writes to release its own waits of round `round`:
// at least every run's value.
inline uint64_t LandingReleased(uint64_t round) {
  return (round << 16) | 0xFFFFu;
}

// A digest of this machine's identity (common/machine.h): windows of
// another host are never opened.
uint64_t HostIdentity();

// A new window's record for a lender: a random id (never 0), this host,
// `kind`, and the bytes of `count` elements of `dtype` (at least one) in
// whole 64-bit words, then the landing words. The lender adds where to find
// it (handle, offset).
WindowRecord NewWindowRecord(WindowKind kind, DType dtype, int64_t count);

// A peer's window opened here; closed with the object.
class PeerWindow {
 public:
  virtual ~PeerWindow() = default;
  virtual void* data() const = 0;
};

// How a backend lends staging to the workers of its host and opens theirs.
// Thread-safe.
class WindowLender {
 public:
  virtual ~WindowLender() = default;
  // `count` zero-filled elements of `dtype` a peer can open, described by
  // `record`, followed by its zero landing words (the buffer's block holds
  // record->bytes); RESOURCE_EXHAUSTED naming `what` when the memory is
  // full.
  virtual absl::StatusOr<kernels::TypedBuffer> Allocate(
      DType dtype, int64_t count, const char* what, WindowRecord* record) = 0;
  // Sets the landing word `word` (of this worker's window or a peer's
  // opened here) to `value` once the work enqueued on `stream` so far is
  // done, that work's writes visible first.
  virtual absl::Status Signal(Stream stream, uint64_t* word,
                              uint64_t value) = 0;
  // Work enqueued on `stream` after this call starts once the word at
  // `word` is at least `value`. A GPU's stream waits on the device, for as
  // long as it takes (Signal releases it); the host's stream is the
  // calling thread, which polls until `deadline` (DEADLINE_EXCEEDED).
  virtual absl::Status AwaitSignal(Stream stream, const uint64_t* word,
                                   uint64_t value, absl::Time deadline) = 0;
  // Opens a peer's window: what the backend's memory system says when it
  // cannot (another process's GPU memory from the same process, a missing
  // segment, another container's IPC namespace).
  virtual absl::StatusOr<std::unique_ptr<PeerWindow>> Open(
      const WindowRecord& record) = 0;
};

// Where matrix m's update waits in the staging of a trainer that keeps
// every parameter whole: the elements of the matrices before it, in job
// order (AttachedTrainer::AllocateWorkBuffers lays them out so).
std::vector<int64_t> FullStagedAt(
    absl::Span<const scheduler::MatrixSpec> matrices);

// Where peer writes are counted, as the transport counts its calls
// (transport/counting_transport.h), under op "peer_write": the writer's
// bytes sent and calls, the receiver's bytes received. Null: not counted.
struct WriteCounters {
  Counter* sent = nullptr;
  Counter* received = nullptr;
  Counter* calls = nullptr;
};

// The peers' windows this worker opened for a plan version, and which
// owners write their updates into the trainers' windows.
class PeerWindows {
 public:
  PeerWindows() = default;
  PeerWindows(PeerWindows&&) = default;
  PeerWindows& operator=(PeerWindows&&) = default;

  // A digest of the window ids by rank (0 where no rank has a window).
  static uint64_t Digest(absl::Span<const uint64_t> ids);
  // The digest of the windows last exchanged here (0: none).
  uint64_t known() const { return known_; }

  // Opens `records` (by rank) that lie on this host and are not `self`'s,
  // with `lender` (null: opens none), closing what was open. Returns
  // whether this rank can write into every window of `targets` (ranks
  // with a trainer) but its own: each one published and opened.
  bool Open(absl::Span<const WindowRecord> records, int self,
            absl::Span<const int> targets, WindowLender* lender);
  // The agreed writers (by rank) and the digest they were agreed for.
  void SetWriters(std::vector<int32_t> writers, uint64_t digest);

  // Whether owner `rank` writes its updates into the trainers' windows.
  bool Writes(int rank) const {
    return rank >= 0 && rank < static_cast<int>(writers_.size()) &&
           writers_[rank] != 0;
  }
  // Rank `rank`'s window, `bytes` past its start (opened: Writes(self)).
  void* At(int rank, int64_t bytes) const {
    return static_cast<char*>(open_[rank]->data()) + bytes;
  }
  // Writer `rank`'s landing word in every window: its place among the
  // agreed writers, or -1 for a rank that does not write or comes past the
  // kLandingWords-th writer (its updates wait for the commit).
  int LandingSlot(int rank) const;
  // Landing word `slot` of rank `rank`'s window (opened: Writes(self)).
  uint64_t* LandingWord(int rank, int slot) const {
    return reinterpret_cast<uint64_t*>(
               At(rank, static_cast<int64_t>(landing_at_[rank]))) +
           slot;
  }

  void set_counters(WriteCounters counters) { counters_ = counters; }
  // A write of `bytes` to a peer, and one received from a peer.
  void CountWrite(int64_t bytes) const;
  void CountReceived(int64_t bytes) const;

 private:
  std::vector<std::unique_ptr<PeerWindow>> open_;  // by rank; null: none
  std::vector<uint64_t> landing_at_;  // by rank: LandingWordsAt its bytes
  std::vector<int32_t> writers_;      // by rank
  uint64_t known_ = 0;
  WriteCounters counters_;
};

// The CPU backend's lender: POSIX shared memory segments.
std::shared_ptr<WindowLender> SharedMemoryWindowLender();

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STAGING_WINDOWS_H_
