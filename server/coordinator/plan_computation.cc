#include "server/coordinator/plan_computation.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_join.h"
#include "scheduler/planner.h"
#include "scheduler/step_schedule.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {
namespace {

// What the planner assumes for a device nobody measured.
scheduler::DeviceRates RatesFor(const WorkerDevice& device) {
  scheduler::DeviceRates rates;
  if (device.kind == "cpu") {
    rates.flops_per_second = 1e11;
    rates.memory_bytes_per_second = 2e10;
    rates.call_overhead_seconds = 1e-5;
    rates.link_bytes_per_second = 1e9;
  }
  return rates;
}

std::vector<PlanBucket> BucketsOf(const scheduler::StepSchedule& schedule) {
  std::vector<PlanBucket> out;
  out.reserve(schedule.buckets.size());
  for (const scheduler::Bucket& b : schedule.buckets) {
    out.push_back({b.matrices, b.first_layer, b.last_layer, b.bytes});
  }
  return out;
}

}  // namespace

std::vector<std::string> RankedMembers(const JobRecord& job) {
  const PlanVersion* newest = job.plans.newest();
  std::set<std::string> ranked_before;
  if (newest != nullptr) {
    ranked_before.insert(newest->plan->ownership.worker_ids.begin(),
                         newest->plan->ownership.worker_ids.end());
  }
  std::vector<std::string> trainers, dedicated;
  for (const std::string& id : job.members.join_order()) {
    (job.members.at(id).join.dedicated ? dedicated : trainers).push_back(id);
  }
  const size_t wanted = static_cast<size_t>(job.spec->trainers);
  if (wanted > 0 && trainers.size() > wanted) {
    // Preference, then join order (stable).
    auto rank = [&](const std::string& id) {
      return (job.members.at(id).has_trainer ? 0 : 2) +
             (ranked_before.count(id) > 0 ? 0 : 1);
    };
    std::vector<std::string> chosen = trainers;
    std::stable_sort(chosen.begin(), chosen.end(),
                     [&](const std::string& a, const std::string& b) {
                       return rank(a) < rank(b);
                     });
    chosen.resize(wanted);
    const std::set<std::string> keep(chosen.begin(), chosen.end());
    std::vector<std::string> in_order;
    for (const std::string& id : trainers) {
      if (keep.count(id) > 0) in_order.push_back(id);
    }
    trainers = std::move(in_order);
  }
  trainers.insert(trainers.end(), dedicated.begin(), dedicated.end());
  return trainers;
}

namespace {

// The Newton-Schulz work buffers every worker of a plan sets aside: 2 GiB,
// or an eighth of the least memory of `workers` (those that own
// something).
int64_t WorkspaceBytes(const std::vector<scheduler::WorkerSpec>& workers) {
  int64_t smallest = 0;
  for (const scheduler::WorkerSpec& w : workers) {
    if (w.owns_nothing) continue;
    smallest =
        smallest == 0 ? w.memory_bytes : std::min(smallest, w.memory_bytes);
  }
  return std::min<int64_t>(int64_t{2} << 30, smallest / 8);
}

// Owner groups by worker id: `groups[g][s]` indexes `ids`.
std::vector<std::vector<std::string>> GroupIds(
    const std::vector<std::vector<int32_t>>& groups,
    const std::vector<std::string>& ids) {
  std::vector<std::vector<std::string>> out;
  out.reserve(groups.size());
  for (const std::vector<int32_t>& group : groups) {
    std::vector<std::string>& named = out.emplace_back();
    for (const int32_t rank : group) named.push_back(ids.at(rank));
  }
  return out;
}

// Whether the job's newest plan ranks exactly `ranked` (in any order).
bool NewestPlanRanks(const JobRecord& job,
                     const std::vector<std::string>& ranked) {
  const PlanVersion* newest = job.plans.newest();
  if (newest == nullptr) return false;
  const std::vector<std::string>& ids = newest->plan->ownership.worker_ids;
  return std::set<std::string>(ranked.begin(), ranked.end()) ==
         std::set<std::string>(ids.begin(), ids.end());
}

}  // namespace

