#include "scheduler/step_schedule.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace scheduler {
namespace {

// (owner, short side, long side): what a plan's Batch is per.
using ShapeKey = std::tuple<int32_t, int64_t, int64_t>;

ShapeKey KeyOf(int32_t owner, int64_t rows, int64_t cols) {
  return {owner, std::min(rows, cols), std::max(rows, cols)};
}

std::string ShapeName(const ShapeKey& key) {
  return absl::StrCat(std::get<1>(key), "x", std::get<2>(key), " on worker ",
                      std::get<0>(key));
}

// The plan's batches against its owners (see BuildStepSchedule).
absl::Status CheckBatches(const std::vector<MatrixSpec>& matrices,
                          const OwnershipPlan& plan) {
  if (plan.batches.empty()) return absl::OkStatus();
  // The first owner group's (OwnershipPlan::batches), as the owners are.
  const OwnerGroups groups(plan);
  absl::flat_hash_map<ShapeKey, int64_t> owned;
  owned.reserve(plan.batches.size());
  for (size_t m = 0; m < matrices.size(); ++m) {
    for (const int32_t owner : plan.owners[m]) {
      ++owned[KeyOf(owner, matrices[m].rows, matrices[m].cols)];
    }
  }
  const int workers = static_cast<int>(plan.worker_ids.size());
  absl::flat_hash_set<ShapeKey> batched;
  batched.reserve(plan.batches.size());
  for (size_t b = 0; b < plan.batches.size(); ++b) {
    const Batch& batch = plan.batches[b];
    auto field = [b] { return absl::StrCat("plan.batches[", b, "]"); };
    if (batch.worker < 0 || batch.worker >= workers) {
      return InvalidField(field(), absl::StrCat("worker ", batch.worker,
                                                " is not a worker index"));
    }
    if (groups.group_of(batch.worker) != 0) {
      return InvalidField(
          field(), absl::StrCat("worker ", batch.worker,
                                " is not in the first owner group (the "
                                "other groups run copies of its batches)"));
    }
    const ShapeKey key = KeyOf(batch.worker, batch.rows, batch.cols);
    if (!batched.insert(key).second) {
      return InvalidField(field(),
                          absl::StrCat("a second batch of ", ShapeName(key)));
    }
    for (const ItemRef& item : batch.items) {
      if (item.matrix < 0 ||
          item.matrix >= static_cast<int32_t>(matrices.size()) ||
          item.expert < 0 || item.expert >= matrices[item.matrix].experts) {
        return InvalidField(
            field(), absl::StrCat("item (", item.matrix, ", ", item.expert,
                                  ") is not a matrix expert"));
      }
      const MatrixSpec& spec = matrices[item.matrix];
      if (KeyOf(plan.owners[item.matrix][item.expert], spec.rows, spec.cols) !=
          key) {
        return InvalidField(
            field(), absl::StrCat("matrix ", Quoted(spec.name), " expert ",
                                  item.expert, " is not of ", ShapeName(key)));
      }
    }
    const int64_t items = static_cast<int64_t>(batch.items.size());
    if (items != owned[key]) {
      return InvalidField(
          field(), absl::StrCat("lists ", items, " matrices of ",
                                ShapeName(key), "; it owns ", owned[key]));
    }
    if (batch.parts.empty()) return InvalidField(field(), "has no parts");
    int64_t total = 0;
    for (size_t p = 0; p < batch.parts.size(); ++p) {
      const int64_t count = batch.parts[p].count;
      if (count < 1 || count > items - total) {
        return InvalidField(
            absl::StrCat(field(), ".parts[", p, "]"),
            absl::StrCat("count ", count, " is not in [1, ", items - total,
                         "] (the batch's ", items, " matrices less the ",
                         "earlier parts')"));
      }
      total += count;
    }
    if (total != items) {
      return InvalidField(field(), absl::StrCat("parts cover ", total, " of ",
                                                items, " matrices"));
    }
  }
  return absl::OkStatus();
}

// Each stack's chunks: its plan batch's parts laid over the owner's stacks
// of that shape in schedule order (see OwnerStack). `batch_of[g]` is group
// g's batch (null: the plan has none), `group_of_stack[s]` stack s's group.
void CutIntoChunks(const std::vector<const Batch*>& batch_of,
                   const std::vector<int32_t>& group_of_stack,
                   std::vector<OwnerStack>* stacks) {
  // Per group: where the owner's stacks so far have reached in its batch:
  // `at` items laid, inside part `p`, which ends at item `end` (part p
  // covers the batch's items [end - parts[p].count, end)).
  struct Cursor {
    int64_t at = 0;
    size_t p = 0;
    int64_t end = 0;
  };
  std::vector<Cursor> cursors(batch_of.size());
  for (size_t g = 0; g < batch_of.size(); ++g) {
    if (batch_of[g] != nullptr) cursors[g].end = batch_of[g]->parts[0].count;
  }
  for (size_t s = 0; s < stacks->size(); ++s) {
    OwnerStack& stack = (*stacks)[s];
    int64_t left = static_cast<int64_t>(stack.items.size());
    const Batch* batch = batch_of[group_of_stack[s]];
    if (batch == nullptr) {
      stack.chunks.push_back({left, NsAlgorithm::kNs5});
      continue;
    }
    Cursor& c = cursors[group_of_stack[s]];
    const BatchParts& parts = batch->parts;
    while (left > 0) {
      const bool last = c.p + 1 == parts.size();
      const int64_t take = last ? left : std::min(left, c.end - c.at);
      stack.chunks.push_back({take, parts[c.p].algorithm});
      c.at += take;
      left -= take;
      if (!last && c.at == c.end) c.end += parts[++c.p].count;
    }
  }
}

}  // namespace

