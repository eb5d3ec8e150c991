// The GPU transport: Transport over one NCCL communicator, one rank per GPU,
// moving device memory (memory() is kCuda) on the caller's CUDA streams.
//
// Who joins. Only workers form the communicator, one rank per GPU: NCCL
// refuses two ranks on one GPU ("Duplicate GPU detected"), so a trainer
// never joins; it lends its buffers to the worker on its own GPU (CUDA IPC)
// and that worker moves them.
//
// Setup. For each plan version, rank 0 calls NewUniqueId() and the id travels
// through the coordinator to every rank, which calls Create with it. The
// communicator is non-blocking (ncclConfig_t::blocking = 0): Create, GroupEnd
// and the destructor wait for NCCL by polling, each bounded by
// NcclOptions::timeout, so a rank that never joins or a peer that stalls
// gives DEADLINE_EXCEEDED instead of a hang.
//
// Calls. Data calls check their arguments and are queued; the outermost
// GroupEnd() (or the call itself, outside a group) issues the queue as one
// ncclGroupStart/ncclGroupEnd, waits until NCCL has enqueued every transfer
// on its stream, and returns: the transfers are done when the stream reaches
// them (see Synchronize). Issuing a whole group inside one call keeps NCCL's
// per-thread group state closed between calls, so an Abort() from another
// thread never meets a half-built NCCL group. Buffers are device pointers on
// the communicator's GPU; `stream` is a CUDA stream created on that GPU
// (kHostStream, the null stream, is refused: host memory has no place here).
// Counts are elements of the call's DType, passed to NCCL as ncclFloat32,
// ncclBfloat16 or ncclFloat16 (ReduceSum and ReduceSumIn: ncclFloat32).
// Zero-count calls are checked and do nothing (every rank skips them
// alike).
//
// Splits. FormSplit splits a communicator per group from this one
// (ncclCommSplit, non-blocking like it: every rank of this communicator
// takes part, each with its group's index as colour), one communicator per
// kind of Split (owner groups and rails may both be formed); BroadcastIn
// and ReduceSumIn are an ncclBroadcast and an ncclReduce on the split's
// communicator, queued with this transport's calls and issued in the same
// NCCL group. Each is aborted, finalized and polled for errors with this
// one. (One group of every rank gets a communicator of its own too.)
//
// Summation order. NCCL picks its own order (it depends on the topology
// and the algorithm): ReduceSum and ReduceSumIn check `order` and otherwise
// ignore it, so their results are not bit-identical to TcpTransport's.
//
// Errors. INVALID_ARGUMENT for a bad argument (the message names it), errors
// of NCCL calls as UNAVAILABLE (system or remote errors: a lost peer) or
// INTERNAL, each naming the call, the rank and NCCL's error text, and
// DEADLINE_EXCEEDED when NCCL does not finish within the timeout. Any failed
// call breaks the transport (the peers expected the call): its communicator
// is aborted at once and every later call fails with FAILED_PRECONDITION
// quoting the first error. Build a new transport, with a fresh unique id.
//
// Ownership: the transport owns its communicator; buffers and streams stay
// the caller's, and must outlive the work enqueued on them.
//
// Thread safety: a NcclTransport is used by one thread at a time; Abort()
// may be called from any thread at any time before destruction (for example
// while the owner is inside Synchronize()). Not copyable.
#ifndef MUONPS_TRANSPORT_NCCL_TRANSPORT_H_
#define MUONPS_TRANSPORT_NCCL_TRANSPORT_H_

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transport/group_nesting.h"
#include "transport/transport.h"

// NCCL's communicator handle (ncclComm_t) and a CUDA event (cudaEvent_t);
// named here so that users of this header need no NCCL or CUDA header.
struct ncclComm;
struct CUevent_st;

