#include "server/coordinator/plan_computation.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_join.h"
#include "scheduler/planner.h"
#include "scheduler/step_schedule.h"

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

PlanSnapshot SnapshotForPlanning(const std::string& name,
                                 const JobRecord& job) {
  PlanSnapshot s;
  s.job = name;
  s.version = job.plans.latest_version() + 1;
  s.matrices = job.matrices;
  const MuonSettings& muon = job.spec->muon;
  s.ns_steps = muon.ns_steps > 0 ? muon.ns_steps : 5;
  s.algorithm = muon.ns_algorithm.value_or(scheduler::AlgorithmPolicy::kAuto);
  s.bucket_bytes =
      job.spec->bucket_bytes > 0 ? job.spec->bucket_bytes : int64_t{64} << 20;
  for (const bool want_dedicated : {false, true}) {
    for (const std::string& id : job.members.join_order()) {
      const WorkerRecord& w = job.members.at(id);
      if (w.join.dedicated != want_dedicated) continue;
      s.dedicated += want_dedicated ? 1 : 0;
      scheduler::WorkerSpec spec;
      spec.id = id;
      spec.costs = w.costs;
      spec.rates = RatesFor(w.join.device);
      spec.speed = w.join.speed > 0 ? w.join.speed : 1.0;
      spec.memory_bytes = w.join.device.memory_bytes;
      spec.colocated = w.join.device.colocated;
      spec.owns_nothing = w.draining;
      s.workers.push_back(std::move(spec));
    }
  }
  const PlanVersion* newest = job.plans.newest();
  s.previous = newest == nullptr ? nullptr : newest->plan;
  // Afresh only for the start-up: workers joining before any step. Once a
  // worker of the previous version is gone, or a step ran, owners stay.
  s.keep_owners = job.stepped;
  if (s.previous != nullptr) {
    for (const std::string& id : s.previous->ownership.worker_ids) {
      if (!job.members.contains(id)) s.keep_owners = true;
    }
  }
  s.reason = job.members.reasons().empty()
                 ? std::string("re-plan")
                 : absl::StrJoin(job.members.reasons(), "; ");
  return s;
}

absl::StatusOr<std::shared_ptr<const PublishedPlan>> ComputePlan(
    const PlanSnapshot& s) {
  scheduler::PlanInput input;
  input.matrices = *s.matrices;
  input.options.ns_steps = s.ns_steps;
  input.options.algorithm = s.algorithm;
  input.workers = s.workers;
  int64_t smallest = 0;
  for (const scheduler::WorkerSpec& w : s.workers) {
    if (w.owns_nothing) continue;
    smallest =
        smallest == 0 ? w.memory_bytes : std::min(smallest, w.memory_bytes);
  }
  // Work buffers: 2 GiB, or an eighth of the smallest worker's memory.
  input.options.workspace_bytes =
      std::min<int64_t>(int64_t{2} << 30, smallest / 8);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<scheduler::OwnershipPlan> plan =
      s.previous == nullptr ? scheduler::PlanOwnership(input)
      : s.keep_owners       ? scheduler::Replan(input, s.previous->ownership)
                      : scheduler::PlanAfresh(input, s.previous->ownership);
  if (!plan.ok()) return plan.status();
  plan->dedicated = s.dedicated;
  absl::StatusOr<scheduler::StepSchedule> schedule =
      scheduler::BuildStepSchedule(*s.matrices, *plan,
                                   {.bucket_bytes = s.bucket_bytes});
  const double plan_ms = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - start)
                             .count();
  if (!schedule.ok()) return schedule.status();
  auto out = std::make_shared<PublishedPlan>();
  out->job = s.job;
  out->version = s.version;
  out->reason = s.reason;
  out->plan_ms = plan_ms;
  out->matrices = s.matrices;
  out->ownership = *std::move(plan);
  out->buckets = BucketsOf(*schedule);
  return out;
}

}  // namespace coordinator
}  // namespace muonps