bool NewestPlanRanksMembers(const JobRecord& job) {
  return NewestPlanRanks(job, RankedMembers(job));
}

PlanSnapshot SnapshotForPlanning(const std::string& name,
                                 const JobRecord& job) {
  PlanSnapshot s;
  s.job = name;
  s.version = job.plans.latest_version() + 1;
  s.matrices = job.matrices;
  const MuonSettings& muon = job.spec->muon;
  s.ns_steps = muon.ns_steps > 0 ? muon.ns_steps : 5;
  s.algorithm = muon.ns_algorithm.value_or(scheduler::AlgorithmPolicy::kAuto);
  s.bucket_bytes = job.spec->bucket_bytes;
  s.replicas = job.spec->replicas;
  const std::vector<std::string> ranked = RankedMembers(job);
  std::vector<std::optional<int32_t>> trainer_ranks;
  for (const std::string& id : ranked) {
    const WorkerRecord& w = job.members.at(id);
    trainer_ranks.push_back(w.join.dedicated ? std::nullopt : w.trainer_rank);
    s.dedicated += w.join.dedicated ? 1 : 0;
    scheduler::WorkerSpec spec;
    spec.id = id;
    spec.costs = w.costs;
    spec.rates = RatesFor(w.join.device);
    // As joined, times what its steps measured (MeasuredSpeed).
    spec.speed = (w.join.speed > 0 ? w.join.speed : 1.0) * w.speed.factor();
    spec.memory_bytes = w.join.device.memory_bytes;
    spec.colocated = w.join.device.colocated;
    spec.owns_nothing = w.draining;
    s.workers.push_back(std::move(spec));
    s.nodes.push_back(w.join.device.node);
    s.network_gbs.push_back(w.join.device.network_gbs);
  }
  const PlanVersion* newest = job.plans.newest();
  s.previous = newest == nullptr ? nullptr : newest->plan;
  // Afresh only for the start-up: workers joining before any step. Once a
  // worker of the previous version is gone (or a standby now), or a step
  // ran, owners stay.
  s.keep_owners = job.stepped;
  if (s.previous != nullptr) {
    const std::set<std::string> now(ranked.begin(), ranked.end());
    for (const std::string& id : s.previous->ownership.worker_ids) {
      if (now.count(id) == 0) s.keep_owners = true;
    }
  }
  s.unchanged = job.plans.current() != nullptr && NewestPlanRanks(job, ranked);
  for (const std::string& id : ranked) {
    if (job.members.at(id).generation > job.plans.planned_generation) {
      s.unchanged = false;
    }
  }
  // A job whose trainers hold whole experts plans them where they are
  // held: a plan made with other trainer ranks does not stand. A job
  // starting up does so once every trainer's rank is known (one plan, not
  // one per heartbeat). Afterwards a rank whose trainer's rank is not known
  // now (a trainer attaching again) keeps the shard the previous plan
  // assumed, as replica groups stand meanwhile.
  s.trainer_shards = WholeExpertShards(*s.matrices, job.spec->trainers,
                                       s.replicas, trainer_ranks);
  const bool shards_before =
      s.previous != nullptr && s.previous->trainer_shards.known();
  if (shards_before) {
    s.trainer_shards = KeepKnownShards(std::move(s.trainer_shards), ranked,
                                       s.previous->trainer_shards,
                                       s.previous->ownership.worker_ids);
  } else if (!CoversEveryTrainer(s.trainer_shards, s.dedicated)) {
    s.trainer_shards = {};
  }
  if (s.previous != nullptr &&
      !(s.previous->trainer_shards.shards == s.trainer_shards.shards &&
        s.previous->trainer_shards.shard_of == s.trainer_shards.shard_of)) {
    s.unchanged = false;
  }
  if (s.replicas > 1) {
    s.replica_groups = ReplicaGroups(s.replicas, job.spec->trainers,
                                     trainer_ranks, &s.no_replica_groups);
    // New replica groups make a new plan. Trainer ranks not (yet) all
    // known leave the previous plan's groups as they were: its workers
    // step once they are known again (restarted trainers, a restarted
    // coordinator), with no momentum moved meanwhile.
    if (!s.replica_groups.empty() &&
        (s.previous == nullptr || GroupIds(s.previous->ownership.groups,
                                           s.previous->ownership.worker_ids) !=
                                      GroupIds(s.replica_groups, ranked))) {
      s.unchanged = false;
    }
  }
  s.reason = job.members.reasons().empty()
                 ? std::string("re-plan")
                 : absl::StrJoin(job.members.reasons(), "; ");
  return s;
}