namespace muonps {
namespace transport {

struct NcclOptions {
  // How long Create waits for every rank to join, GroupEnd for NCCL to
  // enqueue a group (the first transfer to a peer also connects to it), and
  // the destructor for NCCL to finalize, before aborting.
  absl::Duration timeout = absl::Seconds(10);
};

class NcclTransport final : public Transport {
 public:
  // The NCCL unique id of a new communicator: 128 opaque bytes
  // (ncclGetUniqueId) that every rank passes to Create. The calling process
  // hosts NCCL's bootstrap root for that id: it must keep running until
  // every rank's Create has returned. UNAVAILABLE if NCCL cannot make one
  // (for example, no usable network interface).
  static absl::StatusOr<std::string> NewUniqueId();

  // Makes CUDA device `cuda_device` current on the calling thread (it stays
  // current) and joins the communicator `unique_id` of `size` ranks as
  // `rank`, waiting until all `size` ranks have joined. Returns the ready
  // transport. INVALID_ARGUMENT naming the field for a negative or absent
  // `cuda_device`, a `size` below 1, a `rank` outside [0, size), a
  // `unique_id` that is not 128 bytes or a non-positive options.timeout;
  // DEADLINE_EXCEEDED (the communicator is aborted) if not every rank joined
  // within options.timeout; UNAVAILABLE or INTERNAL naming the NCCL or CUDA
  // call that failed otherwise.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(
      int cuda_device, int rank, int size, const std::string& unique_id,
      const NcclOptions& options);

  // Healthy: finalizes the communicator (flushing its pending work) and
  // destroys it, aborting it instead if that takes longer than
  // options.timeout. Broken or aborted: aborts it (if not done already).
  // Never waits longer than about options.timeout. Must not race with
  // Abort() from another thread.
  ~NcclTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MemoryKind memory() const override { return MemoryKind::kCuda; }
  // The CUDA device of the communicator: every buffer and stream lives there.
  int cuda_device() const { return cuda_device_; }

  // FAILED_PRECONDITION if broken. Groups nest.
  absl::Status GroupStart() override;
  // At the outermost level, issues the queued calls as one NCCL group and
  // waits (up to options.timeout) until NCCL has enqueued them.
  // FAILED_PRECONDITION without a matching GroupStart.
  absl::Status GroupEnd() override;

  // `count` elements of NCCL's type for `dtype` (ncclFloat32, ncclBfloat16
  // or ncclFloat16). INVALID_ARGUMENT for peer == rank() or out of range,
  // or null data with count > 0.
  absl::Status Send(const void* data, size_t count, DType dtype, int peer,
                    Stream stream) override;
  absl::Status Recv(void* data, size_t count, DType dtype, int peer,
                    Stream stream) override;
  // ncclReduce(ncclFloat, ncclSum). `recv` may be `send` itself on the root
  // (in place) but must not partly overlap it; off the root it may be null.
  // `order` is checked (empty or a permutation of the ranks) and otherwise
  // ignored: NCCL picks its own summation order.
  absl::Status ReduceSum(const float* send, float* recv, size_t count, int root,
                         absl::Span<const int> order, Stream stream) override;
  // ncclBroadcast in place (`count` elements of `dtype`'s NCCL type).
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                         Stream stream) override;
  // ncclBroadcast in place on the split's communicator (its rank: the
  // root's position in the group). Broadcast while `split` is not formed.
  absl::Status BroadcastIn(Split split, void* data, size_t count, DType dtype,
                           int root, Stream stream) override;
  // ncclReduce(ncclFloat, ncclSum) on the split's communicator (its root:
  // the root's position in the group), checked as ReduceSum; `order` is
  // checked (empty or a permutation of the group's members) and otherwise
  // ignored: NCCL picks its own summation order. While `split` is not
  // formed, ReduceSum over every rank.
  absl::Status ReduceSumIn(Split split, const float* send, float* recv,
                           size_t count, int root, absl::Span<const int> order,
                           Stream stream) override;

