#include "bench/scale_sim/scale_sim.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "scheduler/cost_model.h"
#include "scheduler/planner.h"

namespace muonps {
namespace bench {
namespace {

using scheduler::MatrixSpec;

std::string WorkerId(int rank) { return absl::StrCat("gpu-", rank); }

// Rates the planner accepts must be finite; an infinite link (a test's
// "free transfers") becomes a very fast one.
constexpr double kFastestLink = 1e18;

// All-reduce of `elements` in `collectives` calls: a ring's bandwidth term
// (2 (N-1) / N of the bytes through every rank, split over NVLink and NIC
// as for reduce and broadcast) with a tree's fill, 2 log2(N) hops per call
// (NCCL has trees for all-reduce, not for reduce or broadcast).
double AllReduceSeconds(const SimConfig& config, int64_t collectives,
                        double elements) {
  const int n = config.gpus;
  if (n == 1) return 0;
  const int g = std::min(n, config.gpus_per_node);
  const double bytes =
      2.0 * (n - 1) / n * elements * config.wire_bytes_per_element;
  const double nvlink = n <= g ? bytes : bytes * (g - 1) / g;
  const double nic = n <= g ? 0 : bytes / g;
  const LinkFigures& l = config.links;
  return collectives *
             (l.latency_us + 2.0 * std::ceil(std::log2(n)) * l.hop_latency_us) *
             1e-6 +
         std::max(nvlink / (l.nvlink_gbs * 1e9),
                  nic / (l.inter_node_gbs * 1e9));
}

// Every worker's device: the cost table's, linked at the NVLink rate.
scheduler::DeviceRates RatesOf(const SimConfig& config) {
  scheduler::DeviceRates rates;
  rates.link_bytes_per_second =
      std::min(config.links.nvlink_gbs * 1e9, kFastestLink);
  return rates;
}

// The planner's input for the workers `ranks` (one owner group's).
scheduler::PlanInput MakePlanInput(const SimConfig& config,
                                   const std::vector<int32_t>& ranks) {
  scheduler::PlanInput input;
  input.matrices = config.matrices;
  input.options = config.plan;
  for (const int32_t w : ranks) {
    scheduler::WorkerSpec spec;
    spec.id = WorkerId(w);
    spec.costs = config.costs;
    spec.speed = 1.0 / config.cost_scale;
    spec.rates = RatesOf(config);
    spec.memory_bytes = config.gpu_memory_bytes;
    input.workers.push_back(std::move(spec));
  }
  return input;
}

scheduler::ClockSettings ClockSettingsOf(const SimConfig& config) {
  scheduler::ClockSettings s;
  s.topology = scheduler::Topology::Blocks(config.gpus, config.gpus_per_node);
  s.topology.links = config.links;
  s.wire_bytes_per_element = config.wire_bytes_per_element;
  s.update_bytes_per_element = config.update_bytes_per_element;
  s.hbm_bytes_per_second = config.hbm_bytes_per_second;
  s.control_rounds_ms = config.control_rounds_ms;
  s.agreement_ms = config.agreement_ms;
  s.transfer_contention = config.transfer_contention;
  s.peer_writes = config.peer_writes;
  s.apply_early = config.apply_early;
  s.node_exchange = config.node_exchange;
  s.capacity_bytes.assign(
      config.gpus, config.gpu_memory_bytes - config.plan.workspace_bytes);
  // Trainer r is the trainer of rank r: it holds shard r of its replica
  // group.
  const bool hsdp =
      config.hsdp_shard_gpus > 0 && config.hsdp_shard_gpus < config.gpus;
  s.trainer_shards.shards = hsdp ? config.hsdp_shard_gpus : config.gpus;
  for (int r = 0; r < config.gpus; ++r) {
    s.trainer_shards.shard_of.push_back(r % s.trainer_shards.shards);
  }
  return s;
}

}  // namespace

absl::StatusOr<SimResult> SimulateStep(const SimConfig& config) {
  MUONPS_RETURN_IF_ERROR(ValidateSimConfig(config));
  const scheduler::ClockSettings settings = ClockSettingsOf(config);
  // Every worker has the same device.
  const scheduler::CostModel model(config.costs, RatesOf(config),
                                   1.0 / config.cost_scale,
                                   config.plan.ns_steps);
  const std::vector<const scheduler::CostModel*> models(config.gpus, &model);
  // The plan as the coordinator makes it (see the header): a job of HSDP
  // replica groups gets one owner group per replica group, required;
  // others the groupings on offer, weighed.
  const bool hsdp =
      config.hsdp_shard_gpus > 0 && config.hsdp_shard_gpus < config.gpus;
  std::vector<scheduler::OwnerGrouping> offered;
  if (hsdp) {
    scheduler::OwnerGrouping replicas(config.gpus / config.hsdp_shard_gpus);
    for (int r = 0; r < config.gpus; ++r) {
      replicas[r / config.hsdp_shard_gpus].push_back(r);
    }
    offered.push_back(std::move(replicas));
  } else if (config.owner_groups) {
    offered = scheduler::ChooseOwnerGroupings(
        config.matrices, settings.topology, config.gpus, /*dedicated=*/0);
  }
  std::vector<std::string> ids;
  ids.reserve(config.gpus);
  for (int w = 0; w < config.gpus; ++w) ids.push_back(WorkerId(w));
  absl::StatusOr<scheduler::TopologyPlan> planned = scheduler::PlanOnTopology(
      config.matrices, ids, /*dedicated=*/0, models, settings, config.schedule,
      offered,
      hsdp ? scheduler::OwnerGroupsUse::kRequired
           : scheduler::OwnerGroupsUse::kWeighed,
      [&](const std::vector<int32_t>& ranks,
          const scheduler::OwnerGrouping* /*grouping*/,
          bool experts_at_holders) {
        scheduler::PlanInput input = MakePlanInput(config, ranks);
        input.trainer_shards = settings.trainer_shards.Among(ranks);
        input.nodes = settings.topology.NodesOf(ranks);
        input.options.experts_at_holders = experts_at_holders;
        return scheduler::PlanOwnership(input);
      });
  if (!planned.ok()) return Annotate(planned.status(), "planner");
  const scheduler::OwnershipPlan& plan = planned->plan;

  SimResult result;
  result.bucket_bytes = planned->grouping.bucket_bytes;
  result.bucket_candidates = planned->grouping.candidates;
  result.weighed = planned->weighed;
  result.exchange_taken = !plan.exchange_nodes.empty();
  if (result.weighed.exchange_passed_over) {
    // Passed over by its least step: the step it would have taken.
    scheduler::OwnershipPlan with = plan;
    with.exchange_nodes = scheduler::ChooseExchangeNodes(
        config.matrices, settings.topology, config.gpus, /*dedicated=*/0);
    absl::StatusOr<scheduler::StepGrouping> exchange =
        scheduler::ChooseStepGrouping(config.matrices, with, models, settings,
                                      config.schedule);
    if (!exchange.ok()) return Annotate(exchange.status(), "the exchange");
    result.exchange_clocked_seconds =
        exchange->predicted_seconds > 0
            ? exchange->predicted_seconds
            : scheduler::ClockStep(
                  config.matrices, exchange->schedule,
                  scheduler::StackSeconds(config.matrices, exchange->schedule,
                                          models, settings),
                  config.gpus, settings)
                  .predicted_seconds;
  }
  // A grouped plan's schedule is its first group's: the whole job's is
  // clocked here, cut at the same bound.
  const scheduler::StepSchedule* schedule = &planned->grouping.schedule;
  scheduler::StepSchedule whole;
  if (!plan.groups.empty()) {
    scheduler::ScheduleOptions cut = config.schedule;
    cut.bucket_bytes = planned->grouping.bucket_bytes;
    absl::StatusOr<scheduler::StepSchedule> built =
        scheduler::BuildStepSchedule(config.matrices, plan, cut);
    if (!built.ok()) return Annotate(built.status(), "the grouped schedule");
    whole = *std::move(built);
    schedule = &whole;
  }
  const std::vector<double> stack_seconds =
      scheduler::StackSeconds(config.matrices, *schedule, models, settings);
  const int n = config.gpus;
  // The whole job's step: its control rounds pass along the control tree
  // (the plans above were weighed without them, as the coordinator weighs
  // them).
  scheduler::ClockSettings job = settings;
  job.control_message_us = config.control_message_us;
  job.control_tree_fanout = config.control_tree_fanout;
  scheduler::StepClock clock =
      scheduler::ClockStep(config.matrices, *schedule, stack_seconds, n, job);

  result.clock = std::move(clock);

  const std::vector<double>& c = result.clock.worker_compute_seconds;
  result.compute_seconds_max = *std::max_element(c.begin(), c.end());
  result.compute_seconds_mean = std::accumulate(c.begin(), c.end(), 0.0) / n;
  result.imbalance =
      result.compute_seconds_mean > 0
          ? result.compute_seconds_max / result.compute_seconds_mean
          : 1.0;
  for (const MatrixSpec& m : config.matrices) {
    result.parameters += m.rows * m.cols * m.experts;
  }
  result.owning_workers = static_cast<int>(
      std::count_if(c.begin(), c.end(), [](double s) { return s > 0; }));
  result.owner_groups =
      plan.groups.empty() ? 1 : static_cast<int>(plan.groups.size());
  result.group_size =
      plan.groups.empty() ? n : static_cast<int>(plan.groups.front().size());
  result.plan_max_seconds = plan.max_seconds;
  result.adamw_data_parallel_seconds = config.adamw_reference_ms * 1e-3 *
                                       static_cast<double>(result.parameters) /
                                       config.adamw_reference_params;
  result.adamw_sharded_seconds = result.adamw_data_parallel_seconds / n;
  result.allreduce_seconds =
      AllReduceSeconds(config, static_cast<int64_t>(schedule->buckets.size()),
                       static_cast<double>(result.parameters));
  return result;
}

}  // namespace bench
}  // namespace muonps