scheduler::TrainerShards WholeExpertShards(
    const std::vector<scheduler::MatrixSpec>& matrices, int trainers,
    int replicas, const std::vector<std::optional<int32_t>>& trainer_ranks) {
  scheduler::TrainerShards out;
  if (!scheduler::HoldsWholeExperts(matrices)) return out;
  const int ranks = static_cast<int>(trainer_ranks.size());
  const int count = trainers > 0 ? trainers : ranks;
  const int groups = replicas > 1 ? replicas : 1;
  // One trainer holds every expert: nothing to place.
  if (count < 2 || count % groups != 0) return out;
  out.shards = count / groups;
  bool any = false;
  for (const std::optional<int32_t>& t : trainer_ranks) {
    const bool valid = t.has_value() && *t >= 0 && *t < count;
    out.shard_of.push_back(valid ? *t % out.shards : -1);
    any = any || valid;
  }
  if (!any) return {};
  return out;
}

bool CoversEveryTrainer(const scheduler::TrainerShards& shards, int dedicated) {
  if (!shards.known()) return false;
  const int trainers = static_cast<int>(shards.shard_of.size()) - dedicated;
  return std::all_of(shards.shard_of.begin(),
                     shards.shard_of.begin() + std::max(trainers, 0),
                     [](int32_t s) { return s >= 0; });
}

scheduler::TrainerShards KeepKnownShards(
    scheduler::TrainerShards now, const std::vector<std::string>& ranked,
    const scheduler::TrainerShards& before,
    const std::vector<std::string>& before_ids) {
  if (!before.known() || before.shard_of.size() != before_ids.size()) {
    return now;
  }
  if (now.shards == 0) {
    now.shards = before.shards;
    now.shard_of.assign(ranked.size(), -1);
  }
  if (now.shards != before.shards) return now;
  std::map<std::string, int32_t> shard_before;
  for (size_t r = 0; r < before_ids.size(); ++r) {
    shard_before[before_ids[r]] = before.shard_of[r];
  }
  bool any = false;
  for (size_t r = 0; r < ranked.size(); ++r) {
    if (now.shard_of[r] < 0) {
      const auto it = shard_before.find(ranked[r]);
      if (it != shard_before.end()) now.shard_of[r] = it->second;
    }
    any = any || now.shard_of[r] >= 0;
  }
  return any ? now : scheduler::TrainerShards{};
}

std::vector<std::vector<int32_t>> ReplicaGroups(
    int replicas, int trainers,
    const std::vector<std::optional<int32_t>>& trainer_ranks,
    std::string* why) {
  const int ranks = static_cast<int>(trainer_ranks.size());
  if (replicas <= 1 || trainers % replicas != 0 || ranks != trainers) {
    *why = absl::StrCat(ranks, " ranks of ", trainers, " trainers in ",
                        replicas, " replica groups");
    return {};
  }
  const int size = trainers / replicas;
  std::vector<int32_t> rank_of(trainers, -1);  // by trainer rank
  std::vector<std::string> unknown;
  for (int r = 0; r < ranks; ++r) {
    const std::optional<int32_t>& t = trainer_ranks[r];
    if (!t.has_value()) {
      unknown.push_back(absl::StrCat(r));
      continue;
    }
    if (*t < 0 || *t >= trainers) {
      *why = absl::StrCat("rank ", r, "'s trainer is rank ", *t,
                          ", not one of the ", trainers, " trainers");
      return {};
    }
    if (rank_of[*t] >= 0) {
      *why = absl::StrCat("ranks ", rank_of[*t], " and ", r,
                          " both name trainer rank ", *t);
      return {};
    }
    rank_of[*t] = r;
  }
  if (!unknown.empty()) {
    *why = absl::StrCat("the trainer ranks of ranks ",
                        absl::StrJoin(unknown, ", "), " are not known yet");
    return {};
  }
  std::vector<std::vector<int32_t>> groups(replicas);
  for (int t = 0; t < trainers; ++t) groups[t / size].push_back(rank_of[t]);
  return groups;
}

