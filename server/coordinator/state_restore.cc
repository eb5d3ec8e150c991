#include "server/coordinator/state_restore.h"

#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "scheduler/cost_table.h"
#include "server/coordinator/plan_computation.h"
#include "server/coordinator/request_validation.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {
namespace {

// Limits nothing the coordinator once accepted can exceed.
Limits Unlimited() {
  Limits unlimited;
  for (int64_t* limit : {&unlimited.max_matrices_per_job,
                         &unlimited.max_parameters_per_job, &unlimited.max_dim,
                         &unlimited.max_experts, &unlimited.max_name_bytes}) {
    *limit = std::numeric_limits<int64_t>::max();
  }
  return unlimited;
}

// A stored member with a lease of `lease_ttl` from `now`. A cost table that
// no longer parses is dropped (logged): the member plans on FLOPs.
WorkerRecord MemberOf(const std::string& job, const StoredWorker& w,
                      absl::Time now, absl::Duration lease_ttl) {
  WorkerRecord r;
  r.join = w.join;
  if (!w.join.cost_table.empty()) {
    absl::StatusOr<scheduler::CostTable> table =
        scheduler::CostTable::Parse(w.join.cost_table);
    if (table.ok()) {
      r.costs = std::make_shared<const scheduler::CostTable>(*std::move(table));
    } else {
      spdlog::warn("job={} worker={} stored cost table ignored: {}", job,
                   w.worker_id, table.status().ToString());
    }
  }
  r.join_time = absl::FromUnixMillis(w.join_time_ms);
  r.lease_expiry = now + lease_ttl;
  r.token = w.token;
  r.join_seq = w.join_seq;
  r.draining = w.draining;
  return r;
}

}  // namespace

absl::StatusOr<std::vector<JobToReplan>> RestoreState(const StoredState& stored,
                                                      absl::Time now,
                                                      absl::Duration lease_ttl,
                                                      JobTable* table) {
  const Limits unlimited = Unlimited();
  std::vector<JobToReplan> replans;
  absl::MutexLock lock(table->mutex());
  table->set_version_floors(stored.version_floors);
  for (const StoredJob& s : stored.jobs) {
    if (const absl::Status valid = ValidateJobSpec(*s.spec, unlimited);
        !valid.ok()) {
      return absl::DataLossError(
          absl::StrCat("state store: job ", Quoted(s.name),
                       ": stored spec is invalid: ", valid.message()));
    }
    JobRecord fresh;
    fresh.spec = s.spec;
    fresh.matrices = std::shared_ptr<const std::vector<scheduler::MatrixSpec>>(
        s.spec, &s.spec->matrices);
    fresh.create_request_id = s.create_request_id;
    fresh.create_time = absl::FromUnixMillis(s.create_time_ms);
    fresh.job_token = s.job_token;
    fresh.data_plane_secret = s.data_plane_secret;
    JobRecord& job = table->Insert(s.name, std::move(fresh));
    for (const StoredWorker& w : s.workers) {
      job.members.Restore(w.worker_id, MemberOf(s.name, w, now, lease_ttl));
    }
    if (s.plan.has_value()) {
      if (s.plan->plan.ok()) {
        // Whether the job stepped under it is not stored: keep owners.
        job.stepped = true;
        job.plans.Restore(
            {*s.plan->plan, s.plan->nccl_id, s.plan->nccl_generation});
      } else {
        spdlog::warn("job={} stored plan_version={} dropped: {}", s.name,
                     s.plan->version, s.plan->plan.status().ToString());
      }
      job.plans.ContinueAfter(s.plan->version);
    }
    // The ranks its members would have (standbys aside: RankedMembers
    // prefers the stored plan's ranks while no heartbeat has come).
    const PlanVersion* newest = job.plans.newest();
    const bool planned = NewestPlanRanksMembers(job);
    if (job.members.empty()) {
      job.plans.set_error(newest == nullptr ? "no worker has joined"
                                            : "the job has no workers");
    } else if (!planned) {
      // A crash between a membership write and its plan's: plan now.
      job.members.set_generation(1);
      job.plans.set_error("re-planning after a restart");
      job.members.AddReason(
          "coordinator restarted: its stored plan was not of its workers");
      replans.push_back({s.name, job.incarnation});
    }
  }
  return replans;
}

}  // namespace coordinator
}  // namespace muonps
