// CoordinatorState's durability: loading a JobStore's state, and the write
// queue that makes changes durable outside the mutex, in the order they
// were made.
#include <algorithm>
#include <chrono>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "proto/translate.h"
#include "server/coordinator/coordinator_state.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {

absl::StatusOr<std::unique_ptr<CoordinatorState>> CoordinatorState::Open(
    const CoordinatorOptions& options, std::unique_ptr<JobStore> store,
    Clock clock) {
  MUONPS_ASSIGN_OR_RETURN(const StoredState stored, store->Load());
  std::unique_ptr<CoordinatorState> state(
      new CoordinatorState(options, std::move(clock)));
  state->store_ = std::move(store);
  MUONPS_RETURN_IF_ERROR(state->Restore(stored));
  return state;
}

absl::Status CoordinatorState::store_status() {
  absl::MutexLock lock(&store_mu_);
  return store_failure_;
}

int64_t CoordinatorState::Enqueue(StoreOp op) {
  if (store_ == nullptr) return 0;
  pending_writes_.push_back(std::move(op));
  return ++enqueued_seq_;
}

absl::Status CoordinatorState::Persist(int64_t seq) {
  if (store_ == nullptr) return absl::OkStatus();
  absl::MutexLock writer(&store_mu_);
  if (!store_failure_.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the coordinator's state store failed earlier (",
                     store_failure_.message(), "); it must restart"));
  }
  if (durable_seq_ >= seq) return absl::OkStatus();  // a group commit did
  std::vector<StoreOp> batch;
  int64_t last = 0;
  {
    absl::MutexLock lock(&mu_);
    batch.swap(pending_writes_);
    last = enqueued_seq_;
  }
  const auto start = std::chrono::steady_clock::now();
  absl::Status applied = store_->Apply(batch);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (store_write_observer_) store_write_observer_(seconds, batch.size());
  if (!applied.ok()) {
    store_failure_ = applied;
    spdlog::critical("state store write failed, memory and disk differ: {}",
                     applied.ToString());
    return absl::UnavailableError(
        absl::StrCat("the change is not durable: ", applied.message()));
  }
  durable_seq_ = last;
  return absl::OkStatus();
}

absl::Status CoordinatorState::Restore(const StoredState& stored) {
  // What the coordinator accepted once it keeps, whatever today's limits.
  Limits unlimited;
  for (int64_t* limit : {&unlimited.max_matrices_per_job,
                         &unlimited.max_parameters_per_job, &unlimited.max_dim,
                         &unlimited.max_experts, &unlimited.max_name_bytes}) {
    *limit = std::numeric_limits<int64_t>::max();
  }
  struct Replan {
    std::string job;
    uint64_t incarnation;
  };
  std::vector<Replan> replans;
  int64_t workers = 0;
  {
    absl::MutexLock lock(&mu_);
    version_floors_ = stored.version_floors;
    const absl::Time now = clock_();
    for (const StoredJob& s : stored.jobs) {
      absl::StatusOr<std::vector<scheduler::MatrixSpec>> matrices =
          ValidateJobSpec(s.spec, unlimited);
      if (!matrices.ok()) {
        return absl::DataLossError(absl::StrCat(
            "state store: job ", Quoted(s.name),
            ": stored spec is invalid: ", matrices.status().message()));
      }
      JobRecord& job = jobs_[s.name];
      job.spec = std::make_shared<const v1::JobSpec>(s.spec);
      job.create_request_id = s.create_request_id;
      job.create_time = absl::FromUnixMillis(s.create_time_ms);
      job.job_token = s.job_token;
      job.data_plane_secret = s.data_plane_secret;
      job.incarnation = next_incarnation_++;
      for (const StoredWorker& w : s.workers) {
        WorkerRecord r;
        r.join = w.join;
        if (!w.join.cost_table().empty()) {
          absl::StatusOr<scheduler::CostTable> table =
              scheduler::CostTable::Parse(w.join.cost_table());
          if (table.ok()) {
            r.costs =
                std::make_shared<const scheduler::CostTable>(*std::move(table));
          } else {
            spdlog::warn("job={} worker={} stored cost table ignored: {}",
                         s.name, w.worker_id, table.status().ToString());
          }
        }
        r.join_time = absl::FromUnixMillis(w.join_time_ms);
        // A fresh lease: the members get a lease period to heartbeat again.
        r.lease_expiry = now + options_.lease_ttl;
        r.token = w.token;
        r.join_seq = w.join_seq;
        job.next_join_seq = std::max(job.next_join_seq, w.join_seq + 1);
        job.workers[w.worker_id] = std::move(r);
        job.join_order.push_back(w.worker_id);
      }
      workers += static_cast<int64_t>(s.workers.size());
      auto floor = version_floors_.find(s.name);
      job.latest_version = floor == version_floors_.end() ? 0 : floor->second;
      if (s.plan.has_value()) {
        absl::StatusOr<scheduler::OwnershipPlan> ownership =
            proto::OwnershipFromPlan(s.plan->plan, *matrices);
        if (ownership.ok()) {
          // Whether the job stepped under it is not stored: keep owners.
          job.stepped = true;
          job.plans.push_back({std::make_shared<const v1::Plan>(s.plan->plan),
                               std::make_shared<const scheduler::OwnershipPlan>(
                                   *std::move(ownership)),
                               s.plan->nccl_id, s.plan->nccl_generation});
        } else {
          spdlog::warn("job={} stored plan_version={} dropped: {}", s.name,
                       s.plan->plan.version(), ownership.status().ToString());
        }
        job.latest_version =
            std::max(job.latest_version, s.plan->plan.version());
      }
      job.matrices = std::make_shared<const std::vector<scheduler::MatrixSpec>>(
          *std::move(matrices));
      const std::set<std::string> members(job.join_order.begin(),
                                          job.join_order.end());
      const bool planned =
          !job.plans.empty() &&
          std::set<std::string>(job.plans.back().proto->workers().begin(),
                                job.plans.back().proto->workers().end()) ==
              members;
      if (job.workers.empty()) {
        job.plan_error = job.plans.empty() ? "no worker has joined"
                                           : "the job has no workers";
      } else if (!planned) {
        // A crash between a membership write and its plan's: plan now.
        job.membership_generation = 1;
        job.plan_error = "re-planning after a restart";
        job.pending_reasons.push_back(
            "coordinator restarted: its stored plan was not of its workers");
        replans.push_back({s.name, job.incarnation});
      }
    }
  }
  spdlog::info(
      "state_dir={}: restored {} jobs, {} workers (each with a fresh lease of "
      "{} ms)",
      store_->dir(), stored.jobs.size(), workers,
      absl::ToInt64Milliseconds(options_.lease_ttl));
  for (const Replan& r : replans) {
    MUONPS_RETURN_IF_ERROR(PlanAtLeast(r.job, r.incarnation, 1).status());
  }
  return absl::OkStatus();
}

}  // namespace coordinator
}  // namespace muonps
