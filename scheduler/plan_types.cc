#include "scheduler/plan_types.h"

#include <algorithm>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/row_ranges.h"
#include "common/status.h"

namespace muonps {
namespace scheduler {

absl::string_view LayoutName(Layout layout) {
  switch (layout) {
    case Layout::kReplicated:
      return "replicated";
    case Layout::kUnreduced:
      return "unreduced";
    case Layout::kRowSharded:
      return "row_sharded";
  }
  return "unknown";
}

int64_t PayloadBytes(const MatrixSpec& matrix) {
  return matrix.rows * matrix.cols *
         static_cast<int64_t>(DTypeSize(matrix.dtype));
}

int64_t OwnedBytes(const MatrixSpec& matrix) {
  return 4 * matrix.rows * matrix.cols + 2 * PayloadBytes(matrix);
}

bool HoldsWholeExperts(const std::vector<MatrixSpec>& matrices) {
  return std::any_of(matrices.begin(), matrices.end(), [](const MatrixSpec& m) {
    return m.shard_experts && m.layout == Layout::kRowSharded;
  });
}

int32_t TrainerShards::ShardOfExpert(const MatrixSpec& m,
                                     int64_t expert) const {
  if (!known() || !m.shard_experts || m.layout != Layout::kRowSharded) {
    return -1;
  }
  return ShardHoldingExpert(m.experts, expert, shards);
}

std::vector<int32_t> TrainerShards::HoldersAmong(
    const std::vector<int32_t>& workers) const {
  std::vector<int32_t> holder(std::max(shards, 0), -1);
  for (const int32_t w : workers) {
    if (w < 0 || w >= static_cast<int32_t>(shard_of.size())) continue;
    const int32_t s = shard_of[w];
    if (s >= 0 && s < shards && holder[s] < 0) holder[s] = w;
  }
  return holder;
}

TrainerShards TrainerShards::Among(const std::vector<int32_t>& workers) const {
  TrainerShards out;
  if (!known()) return out;
  out.shards = shards;
  out.shard_of.reserve(workers.size());
  for (const int32_t w : workers) {
    out.shard_of.push_back(
        w >= 0 && w < static_cast<int32_t>(shard_of.size()) ? shard_of[w] : -1);
  }
  return out;
}

OwnerGroups::OwnerGroups(const std::vector<std::vector<int32_t>>& groups,
                         int workers) {
  group_of_.assign(workers, 0);
  position_.assign(workers, 0);
  if (groups.empty()) {
    members_.emplace_back();
    for (int32_t r = 0; r < workers; ++r) {
      members_[0].push_back(r);
      position_[r] = r;
    }
    return;
  }
  grouped_ = true;
  members_ = groups;
  for (size_t g = 0; g < members_.size(); ++g) {
    for (size_t s = 0; s < members_[g].size(); ++s) {
      group_of_[members_[g][s]] = static_cast<int32_t>(g);
      position_[members_[g][s]] = static_cast<int32_t>(s);
    }
  }
}

namespace {

// INVALID_ARGUMENT naming `field` unless `split` splits `workers` worker
// indices into lists of one size (at least one each), each index in
// exactly one; `what` names a list. On success `of[r]` is r's list.
absl::Status CheckSplit(const std::vector<std::vector<int32_t>>& split,
                        int32_t workers, absl::string_view field,
                        absl::string_view what, std::vector<int32_t>* of) {
  of->assign(workers, -1);
  const size_t size = split[0].size();
  for (size_t g = 0; g < split.size(); ++g) {
    const std::vector<int32_t>& list = split[g];
    const std::string at = absl::StrCat(field, "[", g, "]");
    if (list.empty() || list.size() != size) {
      return InvalidField(
          at,
          absl::StrCat("has ", list.size(), " workers; the first has ", size,
                       " (every ", what, " the same size, at least one)"));
    }
    for (const int32_t r : list) {
      if (r < 0 || r >= workers) {
        return InvalidField(at, absl::StrCat(r, " is not a worker index"));
      }
      if ((*of)[r] >= 0) {
        return InvalidField(at, absl::StrCat("worker ", r, " is also in ", what,
                                             " ", (*of)[r]));
      }
      (*of)[r] = static_cast<int32_t>(g);
    }
  }
  for (int32_t r = 0; r < workers; ++r) {
    if ((*of)[r] < 0) {
      return InvalidField(field,
                          absl::StrCat("worker ", r, " is in no ", what));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckOwnerGroups(const OwnershipPlan& plan) {
  if (plan.groups.empty()) return absl::OkStatus();
  const int32_t workers = static_cast<int32_t>(plan.worker_ids.size());
  if (plan.dedicated != 0) {
    return InvalidField("plan.groups",
                        absl::StrCat("owner groups with ", plan.dedicated,
                                     " dedicated workers: groups need a "
                                     "trainer on every worker"));
  }
  std::vector<int32_t> group_of;
  MUONPS_RETURN_IF_ERROR(
      CheckSplit(plan.groups, workers, "plan.groups", "group", &group_of));
  for (size_t m = 0; m < plan.owners.size(); ++m) {
    for (const int32_t owner : plan.owners[m]) {
      if (owner >= 0 && owner < workers && group_of[owner] != 0) {
        return InvalidField(
            "plan.groups",
            absl::StrCat("matrix ", m, " is owned by worker ", owner,
                         " of group ", group_of[owner],
                         "; owners name the first group's workers"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckExchangeNodes(const OwnershipPlan& plan) {
  if (plan.exchange_nodes.empty()) return absl::OkStatus();
  const std::string field = "plan.exchange_nodes";
  if (plan.exchange_nodes.size() < 2) {
    return InvalidField(field, "one node: the rings sum within it");
  }
  if (plan.dedicated != 0) {
    return InvalidField(field, absl::StrCat(plan.dedicated,
                                            " dedicated workers: every "
                                            "worker adds its trainer's part"));
  }
  const int32_t workers = static_cast<int32_t>(plan.worker_ids.size());
  std::vector<int32_t> node_of;
  MUONPS_RETURN_IF_ERROR(
      CheckSplit(plan.exchange_nodes, workers, field, "node", &node_of));
  if (plan.groups.empty()) return absl::OkStatus();
  // Owner groups (checked before) move rows within themselves: each node
  // in one group, so that a relay is of its owner's group.
  const OwnerGroups groups(plan);
  for (size_t k = 0; k < plan.exchange_nodes.size(); ++k) {
    const std::vector<int32_t>& node = plan.exchange_nodes[k];
    for (const int32_t w : node) {
      if (groups.group_of(w) != groups.group_of(node[0])) {
        return InvalidField(field,
                            absl::StrCat("node ", k, " spans owner groups ",
                                         groups.group_of(node[0]), " and ",
                                         groups.group_of(w)));
      }
    }
  }
  return absl::OkStatus();
}

OwnershipPlan ReplicateOverGroups(
    OwnershipPlan plan, const std::vector<std::vector<int32_t>>& ranks,
    const std::vector<std::string>& worker_ids) {
  // The figures are copied once per group, the rest moved.
  const std::vector<double> worker_seconds = std::move(plan.worker_seconds);
  const std::vector<int64_t> worker_memory_bytes =
      std::move(plan.worker_memory_bytes);
  const std::vector<int64_t> worker_momentum_bytes =
      std::move(plan.worker_momentum_bytes);
  const std::vector<int64_t> worker_link_bytes =
      std::move(plan.worker_link_bytes);
  OwnershipPlan out = std::move(plan);
  out.worker_ids = worker_ids;
  const size_t workers = worker_ids.size();
  bool identity = ranks.size() == 1 && ranks[0].size() == workers;
  for (size_t s = 0; identity && s < ranks[0].size(); ++s) {
    identity = ranks[0][s] == static_cast<int32_t>(s);
  }
  if (!identity) out.groups = ranks;
  for (auto& owners : out.owners) {
    for (int32_t& owner : owners) owner = ranks[0][owner];
  }
  for (Batch& batch : out.batches) batch.worker = ranks[0][batch.worker];
  const auto by_worker_and_shape = [](const Batch& a, const Batch& b) {
    return std::tie(a.worker, a.rows, a.cols) <
           std::tie(b.worker, b.rows, b.cols);
  };
  // Already in order where the first group's ranks ascend.
  if (!std::is_sorted(out.batches.begin(), out.batches.end(),
                      by_worker_and_shape)) {
    std::sort(out.batches.begin(), out.batches.end(), by_worker_and_shape);
  }
  const auto spread = [&](const auto& per_position, auto* per_worker) {
    per_worker->assign(workers, {});
    for (const std::vector<int32_t>& group : ranks) {
      for (size_t s = 0; s < group.size() && s < per_position.size(); ++s) {
        (*per_worker)[group[s]] = per_position[s];
      }
    }
  };
  // Every group moves its own copy of what changed owner.
  out.moved_bytes *= static_cast<int64_t>(ranks.size());
  spread(worker_seconds, &out.worker_seconds);
  spread(worker_memory_bytes, &out.worker_memory_bytes);
  spread(worker_momentum_bytes, &out.worker_momentum_bytes);
  spread(worker_link_bytes, &out.worker_link_bytes);
  return out;
}

}  // namespace scheduler
}  // namespace muonps
