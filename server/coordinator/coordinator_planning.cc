// CoordinatorState's planning: a copy of a job's membership is planned
// outside the mutex (one planner per job at a time), and the plan published
// under it only if the membership it was computed from is still current.
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "scheduler/planner.h"
#include "scheduler/step_schedule.h"
#include "server/coordinator/coordinator_state.h"
#include "server/coordinator/plan_proto.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {
namespace {

// What the planner assumes for a device nobody measured.
scheduler::DeviceRates RatesFor(const v1::Device& device) {
  scheduler::DeviceRates rates;
  if (device.kind() == "cpu") {
    rates.flops_per_second = 1e11;
    rates.memory_bytes_per_second = 2e10;
    rates.call_overhead_seconds = 1e-5;
    rates.link_bytes_per_second = 1e9;
  }
  return rates;
}

scheduler::AlgorithmPolicy PolicyOf(const v1::MuonHyperparameters& h) {
  switch (h.ns_algorithm()) {
    case v1::NS_ALGORITHM_NS5:
      return scheduler::AlgorithmPolicy::kNs5;
    case v1::NS_ALGORITHM_GRAM:
      return scheduler::AlgorithmPolicy::kGram;
    default:
      return scheduler::AlgorithmPolicy::kAuto;
  }
}

}  // namespace

CoordinatorState::PlanSnapshot CoordinatorState::SnapshotForPlanning(
    const std::string& name, const JobRecord& job) const {
  PlanSnapshot s;
  s.job = name;
  s.version = job.latest_version + 1;
  s.matrices = job.matrices;
  const v1::MuonHyperparameters& muon = job.spec->muon();
  s.ns_steps = muon.ns_steps() > 0 ? muon.ns_steps() : 5;
  s.algorithm = PolicyOf(muon);
  s.bucket_bytes = job.spec->bucket_bytes() > 0 ? job.spec->bucket_bytes()
                                                : int64_t{64} << 20;
  // Ranks: workers with trainers in join order, then dedicated ones.
  for (const bool want_dedicated : {false, true}) {
    for (const std::string& id : job.join_order) {
      const WorkerRecord& w = job.workers.at(id);
      if (w.join.dedicated() != want_dedicated) continue;
      s.dedicated += want_dedicated ? 1 : 0;
      scheduler::WorkerSpec spec;
      spec.id = id;
      spec.costs = w.costs;
      spec.rates = RatesFor(w.join.device());
      spec.speed = w.join.speed() > 0 ? w.join.speed() : 1.0;
      spec.memory_bytes = w.join.device().memory_bytes();
      spec.colocated = w.join.device().colocated();
      s.workers.push_back(std::move(spec));
    }
  }
  s.previous = job.plans.empty() ? nullptr : job.plans.back().plan;
  // Afresh only for the start-up: workers joining before any step. Once a
  // worker of the previous version is gone, or a step ran, owners stay.
  s.keep_owners = job.stepped;
  if (s.previous != nullptr) {
    for (const std::string& id : s.previous->worker_ids) {
      if (job.workers.count(id) == 0) s.keep_owners = true;
    }
  }
  s.reason = job.pending_reasons.empty()
                 ? std::string("re-plan")
                 : absl::StrJoin(job.pending_reasons, "; ");
  return s;
}

CoordinatorState::PlanOutcome CoordinatorState::ComputePlan(
    const PlanSnapshot& s) {
  PlanOutcome out;
  scheduler::PlanInput input;
  input.matrices = *s.matrices;
  input.options.ns_steps = s.ns_steps;
  input.options.algorithm = s.algorithm;
  input.workers = s.workers;
  int64_t smallest = 0;
  for (const scheduler::WorkerSpec& w : s.workers) {
    smallest =
        smallest == 0 ? w.memory_bytes : std::min(smallest, w.memory_bytes);
  }
  // Work buffers: 2 GiB, or an eighth of the smallest worker's memory.
  input.options.workspace_bytes =
      std::min<int64_t>(int64_t{2} << 30, smallest / 8);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<scheduler::OwnershipPlan> plan =
      s.previous == nullptr ? scheduler::PlanOwnership(input)
      : s.keep_owners       ? scheduler::Replan(input, *s.previous)
                            : scheduler::PlanAfresh(input, *s.previous);
  if (plan.ok()) plan->dedicated = s.dedicated;
  absl::StatusOr<scheduler::StepSchedule> schedule =
      plan.ok() ? scheduler::BuildStepSchedule(*s.matrices, *plan,
                                               {.bucket_bytes = s.bucket_bytes})
                : absl::StatusOr<scheduler::StepSchedule>(plan.status());
  const double plan_ms = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - start)
                             .count();
  if (!schedule.ok()) {
    out.status = schedule.status();
    return out;
  }
  out.proto =
      std::make_shared<v1::Plan>(PlanToProto({.job = s.job,
                                              .version = s.version,
                                              .reason = s.reason,
                                              .plan_ms = plan_ms},
                                             *s.matrices, *plan, *schedule));
  out.plan = std::make_shared<scheduler::OwnershipPlan>(*std::move(plan));
  return out;
}

