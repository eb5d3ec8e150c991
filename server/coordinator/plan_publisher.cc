#include "server/coordinator/plan_publisher.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/coordinator/plan_computation.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {

PlanPublisher::PlanPublisher(JobTable* table, StoreQueue* queue,
                             int plan_history,
                             const scheduler::LinkFigures& links)
    : table_(table),
      queue_(queue),
      plan_history_(plan_history),
      links_(links) {}

absl::StatusOr<int64_t> PlanPublisher::PlanAtLeast(const std::string& name,
                                                   uint64_t incarnation,
                                                   int64_t generation) {
  auto deleted = [&] {
    return FieldError(absl::StatusCode::kNotFound, "job",
                      absl::StrCat(Quoted(name), " was deleted"));
  };
  while (true) {
    PlanSnapshot snapshot;
    int64_t planned = 0;
    size_t reasons = 0;
    {
      absl::MutexLock lock(table_->mutex());
      JobRecord* job = table_->FindIncarnation(name, incarnation);
      // One planner per job: the others wait for what it publishes.
      while (job != nullptr && job->plans.planned_generation < generation &&
             job->plans.planning) {
        plan_changed_.Wait(table_->mutex());
        job = table_->FindIncarnation(name, incarnation);
      }
      if (job == nullptr) return deleted();
      if (job->plans.planned_generation >= generation) {
        return job->plans.latest_version();
      }
      planned = job->members.generation();
      if (job->members.empty()) {
        job->plans.set_error("the job has no workers");
        job->plans.planned_generation = planned;
        job->members.DropReasons(job->members.reasons().size());
        plan_changed_.SignalAll();
        continue;
      }
      snapshot = SnapshotForPlanning(name, *job);
      snapshot.links = links_;
      reasons = job->members.reasons().size();
      if (snapshot.unchanged) {
        spdlog::info(
            "job={} plan_version={} stands ({}): its ranks are as "
            "they were",
            name, snapshot.version - 1, snapshot.reason);
        job->plans.planned_generation = planned;
        job->members.DropReasons(reasons);
        plan_changed_.SignalAll();
        continue;
      }
      job->plans.planning = true;
    }
    absl::StatusOr<std::shared_ptr<const PublishedPlan>> plan =
        ComputePlan(snapshot);
    int64_t seq = 0;
    {
      absl::MutexLock lock(table_->mutex());
      JobRecord* job = table_->FindIncarnation(name, incarnation);
      if (job == nullptr) {
        plan_changed_.SignalAll();
        return deleted();
      }
      if (job->members.generation() != planned) {  // stale: plan again
        job->plans.planning = false;
        plan_changed_.SignalAll();
        continue;
      }
      if (!plan.ok()) {
        job->plans.set_error(std::string(plan.status().message()));
        job->plans.planned_generation = planned;
        job->members.DropReasons(reasons);
        job->plans.planning = false;
        plan_changed_.SignalAll();
        spdlog::warn("job={} cannot be planned ({}): {}", name, snapshot.reason,
                     job->plans.error());
        continue;
      }
      seq = queue_->Enqueue({store_op::PutPlan{name, *plan, "", 0}});
    }
    // Durable before anyone can see it, so no restart takes it back.
    const absl::Status persisted = queue_->Persist(seq);
    absl::MutexLock lock(table_->mutex());
    JobRecord* job = table_->FindIncarnation(name, incarnation);
    if (job == nullptr) {
      plan_changed_.SignalAll();
      return deleted();
    }
    job->plans.planning = false;
    plan_changed_.SignalAll();
    if (!persisted.ok()) return persisted;
    const scheduler::OwnershipPlan& ownership = (*plan)->ownership;
    spdlog::info(
        "job={} plan_version={} ({}): {} workers, max {:.3f} ms, imbalance "
        "{:.4f}, moved {} bytes, planned in {:.1f} ms",
        name, snapshot.version, snapshot.reason, ownership.worker_ids.size(),
        ownership.max_seconds * 1e3, ownership.imbalance, ownership.moved_bytes,
        (*plan)->plan_ms);
    job->plans.Publish(*std::move(plan), plan_history_);
    job->plans.planned_generation = planned;
    job->members.DropReasons(reasons);
    published_versions_.fetch_add(1);
  }
}

absl::StatusOr<std::shared_ptr<const PublishedPlan>> PlanPublisher::GetPlan(
    const std::string& job, int64_t version) {
  if (version < 0) {
    return InvalidField("version", absl::StrCat(version, " < 0"));
  }
  absl::MutexLock lock(table_->mutex());
  MUONPS_ASSIGN_OR_RETURN(JobRecord * record, table_->Find(job));
  return record->plans.Find(job, version);
}

absl::StatusOr<std::shared_ptr<const PublishedPlan>> PlanPublisher::WaitForPlan(
    const std::string& job, int64_t known_version, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(table_->mutex());
  while (true) {
    MUONPS_ASSIGN_OR_RETURN(JobRecord * record, table_->Find(job));
    // Other than the caller's: newer, or the current one for a caller
    // ahead of every version this job published.
    const PlanVersion* current = record->plans.current();
    if (current != nullptr && current->plan->version != known_version) {
      return current->plan;
    }
    if (plan_changed_.WaitWithDeadline(table_->mutex(), deadline))
      return nullptr;
  }
}

}  // namespace coordinator
}  // namespace muonps
