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
// Gradient writes take the other direction for the unreduced layout: each
// worker with a trainer copies its trainer's gradient of a matrix another
// worker of its host owns into that owner's landing window (a slot per
// trainer, LandingLayout), then signals it there (a 64-bit word per writer,
// written after the copies on the same stream); the owner's compute stream
// waits for the signals of the bucket that completes a stack and sums the
// parts in the reduce order itself (DeviceOps::ScaledSum). No NCCL reduce
// runs, so nothing spins on the SMs while Newton-Schulz computes. The
// gradients are ready to copy once the round is agreed (every worker's
// stream waited for its trainer before its header went out) and stay so
// until the trainers are released after the commit; an owner reads its
// slots before it votes, and the next step's copies come after the next
// agreement. A signal's value is the round's sequence (one more than any
// rank has seen, so a window never holds a later one) times 2^20 plus the
// bucket's position: a wait never passes on an earlier round's copies.
//

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

// This machine's identity (its boot id; the host name where there is
// none): windows of another host are never opened.
uint64_t HostIdentity();

// A new window's record for a lender: a random id (never 0), this host,
// `kind`, and the bytes of `count` elements of `dtype` in whole floats (at
// least one element). The lender adds where to find it (handle, offset).
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
  // `record`; RESOURCE_EXHAUSTED naming `what` when the memory is full.
  virtual absl::StatusOr<kernels::TypedBuffer> Allocate(
      DType dtype, int64_t count, const char* what, WindowRecord* record) = 0;
  // Opens a peer's window: what the backend's memory system says when it
  // cannot (another process's GPU memory from the same process, a missing
  // segment, another container's IPC namespace).
  virtual absl::StatusOr<std::unique_ptr<PeerWindow>> Open(
      const WindowRecord& record) = 0;

  // Signals through windows (gradient writes): `word` is a 64-bit word of
  // a window, this worker's or a peer's it opened.
  // In `stream` order: *word <- value once the work enqueued before it is
  // done, its writes visible to whoever sees the value.
  virtual absl::Status Signal(Stream stream, void* word, uint64_t value) = 0;
  // Work enqueued on `stream` after this call starts once *word >=
  // at_least. On the host the call itself waits: DEADLINE_EXCEEDED after
  // `timeout`. On a GPU it is enqueued and returns; a wait whose writer
  // died stays until Release.
  virtual absl::Status AwaitSignal(Stream stream, const void* word,
                                   uint64_t at_least,
                                   absl::Duration timeout) = 0;
  // *word <- value now, ordered after no stream: releases the waits on a
  // word of this worker's own window when the round failed.
  virtual absl::Status Release(void* word, uint64_t value) = 0;
};

// Where gradient writes land: every owner of unreduced items has a window
// of one header (a 64-bit signal word per rank) and, for each item it owns
// in job order, a slot per trainer rank other than its own (ranks with a
// trainer are the first ones). The same on every rank: a writer finds its
// slot from the plan alone.
class LandingLayout {
 public:
  LandingLayout() = default;
  // For `ownership` of `matrices`, the first `trainers` ranks holding a
  // trainer.
  LandingLayout(absl::Span<const scheduler::MatrixSpec> matrices,
                const scheduler::OwnershipPlan& ownership, int trainers);

  // Floats of rank `rank`'s window (0: it owns no unreduced item).
  int64_t floats(int rank) const {
    return rank >= 0 && rank < static_cast<int>(floats_.size()) ? floats_[rank]
                                                                : 0;
  }
  // Where source rank `source`'s gradient of expert `e` of matrix `m` lands
  // in its owner's window, in floats. `source` has a trainer and is not
  // the owner.
  int64_t SlotAt(int32_t m, int32_t e, int source) const;
  // Where rank `source`'s signal word is in a window, in bytes.
  static int64_t SignalBytes(int source) { return 8 * int64_t{source}; }
  // The value of round `sequence`'s signal after its bucket at `position`
  // (the order of the buckets' gradients to owners); kLastPosition: past
  // every bucket.
  static constexpr uint32_t kLastPosition = (1u << 20) - 2;
  static uint64_t Value(uint64_t sequence, uint32_t position) {
    return (sequence << 20) | (position + 1);
  }