CoordinatorState::JobRecord* CoordinatorState::FindIncarnation(
    const std::string& name, uint64_t incarnation) {
  auto it = jobs_.find(name);
  return it == jobs_.end() || it->second.incarnation != incarnation
             ? nullptr
             : &it->second;
}

absl::StatusOr<int64_t> CoordinatorState::PlanAtLeast(const std::string& name,
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
      absl::MutexLock lock(&mu_);
      JobRecord* job = FindIncarnation(name, incarnation);
      // One planner per job: the others wait for what it publishes.
      while (job != nullptr && job->planned_generation < generation &&
             job->planning) {
        plan_changed_.Wait(&mu_);
        job = FindIncarnation(name, incarnation);
      }
      if (job == nullptr) return deleted();
      if (job->planned_generation >= generation) return job->latest_version;
      planned = job->membership_generation;
      if (job->workers.empty()) {
        job->plan_error = "the job has no workers";
        job->planned_generation = planned;
        job->pending_reasons.clear();
        plan_changed_.SignalAll();
        continue;
      }
      job->planning = true;
      snapshot = SnapshotForPlanning(name, *job);
      reasons = job->pending_reasons.size();
    }
    PlanOutcome outcome = ComputePlan(snapshot);
    int64_t seq = 0;
    {
      absl::MutexLock lock(&mu_);
      JobRecord* job = FindIncarnation(name, incarnation);
      if (job == nullptr) {
        plan_changed_.SignalAll();
        return deleted();
      }
      if (job->membership_generation != planned) {  // stale: plan again
        job->planning = false;
        plan_changed_.SignalAll();
        continue;
      }
      if (!outcome.status.ok()) {
        job->plan_error = std::string(outcome.status.message());
        job->planned_generation = planned;
        job->pending_reasons.erase(job->pending_reasons.begin(),
                                   job->pending_reasons.begin() + reasons);
        job->planning = false;
        plan_changed_.SignalAll();
        spdlog::warn("job={} cannot be planned ({}): {}", name, snapshot.reason,
                     job->plan_error);
        continue;
      }
      seq = Enqueue(store_op::PutPlan{name, outcome.proto, "", 0});
    }
    // Durable before anyone can see it, so no restart takes it back.
    const absl::Status persisted = Persist(seq);
    absl::MutexLock lock(&mu_);
    JobRecord* job = FindIncarnation(name, incarnation);
    if (job == nullptr) {
      plan_changed_.SignalAll();
      return deleted();
    }
    job->planning = false;
    plan_changed_.SignalAll();
    if (!persisted.ok()) return persisted;
    const scheduler::OwnershipPlan& plan = *outcome.plan;
    spdlog::info(
        "job={} plan_version={} ({}): {} workers, max {:.3f} ms, imbalance "
        "{:.4f}, moved {} bytes, planned in {:.1f} ms",
        name, snapshot.version, snapshot.reason, plan.worker_ids.size(),
        plan.max_seconds * 1e3, plan.imbalance, plan.moved_bytes,
        outcome.proto->plan_ms());
    job->plans.push_back({outcome.proto, outcome.plan, "", 0});
    while (static_cast<int>(job->plans.size()) > options_.plan_history) {
      job->plans.pop_front();
    }
    job->latest_version = snapshot.version;
    job->plan_error.clear();
    job->planned_generation = planned;
    job->pending_reasons.erase(job->pending_reasons.begin(),
                               job->pending_reasons.begin() + reasons);
    ++published_versions_;
  }
}

}  // namespace coordinator
}  // namespace muonps