  // Polls `stream` (cudaStreamQuery) and the communicator's asynchronous
  // error every 0.1 to 1 ms until the stream has finished everything
  // enqueued on it. OK when it has; on an asynchronous NCCL error
  // UNAVAILABLE with NCCL's error text, and when `timeout` passes first
  // DEADLINE_EXCEEDED ("stream not done after ..."), both after Abort().
  // FAILED_PRECONDITION quoting the reason, at once, when the transport is
  // aborted (also from another thread while this waits) or broken. After a
  // failure NCCL's kernels on `stream` end early and leave their buffers
  // undefined; wait for the stream before freeing them.
  absl::Status Synchronize(Stream stream, absl::Duration timeout) override;
  // NCCL cannot wait for a message without receiving it, so the first call
  // posts an ncclRecv of `count` elements of `dtype` from `peer` into a
  // device buffer of the transport's own, on a stream of its own, and every
  // call polls it (like Synchronize, but DEADLINE_EXCEEDED leaves it posted
  // and the transport usable). The caller's next Recv from `peer` copies the
  // message out on the caller's stream (ordered after its arrival by an event)
  // instead of posting a receive. FAILED_PRECONDITION inside a group or while
  // another (peer, count, dtype) is awaited; INVALID_ARGUMENT if that Recv
  // names another count or dtype, or if count * DTypeSize(dtype) overflows. A
  // transport destroyed with the receive still posted is aborted, not
  // finalized (finalizing would wait for a message that never comes).
  absl::Status AwaitFrom(int peer, size_t count, DType dtype,
                         absl::Duration timeout) override;

  // Aborts the communicator (ncclCommAbort, once; later calls only keep the
  // first reason) so that NCCL kernels waiting on peers end and pending and
  // later calls fail with FAILED_PRECONDITION quoting `reason`. Thread-safe;
  // may block while NCCL tears the communicator down.
  void Abort(const absl::Status& reason) override;

 protected:
  // ncclCommSplit of this communicator; waits (up to options.timeout) for
  // the group's communicator, kept as the split's. FAILED_PRECONDITION
  // inside a group.
  absl::Status OnSplit(Split split, const std::vector<std::vector<int>>& groups,
                       int mine) override;

 private:
  using Clock = std::chrono::steady_clock;

  // One queued data call.
  struct Call {
    enum class Kind { kSend, kRecv, kReduce, kBroadcast };
    Kind kind;
    const void* send;  // kSend, kReduce, kBroadcast (== recv)
    void* recv;        // kRecv, kReduce (root only), kBroadcast
    size_t count;      // Elements of `dtype`.
    DType dtype;       // kFloat32 for kReduce.
    int peer;          // The peer for kSend/kRecv, the root otherwise.
    Stream stream;
    // The Split whose communicator runs it (its value; `peer` is then a
    // position in the group), or -1: this transport's own.
    int split = -1;
  };

  NcclTransport(int cuda_device, int rank, int size, const NcclOptions& options,
                ncclComm* comm);