absl::Status CheckPlanLayout(const std::vector<MatrixSpec>& matrices,
                             const OwnershipPlan& plan) {
  if (plan.owners.size() != matrices.size()) {
    return InvalidField("plan.owners",
                        absl::StrCat("covers ", plan.owners.size(),
                                     " matrices, not ", matrices.size()));
  }
  if (plan.matrix_names.size() != matrices.size()) {
    return InvalidField("plan.matrix_names",
                        absl::StrCat("names ", plan.matrix_names.size(),
                                     " matrices, not ", matrices.size()));
  }
  const int workers = static_cast<int>(plan.worker_ids.size());
  if (plan.dedicated < 0 || (plan.dedicated > 0 && plan.dedicated >= workers)) {
    return InvalidField("plan.dedicated",
                        absl::StrCat(plan.dedicated, " of ", workers,
                                     " workers: at least one needs a trainer"));
  }
  for (size_t m = 0; m < matrices.size(); ++m) {
    auto field = [&] {
      return absl::StrCat("matrix ", Quoted(matrices[m].name));
    };
    if (plan.matrix_names[m] != matrices[m].name) {
      return InvalidField(
          field(), absl::StrCat("plan has ", Quoted(plan.matrix_names[m]),
                                " in its place"));
    }
    if (static_cast<int64_t>(plan.owners[m].size()) != matrices[m].experts) {
      return InvalidField(field(),
                          absl::StrCat("plan owns ", plan.owners[m].size(),
                                       " experts, not ", matrices[m].experts));
    }
    for (int32_t owner : plan.owners[m]) {
      if (owner < 0 || owner >= workers) {
        return InvalidField(
            field(), absl::StrCat("owner ", owner, " is not a worker index"));
      }
    }
  }
  MUONPS_RETURN_IF_ERROR(CheckOwnerGroups(plan));
  MUONPS_RETURN_IF_ERROR(CheckExchangeNodes(plan));
  if (!plan.groups.empty()) {
    // Each group computes from its own trainers' gradients: whole on every
    // trainer (replicated), or split over the group's trainers
    // (row_sharded, HSDP's replica groups); never parts of a sum over all.
    for (const MatrixSpec& spec : matrices) {
      if (spec.layout != Layout::kUnreduced) continue;
      return InvalidField(
          "plan.groups",
          absl::StrCat("owner groups need every gradient whole or split "
                       "within a group; ",
                       Quoted(spec.name), " is unreduced"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckStepPlan(const std::vector<MatrixSpec>& matrices,
                           const OwnershipPlan& plan) {
  MUONPS_RETURN_IF_ERROR(CheckPlanLayout(matrices, plan));
  return CheckBatches(matrices, plan);
}

namespace {

// Each item's group, one per (owner, shape up to orientation): the plan's
// batch holding it (`batch_of` its batch), or, where the plan has no batch
// of the item's owner and shape (a plan from a coordinator before batches,
// or one that leaves them to the default), a group numbered as the items
// come (`batch_of` null). Items are at first[m] + e. INVALID_ARGUMENT
// naming plan.batches when an item is missing from its owner's batch of
// its shape (another listed twice in its place).
absl::StatusOr<std::vector<int32_t>> GroupItems(
    const std::vector<MatrixSpec>& matrices, const OwnershipPlan& plan,
    const std::vector<int64_t>& first, std::vector<const Batch*>* batch_of) {
  std::vector<int32_t> group(first.back(), -1);
  batch_of->clear();
  // The first owner group's batches (OwnershipPlan::batches).
  for (const Batch& b : plan.batches) {
    const int32_t g = static_cast<int32_t>(batch_of->size());
    batch_of->push_back(&b);
    for (const ItemRef& item : b.items) {
      group[first[item.matrix] + item.expert] = g;
    }
  }
  // Items no batch lists, grouped by owner and shape (hashed only when
  // there are any).
  absl::flat_hash_map<ShapeKey, int32_t> index;
  for (size_t m = 0; m < matrices.size(); ++m) {
    const MatrixSpec& spec = matrices[m];
    for (int64_t e = 0; e < spec.experts; ++e) {
      if (group[first[m] + e] >= 0) continue;
      if (index.empty()) {
        for (size_t b = 0; b < batch_of->size(); ++b) {
          const Batch& batch = *(*batch_of)[b];
          index.emplace(KeyOf(batch.worker, batch.rows, batch.cols),
                        static_cast<int32_t>(b));
        }
      }
      const auto [it, added] =
          index.try_emplace(KeyOf(plan.owners[m][e], spec.rows, spec.cols),
                            static_cast<int32_t>(batch_of->size()));
      if (added) {
        batch_of->push_back(nullptr);
      } else if ((*batch_of)[it->second] != nullptr) {
        return InvalidField(
            "plan.batches",
            absl::StrCat("matrix ", Quoted(spec.name), " expert ", e,
                         " is missing from its owner's batch of its shape"));
      }
      group[first[m] + e] = it->second;
    }
  }
  return group;
}

// Stacks per owner and shape, items in arrival order, each closing before
// it would exceed stack_bytes: the same whatever the bucket bound, since
// buckets cut the same arrival order. ready_bucket is left for BuildOrder.
// `first[m] + e` is item (m, e)'s index into `group` (GroupItems) and into
// `stack_of`, which says its stack; `group_of_stack` each stack's group.
void BuildStacks(const std::vector<MatrixSpec>& matrices,
                 const OwnershipPlan& plan, const std::vector<int32_t>& arrival,
                 int64_t stack_bytes, const std::vector<int64_t>& first,
                 const std::vector<int32_t>& group, int32_t groups,
                 std::vector<OwnerStack>* stacks,
                 std::vector<int32_t>* group_of_stack,
                 std::vector<int32_t>* stack_of) {
  // The open stack of each group in each orientation (a batch holds r x c
  // and c x r alike; a stack holds one of them).
  std::vector<int32_t> open(2 * static_cast<size_t>(groups), -1);
  // At most a stack per item (a batch's two orientations, and stacks that
  // close at stack_bytes, make more than one per batch).
  stacks->reserve(first.back());
  group_of_stack->reserve(first.back());
  stack_of->assign(first.back(), -1);
  // A stack whose gradients move to its owner (reduced or gathered) waits
  // for the last of them: such stacks close at a quarter of the bound, so
  // the first start computing while the later gradients still move.
  const int64_t moving_stack_bytes = std::max<int64_t>(stack_bytes / 4, 1);
  for (const int32_t m : arrival) {
    const MatrixSpec& spec = matrices[m];
    const int64_t item_bytes = 4 * spec.rows * spec.cols;
    const int64_t bound =
        spec.layout == Layout::kReplicated ? stack_bytes : moving_stack_bytes;
    const int transposed = spec.rows > spec.cols ? 1 : 0;
    for (int32_t e = 0; e < spec.experts; ++e) {
      const int32_t g = group[first[m] + e];
      int32_t& at = open[2 * static_cast<size_t>(g) + transposed];
      if (at < 0 ||
          static_cast<int64_t>((*stacks)[at].items.size() + 1) * item_bytes >
              bound) {
        OwnerStack& stack = stacks->emplace_back();
        stack.owner = plan.owners[m][e];
        stack.rows = spec.rows;
        stack.cols = spec.cols;
        group_of_stack->push_back(g);
        at = static_cast<int32_t>(stacks->size() - 1);
      }
      (*stacks)[at].items.push_back({m, e});
      (*stack_of)[first[m] + e] = at;
    }
  }
  // Where updates move (more than one worker), each (group,
  // orientation)'s last stack tapers: its first half stays, the rest goes
  // to a stack of its own, whose first half stays, down to one item or 16
  // MiB (smaller pieces would cost more in calls than their updates take
  // to move). Its owner computes the pieces as their gradients complete
  // them, and the updates of each go back while the next computes, so the
  // step's tail after the last Newton-Schulz call is one small piece's
  // updates. One worker has nothing to overlap: its batches stay whole.
  constexpr int64_t kTaperedBytes = int64_t{16} << 20;
  if (plan.worker_ids.size() < 2) return;
  const auto tapers = [stacks](int32_t at) {
    const OwnerStack& stack = (*stacks)[at];
    const int64_t count = static_cast<int64_t>(stack.items.size());
    return count > 1 && 4 * stack.rows * stack.cols * count > kTaperedBytes;
  };
  for (const int32_t last : open) {
    for (int32_t at = last; at >= 0 && tapers(at);) {
      const size_t count = (*stacks)[at].items.size();
      const size_t keep = (count + 1) / 2;
      const int32_t piece = static_cast<int32_t>(stacks->size());
      OwnerStack& rest = stacks->emplace_back();
      OwnerStack& kept = (*stacks)[at];
      rest.owner = kept.owner;
      rest.rows = kept.rows;
      rest.cols = kept.cols;
      rest.items.assign(kept.items.begin() + keep, kept.items.end());
      kept.items.resize(keep);
      for (const ItemRef& item : rest.items) {
        (*stack_of)[first[item.matrix] + item.expert] = piece;
      }
      group_of_stack->push_back((*group_of_stack)[at]);
      at = piece;
    }
  }
}

// The buckets of `arrival` under `bucket_bytes`, each with its transfers:
// the bounds first, so that every vector is sized once.
std::vector<Bucket> CutBuckets(const std::vector<MatrixSpec>& matrices,
                               const OwnershipPlan& plan,
                               const std::vector<int32_t>& arrival,
                               int64_t bucket_bytes) {
  const int32_t workers = static_cast<int32_t>(plan.worker_ids.size());
  const OwnerGroups groups(plan);
  const bool exchange = !plan.exchange_nodes.empty();
  const std::vector<size_t> ends = BucketEnds(matrices, arrival, bucket_bytes);
  std::vector<Bucket> buckets(ends.size());
  size_t begin = 0;
  for (size_t k = 0; k < ends.size(); ++k) {
    Bucket& bucket = buckets[k];
    // Every item sends one update back per group; a gradient moves in
    // unless the item is replicated and its owner has a trainer.
    const size_t count = static_cast<size_t>(groups.count());
    size_t items = 0, sent = 0;
    for (size_t i = begin; i < ends[k]; ++i) {
      const int32_t m = arrival[i];
      const MatrixSpec& spec = matrices[m];
      items += static_cast<size_t>(spec.experts);
      if (spec.layout != Layout::kReplicated) {
        sent += static_cast<size_t>(spec.experts) * count;
      } else if (plan.dedicated > 0) {
        for (int32_t g = 0; g < groups.count(); ++g) {
          for (const int32_t owner : plan.owners[m]) {
            if (groups.OwnerIn(owner, g) >= workers - plan.dedicated) ++sent;
          }
        }
      }
    }
    bucket.matrices.reserve(ends[k] - begin);
    bucket.from_owners.reserve(items * count);
    bucket.to_owners.reserve(sent);
    if (begin < ends[k]) {
      bucket.first_layer = matrices[arrival[begin]].layer;
    }
    for (size_t i = begin; i < ends[k]; ++i) {
      const int32_t m = arrival[i];
      const MatrixSpec& spec = matrices[m];
      const int64_t payload = PayloadBytes(spec);
      bucket.matrices.push_back(m);
      bucket.last_layer = spec.layer;
      bucket.bytes += payload * spec.experts;
      for (int32_t g = 0; g < groups.count(); ++g) {
        for (int32_t e = 0; e < spec.experts; ++e) {
          const int32_t owner = groups.OwnerIn(plan.owners[m][e], g);
          const ItemRef item{m, e};
          switch (spec.layout) {
            case Layout::kReplicated:
              if (owner >= workers - plan.dedicated) {
                bucket.to_owners.push_back(
                    {TransferKind::kSendToOwner, item, owner, payload, g});
              }
              bucket.from_owners.push_back(
                  {TransferKind::kBroadcastFromOwner, item, owner, payload, g});
              break;
            case Layout::kUnreduced:
              bucket.to_owners.push_back({exchange
                                              ? TransferKind::kExchangeToOwner
                                              : TransferKind::kReduceToOwner,
                                          item, owner, payload, g});
              bucket.from_owners.push_back(
                  {exchange ? TransferKind::kExchangeFromOwner
                            : TransferKind::kBroadcastFromOwner,
                   item, owner, payload, g});
              break;
            case Layout::kRowSharded:
              bucket.to_owners.push_back(
                  {TransferKind::kGatherToOwner, item, owner, payload, g});
              bucket.from_owners.push_back(
                  {TransferKind::kScatterFromOwner, item, owner, payload, g});
              break;
          }
        }
      }
    }
    begin = ends[k];
  }
  return buckets;
}

// Each stack's ready bucket (the one that completes it), then the order:
// each bucket's gradients, the stacks they complete, and the updates of
// every bucket whose stacks are then all computed.
void BuildOrder(const std::vector<int64_t>& first,
                const std::vector<int32_t>& stack_of, int32_t groups,
                int32_t workers, StepSchedule* schedule) {
  const int32_t count = static_cast<int32_t>(schedule->buckets.size());
  for (int32_t k = 0; k < count; ++k) {
    for (const int32_t m : schedule->buckets[k].matrices) {
      for (int64_t i = first[m]; i < first[m + 1]; ++i) {
        for (int32_t g = 0; g < groups; ++g) {
          schedule->stacks[stack_of[i] + g].ready_bucket = k;
        }
      }
    }
  }
  // ready_with[j]: the stacks bucket j completes; from_after[j]: the
  // buckets whose stacks are all computed once bucket j's are.
  std::vector<std::vector<int32_t>> ready_with(count);
  std::vector<std::vector<int32_t>> from_after(count);
  for (size_t s = 0; s < schedule->stacks.size(); ++s) {
    ready_with[schedule->stacks[s].ready_bucket].push_back(
        static_cast<int32_t>(s));
  }
  for (int32_t k = 0; k < count; ++k) {
    int32_t ready = k;
    for (const int32_t m : schedule->buckets[k].matrices) {
      for (int64_t i = first[m]; i < first[m + 1]; ++i) {
        ready = std::max(ready, schedule->stacks[stack_of[i]].ready_bucket);
      }
    }
    from_after[ready].push_back(k);
  }
  // last_of[w]: the stack worker w computes last (-1: none).
  std::vector<int32_t> last_of(workers, -1);
  for (int32_t j = 0; j < count; ++j) {
    schedule->order.push_back({PhaseKind::kToOwners, j});
    for (const int32_t s : ready_with[j]) {
      schedule->order.push_back({PhaseKind::kCompute, s});
      last_of[schedule->stacks[s].owner] = s;
    }
    for (const int32_t k : from_after[j]) {
      schedule->order.push_back({PhaseKind::kFromOwners, k});
    }
  }
  // Each owner's last stack's updates go by collective among more than two
  // (Transfer::by_collective); the exchange's go by the exchange.
  for (Bucket& bucket : schedule->buckets) {
    for (Transfer& x : bucket.from_owners) {
      const size_t members = schedule->groups.empty()
                                 ? static_cast<size_t>(workers)
                                 : schedule->groups[x.group].size();
      const int32_t stack =
          stack_of[first[x.item.matrix] + x.item.expert] + x.group;
      x.by_collective = x.kind != TransferKind::kExchangeFromOwner &&
                        members > 2 && last_of[x.owner] == stack;
    }
  }
}

}  // namespace

absl::string_view TransferKindName(TransferKind kind) {
  switch (kind) {
    case TransferKind::kReduceToOwner:
      return "reduce";
    case TransferKind::kGatherToOwner:
      return "gather";
    case TransferKind::kSendToOwner:
      return "send";
    case TransferKind::kBroadcastFromOwner:
      return "broadcast";
    case TransferKind::kScatterFromOwner:
      return "scatter";
    case TransferKind::kExchangeToOwner:
      return "exchange_in";
    case TransferKind::kExchangeFromOwner:
      return "exchange_out";
  }
  return "unknown";
}

absl::StatusOr<StepScheduleCutter> StepScheduleCutter::Create(
    const std::vector<MatrixSpec>& matrices, const OwnershipPlan& plan,
    int64_t stack_bytes) {
  if (stack_bytes <= 0) return InvalidField("stack_bytes", "must be > 0");
  MUONPS_RETURN_IF_ERROR(CheckPlanLayout(matrices, plan));
  StepScheduleCutter cutter(matrices, plan);
  cutter.arrival_ = ArrivalOrder(matrices);
  const std::vector<int32_t>& arrival = cutter.arrival_;
  std::vector<int64_t>& first = cutter.first_;
  first.assign(matrices.size() + 1, 0);
  for (size_t m = 0; m < matrices.size(); ++m) {
    first[m + 1] = first[m] + matrices[m].experts;
  }
  std::vector<const Batch*> batch_of;
  MUONPS_ASSIGN_OR_RETURN(const std::vector<int32_t> group,
                          GroupItems(matrices, plan, first, &batch_of));
  std::vector<int32_t> group_of_stack;
  BuildStacks(matrices, plan, arrival, stack_bytes, first, group,
              static_cast<int32_t>(batch_of.size()), &cutter.stacks_,
              &group_of_stack, &cutter.stack_of_);
  CutIntoChunks(batch_of, group_of_stack, &cutter.stacks_);
  // Every owner group computes the first group's stacks on its own members:
  // each stack followed by its copies, group after group.
  const OwnerGroups groups(plan);
  cutter.groups_ = groups.count();
  if (cutter.groups_ > 1) {
    std::vector<OwnerStack> copies;
    copies.reserve(cutter.stacks_.size() * cutter.groups_);
    for (OwnerStack& stack : cutter.stacks_) {
      for (int g = 0; g < cutter.groups_; ++g) {
        copies.push_back(stack);
        copies.back().owner = groups.OwnerIn(stack.owner, g);
      }
    }
    cutter.stacks_ = std::move(copies);
    for (int32_t& s : cutter.stack_of_) s *= cutter.groups_;
  }
  return cutter;
}

StepSchedule StepScheduleCutter::TakeStacks() {
  StepSchedule schedule;
  schedule.stacks = std::move(stacks_);
  schedule.groups = plan_->groups;
  schedule.exchange_nodes = plan_->exchange_nodes;
  return schedule;
}

absl::Status StepScheduleCutter::Cut(int64_t bucket_bytes,
                                     StepSchedule* schedule) const {
  if (bucket_bytes <= 0) return InvalidField("bucket_bytes", "must be > 0");
  schedule->buckets = CutBuckets(*matrices_, *plan_, arrival_, bucket_bytes);
  schedule->order.clear();
  BuildOrder(first_, stack_of_, groups_,
             static_cast<int32_t>(plan_->worker_ids.size()), schedule);
  return absl::OkStatus();
}

absl::StatusOr<StepSchedule> BuildStepSchedule(
    const std::vector<MatrixSpec>& matrices, const OwnershipPlan& plan,
    const ScheduleOptions& options) {
  if (options.bucket_bytes <= 0) {
    return InvalidField("bucket_bytes", "must be > 0");
  }
  MUONPS_RETURN_IF_ERROR(CheckStepPlan(matrices, plan));
  MUONPS_ASSIGN_OR_RETURN(
      StepScheduleCutter cutter,
      StepScheduleCutter::Create(matrices, plan, options.stack_bytes));
  StepSchedule schedule = cutter.TakeStacks();
  MUONPS_RETURN_IF_ERROR(cutter.Cut(options.bucket_bytes, &schedule));
  return schedule;
}

std::vector<int32_t> ArrivalOrder(const std::vector<MatrixSpec>& matrices) {
  const int count = static_cast<int>(matrices.size());
  std::vector<int32_t> arrival(count);
  std::iota(arrival.rbegin(), arrival.rend(), 0);
  // Where layers never fall with the index (a model's own order), that is
  // the reverse index order already: 10^5 matrices need no sort.
  bool by_index = true;
  for (int m = 1; m < count && by_index; ++m) {
    by_index = matrices[m - 1].layer <= matrices[m].layer;
  }
  if (!by_index) {
    std::sort(arrival.begin(), arrival.end(), [&](int32_t x, int32_t y) {
      return matrices[x].layer != matrices[y].layer
                 ? matrices[x].layer > matrices[y].layer
                 : x > y;
    });
  }
  return arrival;
}

std::vector<size_t> BucketEnds(const std::vector<MatrixSpec>& matrices,
                               const std::vector<int32_t>& arrival,
                               int64_t bucket_bytes) {
  std::vector<size_t> ends;
  int64_t filled = 0;
  for (size_t i = 0; i < arrival.size(); ++i) {
    const MatrixSpec& spec = matrices[arrival[i]];
    const int64_t bytes = PayloadBytes(spec) * spec.experts;
    if (i > 0 && filled + bytes > bucket_bytes) {
      ends.push_back(i);
      filled = 0;
    }
    filled += bytes;
  }
  if (!arrival.empty()) ends.push_back(arrival.size());
  return ends;
}

std::vector<Transfer> IssueOrder(const StepSchedule& schedule) {
  std::vector<Transfer> out;
  for (const Phase& phase : schedule.order) {
    if (phase.kind == PhaseKind::kCompute) continue;
    const Bucket& bucket = schedule.buckets[phase.index];
    const std::vector<Transfer>& transfers = phase.kind == PhaseKind::kToOwners
                                                 ? bucket.to_owners
                                                 : bucket.from_owners;
    out.insert(out.end(), transfers.begin(), transfers.end());
  }
  return out;
}

}  // namespace scheduler
}  // namespace muonps
