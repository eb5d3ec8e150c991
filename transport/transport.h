// Moving tensor bytes among the workers of one plan version: point-to-point
// sends and receives and the collectives a step needs, rooted at a matrix's
// owner. Implementations: TcpTransport (host memory; this machine's CPU
// path) and NcclTransport (device memory, one rank per GPU), and
// SplitTransport, which sends the control messages of a device transport
// over a host one.
//
// Streams (NCCL's rule). Every data call names the stream it is ordered on.
// A device transport (memory() is kCuda) enqueues the call on that stream
// and returns; the transfer is done when the stream reaches it, and later
// work on the same stream (or on a stream that waits on an event recorded
// after it) sees the data. A host transport (memory() is kHost) takes
// kHostStream only and has finished a call, or a group, when it returns.
//
// Counts. Every data call counts elements, not bytes, as NCCL does: Send,
// Recv, Broadcast, BroadcastIn and AwaitFrom take a count of elements of a
// DType (a call moves count * DTypeSize(dtype) bytes); ReduceSum and
// ReduceSumIn add fp32 elements only.
//
// Order. Every rank issues the same calls in the same order (the step
// schedule fixes it); calls between GroupStart() and GroupEnd() may progress
// concurrently and complete together (ncclGroupStart/End). Buffers handed to
// a call inside a group must stay valid, and those the call reads unchanged,
// until the group's work is done; within one group no call may read what
// another writes. Messages between two ranks match up in call order.
//
// Splits. Besides every rank, a data call may run among the members of one
// group of a split of the ranks (enum Split: owner groups, rails), which
// each rank forms once (FormSplit): BroadcastIn and ReduceSumIn then run
// among the members of its own group of that split only, every group's
// members in the same order (other groups' calls are their own). Both
// splits may be formed at once, each independent of the other. A transport
// whose library needs a communicator per group (NCCL) makes it there, split
// from its own.
//
// Failure. A peer that disappears or stalls past the transport's timeout
// makes a pending call (host) or Synchronize (device) fail with UNAVAILABLE
// or DEADLINE_EXCEEDED naming the peer rank; Abort() makes every pending
// and later call fail at once (ncclCommAbort). A failed transport is broken
// for good: build a new one. A Transport is used by one thread at a time;
// Abort() may be called from any thread.
#ifndef MUONPS_TRANSPORT_TRANSPORT_H_
#define MUONPS_TRANSPORT_TRANSPORT_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/device.h"
#include "common/dtype.h"
#include "common/rank_tree.h"

namespace muonps {
namespace transport {

// The two ways a plan splits the ranks into groups, each formed at most once
// per transport (Transport::FormSplit) and independent of the other.
enum class Split {
  // The owner groups (scheduler's OwnershipPlan::groups): each group's
  // owners among themselves, to whom an owner broadcasts its updates.
  kOwnerGroups,
  // The rails of the exchange nodes (scheduler's OwnershipPlan::
  // exchange_nodes): the workers at one position of every node, among
  // which a bucket's node sums are reduced and its updates broadcast
  // (scheduler/node_exchange.h).
  kRails,
};
// How many kinds of Split there are; a Split's value indexes [0, kSplits).
constexpr int kSplits = 2;

// "owner groups" or "rails", for messages.
const char* SplitName(Split split);

class Transport {
 public:
  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the buffers of every data call must live.
  virtual MemoryKind memory() const = 0;

  virtual absl::Status GroupStart() = 0;
  virtual absl::Status GroupEnd() = 0;

  // Sends `count` elements of `dtype` (count * DTypeSize(dtype) bytes) from
  // `data` to `peer` (!= rank()).
  virtual absl::Status Send(const void* data, size_t count, DType dtype,
                            int peer, Stream stream) = 0;
  // Receives `count` elements of `dtype` from `peer` into `data`. The
  // matching Send must name the same count and dtype.
  virtual absl::Status Recv(void* data, size_t count, DType dtype, int peer,
                            Stream stream) = 0;

  // Sum of every rank's `send` into `recv` on `root`: `count` is a number
  // of fp32 elements (ReduceSum takes no DType; it always adds floats).
  // `recv` is ignored elsewhere and may alias `send` on the root. `order` is
  // empty (rank order) or a permutation of the ranks: the fp32 parts are added
  // left to right in that order, which fixes the result's bits (a caller
  // that wants results independent of how ranks were numbered passes its
  // own order; only the root's `order` matters). A transport whose library
  // picks its own order (NCCL) says so and may ignore it. INVALID_ARGUMENT
  // for an `order` that is not a permutation.
  virtual absl::Status ReduceSum(const float* send, float* recv, size_t count,
                                 int root, absl::Span<const int> order,
                                 Stream stream) = 0;
  // Copies `count` elements of `dtype` at `data` from `root` to every rank.
  // Every rank names the same count and dtype.
  virtual absl::Status Broadcast(void* data, size_t count, DType dtype,
                                 int root, Stream stream) = 0;

