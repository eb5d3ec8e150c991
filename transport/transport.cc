#include "transport/transport.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace muonps {
namespace transport {
namespace {

// "ranks 0, 3 and 5" of a group, the first few of a large one.
std::string Listed(const std::vector<int>& members) {
  constexpr size_t kListed = 8;
  if (members.size() <= kListed) {
    return absl::StrCat("ranks ", absl::StrJoin(members, ", "));
  }
  return absl::StrCat(
      members.size(), " ranks: ",
      absl::StrJoin(members.begin(), members.begin() + kListed, ", "), ", ...");
}

bool PartlyOverlap(const float* a, const float* b, size_t count) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  const uintptr_t bytes = count * sizeof(float);
  return x != y && x < y + bytes && y < x + bytes;
}

}  // namespace

const char* SplitName(Split split) {
  switch (split) {
    case Split::kOwnerGroups:
      return "owner groups";
    case Split::kRails:
      return "rails";
  }
  return "unknown split";
}

std::string Transport::CallIn(absl::string_view call, Split split) {
  return absl::StrCat(call, "(", SplitName(split), ")");
}

absl::Status Transport::FormSplit(Split split,
                                  const std::vector<std::vector<int>>& groups) {
  const std::string call = CallIn("FormSplit", split);
  std::vector<int>& mine_sorted = groups_[static_cast<int>(split)];
  if (!mine_sorted.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(call, ": formed already on this transport"));
  }
  const int n = size();
  std::vector<int> group_of(n, -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(call, ": groups[", g, "] is empty"));
    }
    for (const int r : groups[g]) {
      if (r < 0 || r >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat(call, ": groups[", g, "] names rank ", r,
                         ", outside [0, ", n, ")"));
      }
      if (group_of[r] >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(call, ": rank ", r, " is in groups[", group_of[r],
                         "] and groups[", g, "]"));
      }
      group_of[r] = static_cast<int>(g);
    }
  }
  for (int r = 0; r < n; ++r) {
    if (group_of[r] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(call, ": rank ", r, " is in no group"));
    }
  }
  const int mine = group_of[rank()];
  absl::Status formed = OnSplit(split, groups, mine);
  if (!formed.ok()) return formed;
  mine_sorted = groups[mine];
  std::sort(mine_sorted.begin(), mine_sorted.end());
  return absl::OkStatus();
}

int Transport::PositionIn(Split split, int rank) const {
  const std::vector<int>& members = group(split);
  if (members.empty()) return rank;
  const auto at = std::lower_bound(members.begin(), members.end(), rank);
  if (at == members.end() || *at != rank) return -1;
  return static_cast<int>(at - members.begin());
}

std::vector<int> Transport::MembersOf(Split split) const {
  const std::vector<int>& members = group(split);
  return members.empty() ? EveryRank() : members;
}

std::vector<int> Transport::EveryRank() const {
  std::vector<int> ranks(size());
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

absl::Status Transport::CheckRoot(absl::string_view call,
                                  const std::vector<int>& members,
                                  int root) const {
  if (std::binary_search(members.begin(), members.end(), root)) {
    return absl::OkStatus();
  }
  if (static_cast<int>(members.size()) == size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, ": root ", root, ": must be a rank in [0, ", size(), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(call, ": root ", root, " is not in rank ", rank(),
                   "'s group (", Listed(members), ")"));
}

absl::StatusOr<std::vector<int>> Transport::CheckSum(
    absl::string_view call, const std::vector<int>& members, const float* send,
    const float* recv, size_t count, int root,
    absl::Span<const int> order) const {
  absl::Status valid = CheckRoot(call, members, root);
  if (!valid.ok()) return valid;
  const bool on_root = root == rank();
  if (count > std::numeric_limits<size_t>::max() / sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": count ", count, " is too large"));
  }
  if (count > 0 && send == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(call, ": send is null"));
  }
  if (on_root && count > 0 && recv == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": recv is null on the root"));
  }
  if (on_root && PartlyOverlap(send, recv, count)) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, ": recv partly overlaps send (it may only be send itself)"));
  }
  if (order.empty()) return members;
  std::vector<int> sorted(order.begin(), order.end());
  std::sort(sorted.begin(), sorted.end());
  if (sorted != members) {
    const bool everyone = static_cast<int>(members.size()) == size();
    return absl::InvalidArgumentError(
        absl::StrCat(call, ": order is not a permutation of ",
                     everyone ? absl::StrCat("the ", size(), " ranks")
                              : absl::StrCat("rank ", rank(), "'s group (",
                                             Listed(members), ")")));
  }
  return std::vector<int>(order.begin(), order.end());
}

absl::Status Transport::BroadcastIn(Split split, void* data, size_t count,
                                    DType dtype, int root, Stream stream) {
  const std::vector<int>& members = group(split);
  if (members.empty() || static_cast<int>(members.size()) == size()) {
    return Broadcast(data, count, dtype, root, stream);
  }
  const absl::Status valid =
      CheckRoot(CallIn("BroadcastIn", split), members, root);
  if (!valid.ok()) return valid;
  if (rank() != root) return Recv(data, count, dtype, root, stream);
  for (const int r : members) {
    if (r == root) continue;
    absl::Status sent = Send(data, count, dtype, r, stream);
    if (!sent.ok()) return sent;
  }
  return absl::OkStatus();
}

}  // namespace transport
}  // namespace muonps