double ReportedNetworkGbs(const std::vector<double>& network_gbs) {
  if (network_gbs.empty()) return 0;
  double least = network_gbs[0];
  for (const double gbs : network_gbs) {
    if (!(gbs > 0)) return 0;
    least = std::min(least, gbs);
  }
  return least;
}

scheduler::Topology TopologyOf(const std::vector<std::string>& nodes) {
  scheduler::Topology t;
  if (std::all_of(nodes.begin(), nodes.end(),
                  [](const std::string& n) { return n.empty(); })) {
    return t;
  }
  absl::flat_hash_map<std::string, int32_t> index;
  int32_t next = 0;
  for (const std::string& name : nodes) {
    if (name.empty()) {  // a node of its own
      t.node.push_back(next++);
      continue;
    }
    const auto [it, added] = index.try_emplace(name, next);
    if (added) ++next;
    t.node.push_back(it->second);
  }
  return t;
}

namespace {

// Whether `previous` has as many owner groups of as many workers as
// `groups` (none in both included; null: none).
bool SameGroupLayout(const scheduler::OwnershipPlan& previous,
                     const scheduler::OwnerGrouping* groups) {
  if (groups == nullptr) return previous.groups.empty();
  return previous.groups.size() == groups->size() &&
         (groups->empty() || previous.groups[0].size() == (*groups)[0].size());
}

}  // namespace

