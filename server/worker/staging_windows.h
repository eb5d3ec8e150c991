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
// a worker reads the updates peers copied into its trainer's staging only
// when it commits, after rank 0 decided from every vote (those its own
// stream landed it writes into the parameters at once: step_commit.h). So a
// commit reads only updates that landed, and a writer that dies mid-copy never
// voted. The next step's writes come after the next round's agreement, which a
// rank joins only once its commit is done; a round whose resolution commits a
// staged step from its staging holds every rank at a barrier before anyone
// writes again (RoundAgreement).
//
// Landed words: a receiver writes each update into its trainer's parameters
// as soon as it lands, so it must see when a peer's copies landed. After its
// updates every window holds kLandedOwners x kLandedSlots 64-bit words
// (LandedOffset). An owner sets word (owner, k) of every window it wrote to
// the round's token after its k-th run of copies (slot min(k, 62)), and slot
// 63 after its last run, in its transfer stream's order
// (DeviceOps::WriteWord: the copies' bytes are visible before the word); the
// receiver's apply stream waits for the token (DeviceOps::WaitWord) before it
// writes those updates into its trainer's parameters. The token is new every
// round, so a word left from an earlier round never matches. A receiver whose
// round fails releases its waits (DeviceOps::ReleaseWord) before it takes the
// step back, so no apply stream stays held by a writer that died. An owner
// of rank kLandedOwners or more cannot signal, so it writes into no window.
//
// A worker publishes its window only when its trainer keeps the whole
// parameter of every matrix, its staging laid out as FullStagedAt says, so
// a writer finds every update's place in a peer's staging from the plan
// alone. Which owners write (every other trainer's window opened) is agreed
// by all ranks once per change of the windows, so the receivers know which
// updates they need not receive.
#ifndef MUONPS_SERVER_WORKER_STAGING_WINDOWS_H_
#define MUONPS_SERVER_WORKER_STAGING_WINDOWS_H_

#include <algorithm>
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
  uint64_t bytes;   // the updates' and the landed words'
  uint64_t landed;  // where the landed words start (LandedOffset)
  char handle[200];
};
static_assert(sizeof(WindowRecord) % 4 == 0,
              "a window record travels as floats");

// The landed words of a window (the header comment says how they are used):
// kLandedSlots zero-filled 64-bit words per owner rank, owner after owner.
// Owner ranks that can signal (rank < this).
inline constexpr int kLandedOwners = 1024;
// Per owner and step: runs 0..62 each their own word, 63 the owner's last
// run.
inline constexpr int kLandedSlots = 64;
inline constexpr int kLastRunSlot = kLandedSlots - 1;
inline constexpr int64_t kLandedBytes =
    int64_t{kLandedOwners} * kLandedSlots * sizeof(uint64_t);

// Byte offset of the landed words in a window whose updates take
// `update_bytes` bytes: the next multiple of 256.
int64_t LandedOffset(int64_t update_bytes);
// Word index of (owner, slot) among a window's landed words.
inline int64_t LandedIndex(int owner, int slot) {
  return int64_t{owner} * kLandedSlots + slot;
}
// The slot of an owner's run `run` of copies (0, 1, ...): runs past 62
// share slot 62, which then says only that run 62 landed; a receiver of a
// later run's updates waits for kLastRunSlot.
inline int LandedSlotOfRun(int run) { return std::min(run, kLastRunSlot - 1); }

// A digest of this machine's identity (common/machine.h): windows of
// another host are never opened.
uint64_t HostIdentity();

// A new window's record for a lender: a random id (never 0), this host,
// `kind`, the landed words' offset past `count` elements of `dtype` (at
// least one element), and the bytes of both (whole floats). The lender
// adds where to find it (handle, offset).
WindowRecord NewWindowRecord(WindowKind kind, DType dtype, int64_t count);

// Word (owner, slot) of this worker's own lent window, which its receiver
// waits on and releases (DeviceOps::WaitWord, ReleaseWord): `updates` and
// `window` as WindowLender::Allocate returned them (AttachedTrainer's
// `updates` and `window`). Memory of the buffer's device (a GPU's: not for
// the host to read). Null where nothing was lent (window.id 0, or no
// buffer).
uint64_t* OwnLandedWord(const kernels::TypedBuffer& updates,
                        const WindowRecord& window, int owner, int slot);

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
  // `record`, followed in the same memory by the zero-filled landed words
  // (record->landed; OwnLandedWord finds them). The buffer holds `count`
  // elements, its memory the words too. RESOURCE_EXHAUSTED naming `what`
  // when the memory is full.
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
  // with a trainer) but its own: each one published and opened, and
  // `self` < kLandedOwners (a rank that cannot signal opens none). A
  // record whose landed words lie outside its bytes is not opened.
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
  // Word (owner, slot) of rank `rank`'s window as opened here, where its
  // record put the landed words: the owner writes it (DeviceOps::WriteWord)
  // once its run `slot` of copies into the window is enqueued (opened:
  // Writes(self)).
  uint64_t* LandedWord(int rank, int owner, int slot) const {
    return reinterpret_cast<uint64_t*>(At(rank, landed_[rank])) +
           LandedIndex(owner, slot);
  }

  void set_counters(WriteCounters counters) { counters_ = counters; }
  // A write of `bytes` to a peer, and one received from a peer.
  void CountWrite(int64_t bytes) const;
  void CountReceived(int64_t bytes) const;

 private:
  std::vector<std::unique_ptr<PeerWindow>> open_;  // by rank; null: none
  std::vector<int64_t> landed_;   // by rank: WindowRecord::landed of open_
  std::vector<int32_t> writers_;  // by rank
  uint64_t known_ = 0;
  WriteCounters counters_;
};

// The CPU backend's lender: POSIX shared memory segments.
std::shared_ptr<WindowLender> SharedMemoryWindowLender();

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STAGING_WINDOWS_H_
