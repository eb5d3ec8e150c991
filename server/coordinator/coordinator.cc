#include "server/coordinator/coordinator.h"

#include <utility>
#include <vector>

#include "common/status.h"
#include "server/coordinator/state_restore.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {

Coordinator::Coordinator(const CoordinatorOptions& options, Clock clock)
    : Coordinator(options, std::move(clock), nullptr) {}

Coordinator::Coordinator(const CoordinatorOptions& options, Clock clock,
                         std::unique_ptr<JobStore> store)
    : options_(options),
      clock_(std::move(clock)),
      queue_(std::move(store)),
      plans_(&table_, &queue_, options_.plan_history, options_.links),
      jobs_(&options_, &clock_, &table_, &queue_, &plans_),
      membership_(&options_, &clock_, &table_, &queue_, &plans_),
      nccl_ids_(&table_, &queue_),
      step_stats_(&table_, options_.rebalance_tolerance) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(
    const CoordinatorOptions& options, std::unique_ptr<JobStore> store,
    Clock clock) {
  MUONPS_ASSIGN_OR_RETURN(const StoredState stored, store->Load());
  std::unique_ptr<Coordinator> coordinator(
      new Coordinator(options, std::move(clock), std::move(store)));
  MUONPS_ASSIGN_OR_RETURN(
      const std::vector<JobToReplan> replans,
      RestoreState(stored, coordinator->clock_(), options.lease_ttl,
                   &coordinator->table_));
  size_t workers = 0;
  for (const StoredJob& job : stored.jobs) workers += job.workers.size();
  spdlog::info(
      "state_dir={}: restored {} jobs, {} workers (each with a fresh lease of "
      "{} ms)",
      coordinator->queue_.store()->dir(), stored.jobs.size(), workers,
      absl::ToInt64Milliseconds(options.lease_ttl));
  for (const JobToReplan& job : replans) {
    MUONPS_RETURN_IF_ERROR(
        coordinator->plans_.PlanAtLeast(job.name, job.incarnation, 1).status());
  }
  return coordinator;
}

}  // namespace coordinator
}  // namespace muonps