 private:
  int trainers_ = 0;
  std::vector<std::vector<int32_t>> owners_;  // [m][e]
  std::vector<int64_t> sizes_;                // by matrix: rows * cols
  std::vector<std::vector<int64_t>> at_;      // [m][e]; -1: not unreduced
  std::vector<int64_t> floats_;               // by rank
};

// Where matrix m's update waits in the staging of a trainer that keeps
// every parameter whole: the elements of the matrices before it, in job
// order (AttachedTrainer::AllocateWorkBuffers lays them out so).
std::vector<int64_t> FullStagedAt(
    absl::Span<const scheduler::MatrixSpec> matrices);

// Where peer writes are counted, as the transport counts its calls
// (transport/counting_transport.h), under op "peer_write" (updates) or
// "gradient_write": the writer's bytes sent and calls, the receiver's bytes
// received. Null: not counted.
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
  // Opens the landing windows of `records` (by rank) that lie on this host
  // and are not `self`'s, with `lender`. Returns whether this rank can
  // write its gradients into every window the plan's `layout` gives a
  // rank other than `self` (true for a rank with no trainer, which writes
  // none).
  bool OpenLanding(absl::Span<const WindowRecord> records, int self,
                   bool has_trainer, const LandingLayout& layout,
                   WindowLender* lender);
  // The agreed writers (by rank), whether every trainer's worker writes its
  // unreduced gradients into the owners' landing windows, and the digest
  // they were agreed for.
  void SetWriters(std::vector<int32_t> writers, bool gradient_writes,
                  uint64_t digest);

  // Whether owner `rank` writes its updates into the trainers' windows.
  bool Writes(int rank) const {
    return rank >= 0 && rank < static_cast<int>(writers_.size()) &&
           writers_[rank] != 0;
  }
  // Rank `rank`'s window, `bytes` past its start (opened: Writes(self)).
  void* At(int rank, int64_t bytes) const {
    return static_cast<char*>(open_[rank]->data()) + bytes;
  }
  // Whether gradients go to their owners by gradient writes, and rank
  // `rank`'s landing window (opened: GradientWrites()).
  bool GradientWrites() const { return gradient_writes_; }
  void* Landing(int rank) const { return landing_[rank]->data(); }
  // The sequence of the round in progress (LandingLayout::Value), and the
  // largest one this worker has seen.
  uint64_t sequence() const { return sequence_; }
  void set_sequence(uint64_t sequence) { sequence_ = sequence; }

  void set_counters(WriteCounters counters) { counters_ = counters; }
  // An update of `bytes` written to a peer, and one received from a peer;
  // the same for a gradient.
  void CountWrite(int64_t bytes) const { Count(kUpdate, bytes, true); }
  void CountReceived(int64_t bytes) const { Count(kUpdate, bytes, false); }
  void CountGradientWrite(int64_t bytes) const {
    Count(kGradient, bytes, true);
  }
  void CountGradientReceived(int64_t bytes) const {
    Count(kGradient, bytes, false);
  }

 private:
  std::vector<std::unique_ptr<PeerWindow>> open_;     // by rank; null: none
  std::vector<std::unique_ptr<PeerWindow>> landing_;  // by rank; null: none
  std::vector<int32_t> writers_;                      // by rank
  bool gradient_writes_ = false;
  uint64_t sequence_ = 0;
  uint64_t known_ = 0;
  WriteCounters counters_;

  static constexpr const char* kUpdate = "peer_write";
  static constexpr const char* kGradient = "gradient_write";
  void Count(const char* op, int64_t bytes, bool sent) const;
};

// The CPU backend's lender: POSIX shared memory segments.
std::shared_ptr<WindowLender> SharedMemoryWindowLender();

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STAGING_WINDOWS_H_