  // Forms `split`: `groups` splits the ranks into groups (each rank in
  // exactly one; a group's ranks in any order), every rank naming the same
  // groups in the same order, at the same point of its calls (a collective:
  // every rank forms the same splits in the same order; NCCL splits a
  // communicator per group, ncclCommSplit, which lives and is aborted with
  // this transport's). Once per split per transport. INVALID_ARGUMENT
  // unless `groups` splits the ranks; FAILED_PRECONDITION when `split` was
  // formed already; the library's errors. Messages name the split:
  // "FormSplit(rails): groups[1] names rank 7, outside [0, 6)".
  absl::Status FormSplit(Split split,
                         const std::vector<std::vector<int>>& groups);
  // This rank's group of `split`, its ranks in ascending order; empty until
  // FormSplit(split) (every rank is one group).
  const std::vector<int>& group(Split split) const {
    return groups_[static_cast<int>(split)];
  }
  // Copies `count` elements of `dtype` at `data` from `root`, a member of
  // this rank's group of `split`, to every other member; only the group's
  // members call it, in the same order (the other groups' calls are their
  // own). With `split` not formed, or its group being every rank,
  // Broadcast. By default the root sends to each member in turn (what a
  // host transport's Broadcast does too); NCCL broadcasts on the group's
  // communicator, a ring over its members. INVALID_ARGUMENT for a root
  // outside the group, naming the call and split ("BroadcastIn(rails)").
  virtual absl::Status BroadcastIn(Split split, void* data, size_t count,
                                   DType dtype, int root, Stream stream);
  // ReduceSum among the members of this rank's group of `split`: the sum of
  // every member's `send` into `recv` on `root`, a member of the group;
  // only the group's members call it, in the same order. `order` is empty
  // (the members in ascending rank order) or a permutation of the group's
  // members (ranks, not positions), and fixes the fp32 summation order as
  // ReduceSum's does: acc = part[order[0]]; acc += part[order[1]]; ...
  // `recv` may alias `send` on the root (in place). With `split` not
  // formed, or its group being every rank, ReduceSum; a group of one member
  // copies `send` to `recv` (nothing when they alias). INVALID_ARGUMENT for
  // a root outside the group, an order that is not a permutation of its
  // members, null buffers or a partial overlap, naming the call and split
  // ("ReduceSumIn(rails)").
  virtual absl::Status ReduceSumIn(Split split, const float* send, float* recv,
                                   size_t count, int root,
                                   absl::Span<const int> order,
                                   Stream stream) = 0;

  // Waits until the work this transport enqueued on `stream` is done,
  // failing (and aborting) if a peer is lost or nothing progresses for
  // `timeout`. Host transports return at once (their calls have finished).
  virtual absl::Status Synchronize(Stream stream, absl::Duration timeout) = 0;

  // Waits up to `timeout` for the next message from `peer`, of `count`
  // elements of `dtype`, to arrive, without the caller receiving it (outside
  // a group): OK once one has (or the peer closed: the receive then fails);
  // DEADLINE_EXCEEDED when none came, the transport still usable and the
  // wait resumable by calling again. The caller's next Recv from `peer` (of
  // the same count and dtype) then takes that message. What a worker with
  // no trainer of its own waits on between steps. A transport whose library
  // cannot wait without receiving (NCCL) posts the receive into a buffer of
  // its own here and hands the message over at that Recv; `count` and
  // `dtype` tell it the size and type (others ignore them).
  virtual absl::Status AwaitFrom(int peer, size_t count, DType dtype,
                                 absl::Duration timeout) = 0;

  // Breaks the transport: pending and later calls fail with `reason`.
  virtual void Abort(const absl::Status& reason) = 0;

  // Where a step's control messages go (worker/step_control.h): this
  // transport, or a host transport beside it (SplitTransport) that takes
  // no device work and no SMs. Owned by this transport, aborted with it.
  virtual Transport* control() { return this; }

  // The ranks this rank exchanges control messages with, as a tree rooted
  // at rank 0 (rank_tree.h) along which worker::ControlChannel passes its
  // gathers and broadcasts: a star (one hop) where every pair of ranks is
  // connected, as by default; a tree mesh's own (TcpOptions::shape).
  virtual RankTree tree() const { return RankTree::Star(size()); }

 protected:
  // `rank`'s position in this rank's group of `split` (its rank within the
  // group's own communicator); -1 for a rank outside it. With `split` not
  // formed, `rank`.
  int PositionIn(Split split, int rank) const;
  // The ranks a call on `split` runs among, ascending: group(split), or
  // every rank while `split` is not formed.
  std::vector<int> MembersOf(Split split) const;
  // Every rank, ascending.
  std::vector<int> EveryRank() const;
  // What every transport checks of a rooted fp32 sum over `members` (its
  // ranks ascending, this one among them: ReduceSum's every rank,
  // ReduceSumIn's group), `call` naming it in messages: `root` is a member;
  // `order` is empty or a permutation of the members; count * sizeof(float)
  // fits a size_t; with count > 0 `send` is not null, nor `recv` on the
  // root; on the root `recv` is `send` itself or does not overlap it.
  // Returns the summation order (`order`, or the members where it is
  // empty); INVALID_ARGUMENT naming what is wrong.
  absl::StatusOr<std::vector<int>> CheckSum(absl::string_view call,
                                            const std::vector<int>& members,
                                            const float* send,
                                            const float* recv, size_t count,
                                            int root,
                                            absl::Span<const int> order) const;
  // INVALID_ARGUMENT naming `call` unless `root` is one of `members` (ranks
  // ascending; every rank: a rank in [0, size())).
  absl::Status CheckRoot(absl::string_view call,
                         const std::vector<int>& members, int root) const;
  // "ReduceSumIn(rails)": `call` on `split`, for messages.
  static std::string CallIn(absl::string_view call, Split split);
  // What FormSplit does besides recording the groups, once they are
  // checked: `mine` indexes this rank's group. Wrappers pass the split on.
  virtual absl::Status OnSplit(Split /*split*/,
                               const std::vector<std::vector<int>>& /*groups*/,
                               int /*mine*/) {
    return absl::OkStatus();
  }

 private:
  // This rank's group of each split, sorted; empty: not formed.
  std::vector<int> groups_[kSplits];
};

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_TRANSPORT_H_
