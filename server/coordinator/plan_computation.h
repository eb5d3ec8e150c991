// A job's next plan, computed from a copy: PlanSnapshot is what the
// planner needs of the job, copied under the JobTable's mutex (cheap:
// matrices and the previous plan are shared, not copied), and ComputePlan
// runs the planner and the step schedule on it without any lock (slow:
// ~0.3 s for 10^5 matrices on 10^3 workers).
#ifndef MUONPS_SERVER_COORDINATOR_PLAN_COMPUTATION_H_
#define MUONPS_SERVER_COORDINATOR_PLAN_COMPUTATION_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/cost_model.h"
#include "scheduler/plan_types.h"
#include "scheduler/step_clock.h"
#include "server/coordinator/job_table.h"
#include "server/coordinator/published_plan.h"

namespace muonps {
namespace coordinator {

struct PlanSnapshot {
  std::string job;
  // The version the plan will have (only the job's planner publishes).
  int64_t version = 0;
  std::shared_ptr<const std::vector<scheduler::MatrixSpec>> matrices;
  // Ranks (RankedMembers): workers with trainers in join order, then
  // dedicated ones.
  std::vector<scheduler::WorkerSpec> workers;
  int32_t dedicated = 0;
  int ns_steps = 5;
  scheduler::AlgorithmPolicy algorithm = scheduler::AlgorithmPolicy::kAuto;
  // JobSpec.bucket_bytes; 0: chosen for the workers' nodes
  // (scheduler::ChooseStepGrouping).
  int64_t bucket_bytes = 0;
  // Per rank: its node (WorkerDevice::node; "" unknown).
  std::vector<std::string> nodes;
  // By rank: the network bandwidth each reported (WorkerDevice::network_gbs,
  // 0: unknown).
  std::vector<double> network_gbs;
  // JobSpec::replicas. > 1: the plan's owner groups are `replica_groups`
  // (ReplicaGroups of the ranks' trainer ranks), none while those are
  // empty, `no_replica_groups` saying why; no groups of nodes.
  int32_t replicas = 0;
  std::vector<std::vector<int32_t>> replica_groups;
  std::string no_replica_groups;
  // By rank, the shard its trainer holds (WholeExpertShards), for a job
  // with stacks sharded on their experts; otherwise not known.
  scheduler::TrainerShards trainer_shards;
  // The links between them (CoordinatorOptions::links; across nodes, what
  // the ranks reported where every one did: ReportedNetworkGbs).
  scheduler::LinkFigures links;
  std::shared_ptr<const PublishedPlan> previous;  // null: the first plan
  // Re-plan from `previous` keeping owners (see JobRecord::stepped), or
  // afresh with moved bytes counted against it.
  bool keep_owners = false;
  // Nothing a plan shows changed since `previous` (a standby joined or
  // left, a heartbeat changed nothing of the ranks): `previous` stands.
  bool unchanged = false;
  std::string reason;
};

// For a job with a stack of experts sharded on its experts
// (MatrixSpec::shard_experts): by rank, the shard its trainer holds of
// `trainers` trainers (0: as many as the ranks) in `replicas` replica
// groups, -1 for a rank with no trainer or whose trainer rank is not known
// or out of range; not known (TrainerShards{}) for other jobs, for one
// trainer, or when no rank's trainer rank is known.
scheduler::TrainerShards WholeExpertShards(
    const std::vector<scheduler::MatrixSpec>& matrices, int trainers,
    int replicas, const std::vector<std::optional<int32_t>>& trainer_ranks);

// Whether `shards` (by rank) names a shard for every rank but the last
// `dedicated` (which have no trainer).
bool CoversEveryTrainer(const scheduler::TrainerShards& shards, int dedicated);

// `now` (WholeExpertShards of the ranks `ranked`, by worker id) where a
// rank's trainer rank is known; elsewhere the shard `before` (of a
// previous plan's ranks `before_ids`) gave the same worker, when both split
// the trainers alike. Not known where neither knows any.
scheduler::TrainerShards KeepKnownShards(
    scheduler::TrainerShards now, const std::vector<std::string>& ranked,
    const scheduler::TrainerShards& before,
    const std::vector<std::string>& before_ids);

// The members of `job` its plans rank, in join order, the dedicated ones
// last. Of the others, JobSpec::trainers (all when 0): first those whose
// trainer is attached (WorkerRecord::has_trainer), then those the job's
// newest plan ranks (a standby displaces no rank that only lost its
// trainer for a while), then the earliest joined. The rest are standbys.
// Cheap; call with the JobTable's mutex held.
std::vector<std::string> RankedMembers(const JobRecord& job);
// Whether the job's newest plan ranks RankedMembers (in any order).
bool NewestPlanRanksMembers(const JobRecord& job);

// What job `name`'s next plan is computed from: its members and their
// nodes, the spec's plan settings with their defaults (5 NS steps, auto),
// its newest plan and its pending reasons. Call with the JobTable's mutex
// held; `job` must have members.
PlanSnapshot SnapshotForPlanning(const std::string& name, const JobRecord& job);

// HSDP's replica groups of a job's ranks (JobSpec::replicas `replicas` >
// 1 of `trainers` trainers), from the rank of each rank's trainer
// (`trainer_ranks`, by plan rank; nullopt: not known): group g holds the
// ranks whose trainers are g*S .. g*S+S-1 (S = trainers / replicas), by
// trainer rank (a rank's position in its group is its trainer's rank % S).
// Empty, with `why` said, unless there are `trainers` ranks and their
// trainer ranks are all known, distinct and below `trainers`.
std::vector<std::vector<int32_t>> ReplicaGroups(
    int replicas, int trainers,
    const std::vector<std::optional<int32_t>>& trainer_ranks, std::string* why);

// The ranks' topology: equal node names are one node; when no rank names
// one, every rank is on one node; an unnamed one is a node of its own.
scheduler::Topology TopologyOf(const std::vector<std::string>& nodes);

// The network bandwidth a plan weighs from what its ranks reported
// (PlanSnapshot::network_gbs): the least of them where every rank reported
// one (> 0), else 0 (the coordinator's own figure stands).
double ReportedNetworkGbs(const std::vector<double>& network_gbs);

// The plan of `snapshot` (version, reason and planning time filled in; its
// owner groups the job's replica groups where it has them (required, a
// draining rank's position owning nothing in every group), else
// the one of scheduler::ChooseOwnerGroupings' (groups of 1, 2, ... whole
// nodes) on the ranks' topology that predicts the shortest step, where it
// beats the plan of every rank, none while a rank drains; a grouped plan is
// planned on
// the first group's workers and copied to every group; its bucket bound
// the spec's, or the one whose predicted step on the ranks' topology is the
// shortest), or
// the planner's or the step schedule's error (e.g. RESOURCE_EXHAUSTED when
// the workers' memory cannot hold the matrices). Thread-safe; takes no
// lock.
absl::StatusOr<std::shared_ptr<const PublishedPlan>> ComputePlan(
    const PlanSnapshot& snapshot);

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_PLAN_COMPUTATION_H_