absl::StatusOr<std::shared_ptr<const PublishedPlan>> ComputePlan(
    const PlanSnapshot& s) {
  scheduler::ClockSettings settings;
  settings.topology = TopologyOf(s.nodes);
  settings.topology.links = s.links;
  // Across nodes, the links the workers reported, where every one did: the
  // slowest port bounds every ring that crosses the network.
  const double reported = ReportedNetworkGbs(s.network_gbs);
  if (reported > 0 && settings.topology.nodes() > 1) {
    settings.topology.links.inter_node_gbs = reported;
  }
  settings.trainer_shards = s.trainer_shards;
  // What each worker holds beside its workspace, for the buffers of
  // exchange nodes (a draining one owns nothing: not checked).
  const int64_t workspace = WorkspaceBytes(s.workers);
  for (const scheduler::WorkerSpec& w : s.workers) {
    settings.capacity_bytes.push_back(w.owns_nothing
                                          ? std::numeric_limits<int64_t>::max()
                                          : w.memory_bytes - workspace);
  }
  // The workers apply the updates before the votes where the clock says
  // that is faster (Plan.apply_at_commit says where it does not).
  settings.apply_early = true;
  // Owner groups (of 1, 2, ... whole nodes each, for all-replicated jobs on
  // nodes of as many workers each), taken where their predicted step is
  // the shortest (scheduler::PlanOnTopology): the planner places the
  // matrices on the
  // first group's workers only, and every other group copies that placement
  // position by position. The first group's WorkerSpecs (cost tables,
  // rates) stand for every group's: the nodes are assumed alike, but each
  // position takes the slowest speed and the least memory of its members.
  // A drain (a rank that must own nothing) plans without groups: its
  // position would have to own nothing in every group.
  //
  // A job of replica groups (HSDP) has its own: each replica group's
  // trainers hold the same gradients, split over the group, so its owners
  // are its own workers. They are required, not weighed, and a drain keeps
  // them (the draining rank's position owns nothing in every group: the
  // workers step no plan without them). Until every rank's trainer rank is
  // known there are none, and the workers step no such plan.
  const bool replicas = s.replicas > 1;
  std::vector<scheduler::OwnerGrouping> groupings;
  if (replicas) {
    if (!s.replica_groups.empty()) groupings.push_back(s.replica_groups);
    if (groupings.empty()) {
      spdlog::info(
          "job {} plan version {}: no owner groups for its {} "
          "replica groups yet: {}",
          s.job, s.version, s.replicas, s.no_replica_groups);
    }
  } else {
    groupings = scheduler::ChooseOwnerGroupings(
        *s.matrices, settings.topology, static_cast<int>(s.workers.size()),
        s.dedicated);
    if (std::any_of(
            s.workers.begin(), s.workers.end(),
            [](const scheduler::WorkerSpec& w) { return w.owns_nothing; })) {
      groupings.clear();
    }
  }
  // The planner matches the previous plan's owners by worker id, and a
  // grouped plan's owners name its first group's workers. So owners are
  // kept (Replan) only when the previous plan has as many groups of as
  // many workers as the candidate (none in both included). Across a change
  // of that layout, where every group must hold every matrix's momentum
  // anyway, the plan is made afresh, its moved bytes counted against the
  // owners the previous plan names.
  const scheduler::PlanRanks plan_ranks =
      [&](const std::vector<int32_t>& ranks,
          const scheduler::OwnerGrouping* groups,
          bool experts_at_holders) -> absl::StatusOr<scheduler::OwnershipPlan> {
    scheduler::PlanInput input;
    input.matrices = *s.matrices;
    input.options.ns_steps = s.ns_steps;
    input.options.algorithm = s.algorithm;
    input.options.experts_at_holders = experts_at_holders;
    for (const int32_t rank : ranks) input.workers.push_back(s.workers[rank]);
    input.trainer_shards = s.trainer_shards.Among(ranks);
    input.nodes = settings.topology.NodesOf(ranks);
    if (groups != nullptr) {
      // Each position stands for its member of every group: the slowest
      // speed (a measured one included) and the least memory among them,
      // and it owns nothing where one of them drains.
      for (const std::vector<int32_t>& group : *groups) {
        for (size_t p = 0; p < group.size(); ++p) {
          const scheduler::WorkerSpec& w = s.workers[group[p]];
          scheduler::WorkerSpec& position = input.workers[p];
          position.speed = std::min(position.speed, w.speed);
          position.memory_bytes =
              std::min(position.memory_bytes, w.memory_bytes);
          position.owns_nothing = position.owns_nothing || w.owns_nothing;
        }
      }
    }
    input.options.workspace_bytes = WorkspaceBytes(input.workers);
    if (s.previous == nullptr) return scheduler::PlanOwnership(input);
    if (s.keep_owners && SameGroupLayout(s.previous->ownership, groups)) {
      return scheduler::Replan(input, s.previous->ownership);
    }
    return scheduler::PlanAfresh(input, s.previous->ownership);
  };
  std::vector<std::string> ids;
  ids.reserve(s.workers.size());
  for (const scheduler::WorkerSpec& w : s.workers) ids.push_back(w.id);
  // Each worker's Newton-Schulz times, for the step clock.
  std::vector<scheduler::CostModel> models;
  models.reserve(s.workers.size());
  for (const scheduler::WorkerSpec& w : s.workers) {
    models.emplace_back(w.costs, w.rates, w.speed, s.ns_steps);
  }
  std::vector<const scheduler::CostModel*> pointers;
  for (const scheduler::CostModel& m : models) pointers.push_back(&m);
  const auto start = std::chrono::steady_clock::now();
  // Updates in bf16 (Newton-Schulz's default precision); buckets cut at
  // the spec's bound, or at the one ChooseStepGrouping picks for the
  // ranks' topology (64 MiB on one node).
  absl::StatusOr<scheduler::TopologyPlan> planned = scheduler::PlanOnTopology(
      *s.matrices, ids, s.dedicated, pointers, settings,
      {.bucket_bytes = s.bucket_bytes}, groupings,
      replicas && !groupings.empty() ? scheduler::OwnerGroupsUse::kRequired
                                     : scheduler::OwnerGroupsUse::kWeighed,
      plan_ranks);
  const double plan_ms = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - start)
                             .count();
  if (!planned.ok()) return planned.status();
  if (replicas && !groupings.empty()) {
    spdlog::info(
        "job {} plan version {}: {} owner groups of {} workers, "
        "the replica groups by trainer rank",
        s.job, s.version, groupings[0].size(), groupings[0][0].size());
  }
  if (planned->weighed.groups_offered) {
    std::string tried;
    for (const auto& [members, seconds] : planned->weighed.grouped_candidates) {
      absl::StrAppend(&tried, tried.empty() ? "" : ", ", members,
                      " workers a group: ", seconds * 1e3, " ms");
    }
    const std::vector<std::vector<int32_t>>& taken = planned->plan.groups;
    spdlog::info(
        "job {} plan version {}: owner groups {} ({} ms predicted with the "
        "best, {} ms {}without; {}){}{}",
        s.job, s.version,
        taken.empty() ? std::string("declined")
                      : absl::StrCat("taken: ", taken.size(), " of ",
                                     taken[0].size(), " workers"),
        planned->weighed.grouped_seconds * 1e3,
        planned->weighed.ungrouped_seconds * 1e3,
        planned->weighed.ungrouped_passed_over ? "at least (not planned) " : "",
        tried, planned->weighed.groups_declined.empty() ? "" : ": ",
        planned->weighed.groups_declined);
  }
  if (planned->weighed.at_holders_seconds > 0) {
    spdlog::info(
        "job {} plan version {}: whole experts {} ({} ms predicted with "
        "every expert owned where it is held, {} ms with them there only "
        "where that costs nothing)",
        s.job, s.version,
        planned->weighed.experts_at_holders ? "owned where they are held"
                                            : "there where that costs nothing",
        planned->weighed.at_holders_seconds * 1e3,
        planned->weighed.where_free_seconds * 1e3);
  }
  if (planned->weighed.before_votes_seconds > 0) {
    spdlog::info(
        "job {} plan version {}: updates applied {} ({} ms predicted before "
        "the votes, {} ms at the commit)",
        s.job, s.version,
        planned->weighed.apply_at_commit ? "at the commit" : "before the votes",
        planned->weighed.before_votes_seconds * 1e3,
        planned->weighed.at_commit_seconds * 1e3);
  }
  if (planned->weighed.exchange_offered) {
    spdlog::info(
        "job {} plan version {}: {} ({} ms predicted with exchange nodes "
        "over {} nodes, {} ms without){}",
        s.job, s.version,
        planned->plan.exchange_nodes.empty()
            ? "no exchange nodes"
            : "exchange nodes (unreduced gradients summed in two levels, "
              "row_sharded rows relayed)",
        planned->weighed.exchange_seconds * 1e3, settings.topology.nodes(),
        planned->weighed.rings_seconds * 1e3,
        planned->weighed.exchange_declined.empty()
            ? ""
            : absl::StrCat("; not taken: ",
                           planned->weighed.exchange_declined));
  }
  auto out = std::make_shared<PublishedPlan>();
  out->job = s.job;
  out->version = s.version;
  out->reason = s.reason;
  out->plan_ms = plan_ms;
  out->matrices = s.matrices;
  out->trainer_shards = s.trainer_shards;
  out->ownership = std::move(planned->plan);
  out->buckets = BucketsOf(planned->grouping.schedule);
  out->bucket_bytes = planned->grouping.bucket_bytes;
  out->nodes = settings.topology.nodes();
  out->network_gbs =
      out->nodes > 1 ? settings.topology.links.inter_node_gbs : 0.0;
  out->apply_at_commit = planned->weighed.apply_at_commit;
  return out;
}

}  // namespace coordinator
}  // namespace muonps
