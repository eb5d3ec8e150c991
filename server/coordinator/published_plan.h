// PublishedPlan: one plan version of a job as the coordinator publishes it
// (GetPlan, WatchPlan, the durable store): the ownership plan, the buckets
// of its step schedule and why and how fast it was made. Immutable once
// published and shared (std::shared_ptr<const PublishedPlan>): plans of big
// jobs are megabytes. Plain values; thread-compatible.
#ifndef MUONPS_SERVER_COORDINATOR_PUBLISHED_PLAN_H_
#define MUONPS_SERVER_COORDINATOR_PUBLISHED_PLAN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/plan_types.h"

namespace muonps {
namespace coordinator {

// A bucket of the step schedule as the plan carries it.
struct PlanBucket {
  std::vector<int32_t> matrices;  // indices into PublishedPlan::matrices
  int32_t first_layer = 0;
  int32_t last_layer = 0;
  int64_t bytes = 0;
};

struct PublishedPlan {
  std::string job;
  int64_t version = 0;
  // Why it was made ("worker w2 joined; lease expired: w1").
  std::string reason;
  // Wall time of the planner and the step schedule.
  double plan_ms = 0;
  // The job's matrices (shared with the job).
  std::shared_ptr<const std::vector<scheduler::MatrixSpec>> matrices;
  // What it assumed of the ranks' trainers (PlanSnapshot::trainer_shards):
  // where whole experts are held (Plan.trainer_shards and
  // WorkerLoad.trainer_shard on the wire and in the store).
  scheduler::TrainerShards trainer_shards;
  // Owners, batches and predictions; ownership.worker_ids are the ranks.
  scheduler::OwnershipPlan ownership;
  std::vector<PlanBucket> buckets;
  // The bucket bound that cut `buckets` (0 in a plan stored before it was
  // recorded: the job's), and the ranks' distinct nodes.
  int64_t bucket_bytes = 0;
  int32_t nodes = 1;
  // Across nodes, the network bandwidth per worker the plan weighed (GB/s
  // per direction); 0 on one node.
  double network_gbs = 0;
  // The workers apply every update at the commit (Plan.apply_at_commit).
  bool apply_at_commit = false;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_PUBLISHED_PLAN_H_
