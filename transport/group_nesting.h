// GroupNesting: the GroupStart/GroupEnd bookkeeping every transport shares.
// Groups nest (as with ncclGroupStart): a transport queues each call while
// grouped() and runs its queue only when End() closes the outermost group,
// or at once when a call comes outside any group.
//
// Contract. Start() opens a group (one level deeper). End() closes one:
// true when that was the outermost, so the caller now runs its queue; false
// while an enclosing group is still open; FAILED_PRECONDITION ("GroupEnd
// without a matching GroupStart") when none is open, the depth left at 0.
// Reset() closes every group at once, for a transport that failed and drops
// its queue. It never decides anything else: checking that the transport is
// usable, breaking it on End()'s error and refusing calls inside a group
// (AwaitFrom, Synchronize) stay with the transport, in its order.
//
// Thread rule: the transport's owner thread only (not thread-safe), like the
// queue it guards.
#ifndef MUONPS_TRANSPORT_GROUP_NESTING_H_
#define MUONPS_TRANSPORT_GROUP_NESTING_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muonps {
namespace transport {

class GroupNesting {
 public:
  void Start() { ++depth_; }

  absl::StatusOr<bool> End() {
    if (depth_ == 0) {
      return absl::FailedPreconditionError(
          "GroupEnd without a matching GroupStart");
    }
    --depth_;
    return depth_ == 0;
  }

  // Whether a group is open: calls are queued, not run.
  bool grouped() const { return depth_ > 0; }

  void Reset() { depth_ = 0; }

 private:
  int depth_ = 0;
};

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_GROUP_NESTING_H_