  // FAILED_PRECONDITION quoting the first failure once broken or aborted.
  absl::Status Usable() const;
  // Polls the communicator's state and `done` (given that state,
  // ncclSuccess or ncclInProgress) every 0.1 to 1 ms until `done` says
  // true: OK. An asynchronous NCCL error: UNAVAILABLE naming `waiting_for`,
  // after Abort(); `done`'s error as it is; `deadline` first: a bare
  // DEADLINE_EXCEEDED, nothing aborted (the caller words and decides).
  absl::Status PollUntil(
      const std::function<absl::StatusOr<bool>(int state)>& done,
      Clock::time_point deadline, absl::string_view waiting_for);
  // Usable(), for when the communicator is gone (never OK).
  absl::Status Gone() const;
  // Records `status` (annotated with rank and size) as the first failure,
  // aborts the communicator, drops the queue, and returns the annotated
  // status.
  absl::Status Fail(const absl::Status& status);
  // ncclCommAbort once (the splits' communicators too); the handles are
  // gone afterwards.
  void AbortCommunicator();
  absl::Status CheckPeer(int peer, const char* field, bool allow_self) const;
  // INVALID_ARGUMENT for kHostStream: NCCL work needs a CUDA stream.
  absl::Status CheckStream(Stream stream, absl::string_view call) const;
  // ReduceSum and ReduceSumIn: checks the sum over `members` (ascending,
  // this rank among them), `call` naming it in messages, and queues an
  // ncclReduce on `split`'s communicator (-1: this one's) rooted at the
  // root's position among `members`.
  absl::Status Reduce(absl::string_view call, int split,
                      const std::vector<int>& members, const float* send,
                      float* recv, size_t count, int root,
                      absl::Span<const int> order, Stream stream);
  // The communicator a call on `split` runs on (-1: this one); null when
  // gone.
  ncclComm* CommOf(int split) ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_);
  // Queues `call` (unless it moves nothing), then issues the queue unless
  // inside a group.
  absl::Status Queue(const Call& call);
  // Issues the queued calls as one NCCL group and waits until NCCL has
  // enqueued them.
  absl::Status IssueQueue();
  // Issues the queued calls as one NCCL group without waiting (the
  // communicator may stay ncclInProgress).
  absl::Status EnqueueQueue();
  // Waits until AwaitFrom's posted receive is on its stream (if it is not
  // yet) and records its event: before any other NCCL call.
  absl::Status FinishAwaitEnqueue();
  absl::Status RecordAwaitEvent();
  // The communicators' state (ncclCommGetAsyncError of this one and the
  // splits'), an ncclResult_t: an error where any has one, else
  // ncclInProgress where any is in progress, else ncclSuccess; an error's
  // NCCL text goes to *text.
  // Fails only with Usable()'s status, at once after Abort() from any thread.
  absl::Status ReadState(int* state, std::string* text);
  // Polls ReadState until the communicator leaves ncclInProgress, up to
  // `deadline`; `what` names the call waited for. Fails (breaking the
  // transport) on an error state or at the deadline.
  absl::Status WaitUntilReady(const char* what, Clock::time_point deadline);
  // "ncclSend of 16 fp32 to rank 1", for messages.
  static std::string Describe(const Call& call);
  // "NCCL rank R of N".
  std::string Who() const;

  const int cuda_device_;
  const int rank_;
  const int size_;
  const NcclOptions options_;
  // Owner-thread state.
  GroupNesting group_;
  std::vector<Call> queue_;

  // AwaitFrom's receive (owner thread): none, posted, or arrived and not yet
  // taken by Recv.
  enum class Awaited { kNone, kPosted, kArrived };
  Awaited awaited_ = Awaited::kNone;
  int awaited_peer_ = -1;
  size_t awaited_count_ = 0;
  DType awaited_dtype_ = DType::kFloat32;
  void* await_buffer_ = nullptr;  // cudaMalloc'd, await_capacity_ bytes
  size_t await_capacity_ = 0;
  Stream await_stream_ = nullptr;
  CUevent_st* await_event_ = nullptr;  // recorded after the posted receive
  // Whether await_event_ was recorded after the posted receive, which
  // happens once NCCL has enqueued it (the communicator left
  // ncclInProgress: a first receive from a peer waits there for it).
  bool await_recorded_ = false;
  // Recv's path for the awaited message: copies it out on `stream`.
  absl::Status TakeAwaited(void* data, size_t count, DType dtype,
                           Stream stream);
  // Frees the await buffer, event and stream (after the communicator).
  void ReleaseAwait();

  mutable absl::Mutex status_mu_;
  absl::Status failure_ ABSL_GUARDED_BY(status_mu_);
  bool aborted_ ABSL_GUARDED_BY(status_mu_) = false;  // failure_ by Abort().
  // Every NCCL call on the communicator holds comm_mu_, so that Abort() from
  // another thread never runs into the owner's calls; none of them blocks
  // for long (the communicator is non-blocking), except ncclCommAbort.
  absl::Mutex comm_mu_;
  ncclComm* comm_ ABSL_GUARDED_BY(comm_mu_);  // Null once aborted.
  // Each Split's communicator, indexed by its value (null: not formed, or
  // aborted).
  ncclComm* split_comms_[kSplits] ABSL_GUARDED_BY(comm_mu_) = {};
  // Where a non-blocking ncclCommSplit writes the group's communicator
  // (NCCL's thread) until OnSplit takes it, once the parent left
  // ncclInProgress (owner thread only).
  ncclComm* splitting_ = nullptr;
};

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_NCCL_TRANSPORT_H_
