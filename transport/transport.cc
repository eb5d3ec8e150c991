#include "transport/transport.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace transport {

absl::Status Transport::FormGroups(
    const std::vector<std::vector<int>>& groups) {
  if (!group_.empty()) {
    return absl::FailedPreconditionError(
        "FormGroups: owner groups were formed already on this transport");
  }
  const int n = size();
  std::vector<int> group_of(n, -1);
  int mine = -1;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("FormGroups: groups[", g, "] is empty"));
    }
    for (const int r : groups[g]) {
      if (r < 0 || r >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat("FormGroups: groups[", g, "] names rank ", r,
                         ", outside [0, ", n, ")"));
      }
      if (group_of[r] >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("FormGroups: rank ", r, " is in groups[", group_of[r],
                         "] and groups[", g, "]"));
      }
      group_of[r] = static_cast<int>(g);
    }
  }
  for (int r = 0; r < n; ++r) {
    if (group_of[r] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("FormGroups: rank ", r, " is in no group"));
    }
  }
  mine = group_of[rank()];
  absl::Status formed = OnGroups(groups, mine);
  if (!formed.ok()) return formed;
  group_ = groups[mine];
  std::sort(group_.begin(), group_.end());
  return absl::OkStatus();
}

int Transport::PositionInGroup(int rank) const {
  if (group_.empty()) return rank;
  const auto at = std::lower_bound(group_.begin(), group_.end(), rank);
  if (at == group_.end() || *at != rank) return -1;
  return static_cast<int>(at - group_.begin());
}

absl::Status Transport::BroadcastInGroup(void* data, size_t count, DType dtype,
                                         int root, Stream stream) {
  if (group_.empty() || static_cast<int>(group_.size()) == size()) {
    return Broadcast(data, count, dtype, root, stream);
  }
  if (PositionInGroup(root) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BroadcastInGroup: root ", root, " is not in this rank's owner group"));
  }
  if (rank() != root) return Recv(data, count, dtype, root, stream);
  for (const int r : group_) {
    if (r == root) continue;
    absl::Status sent = Send(data, count, dtype, r, stream);
    if (!sent.ok()) return sent;
  }
  return absl::OkStatus();
}

}  // namespace transport
}  // namespace muonps
