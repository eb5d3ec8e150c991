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
#include "absl/types/span.h"
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

// A digest of this machine's identity (common/machine.h): windows of
// another host are never opened.
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

  void set_counters(WriteCounters counters) { counters_ = counters; }
  // A write of `bytes` to a peer, and one received from a peer.
  void CountWrite(int64_t bytes) const;
  void CountReceived(int64_t bytes) const;

 private:
  std::vector<std::unique_ptr<PeerWindow>> open_;  // by rank; null: none
  std::vector<int32_t> writers_;                   // by rank
  uint64_t known_ = 0;
  WriteCounters counters_;
};

// The CPU backend's lender: POSIX shared memory segments.
std::shared_ptr<WindowLender> SharedMemoryWindowLender();

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STAGING_WINDOWS_H_
