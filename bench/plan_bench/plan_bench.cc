// bench/plan_bench: plans real and synthetic models and prints one JSON line
// per case: plan_ms, the plan's predicted max over the lower bound, and the
// same ratio for FLOP-LPT (DMuon) and size-sorted round-robin
// (KellerJordan/Muon, DeepSpeed ZeRO-3) evaluated with the same cost model
// in the same process. The re-plan case adds moved_bytes_fraction: momentum
// bytes moved over the bytes the lost worker owned. schedule_ms is what the
// coordinator adds to every plan: its step schedule, with the bucket bound
// chosen by the predicted step when the workers span several nodes (8 to a
// node here; scheduler/step_clock.h); bucket_bytes is the bound.
// topology_ms is the whole of it as the coordinator now runs it
// (scheduler::PlanOnTopology): where owner groups are on offer, the plan of
// one group's workers (groups of 1, 2, ... whole nodes) for each grouping
// tried, clocked as that group alone, and the plan of every worker,
// scheduled and clocked (the groupings on a second thread), the winner
// scheduled over all its groups; owner_groups_offered /
// owner_groups_taken say what happened, groupings_tried how many groupings
// were weighed (planned, or passed over by their step's lower bound).
// topology_again_ms is the same run again in the same process (a running
// coordinator's next plan of the job, on the memory the first one freed).
// `plan_bench NAME` runs only the cases whose name contains NAME (for a
// profiler); the re-plan case's name is llama3_8b_w64_lose_1.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/planner_malloc.h"
#include "nlohmann/json.hpp"
#include "scheduler/model_shapes.h"
#include "scheduler/planner.h"
#include "scheduler/step_clock.h"

namespace muonps {
namespace {

using scheduler::OwnershipPlan;
using scheduler::PlanInput;

std::vector<scheduler::WorkerSpec> Workers(int count, int64_t memory_bytes,
                                           bool half_slow = false) {
  std::vector<scheduler::WorkerSpec> out(count);
  for (int i = 0; i < count; ++i) {
    out[i].id = absl::StrCat("worker-", i);
    out[i].memory_bytes = memory_bytes;
    if (half_slow && i % 2 == 1) out[i].speed = 0.5;
  }
  return out;
}

// Cases to run: those whose name contains it.
std::string only;

double Ms(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - start)
      .count();
}

// Plans `input` with muonps and both peers; prints the case line and
// returns muonps's plan.
OwnershipPlan RunCase(const std::string& name, const PlanInput& input) {
  if (name.find(only) == std::string::npos) return OwnershipPlan();
  const auto start = std::chrono::steady_clock::now();
  const absl::StatusOr<OwnershipPlan> plan = scheduler::PlanOwnership(input);
  const double plan_ms = Ms(start);
  if (!plan.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(),
                 plan.status().ToString().c_str());
    std::exit(1);
  }
  // The coordinator's next part of a plan: its step schedule.
  const scheduler::CostModel model(nullptr, scheduler::DeviceRates{}, 1.0, 5);
  const std::vector<const scheduler::CostModel*> models(input.workers.size(),
                                                        &model);
  scheduler::ClockSettings settings;
  settings.topology =
      scheduler::Topology::Blocks(static_cast<int>(input.workers.size()), 8);
  // As the coordinator clocks: applies before the votes where faster.
  settings.apply_early = true;
  const auto schedule_start = std::chrono::steady_clock::now();
  const absl::StatusOr<scheduler::StepGrouping> grouping =
      scheduler::ChooseStepGrouping(input.matrices, *plan, models, settings);
  const double schedule_ms = Ms(schedule_start);
  if (!grouping.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(),
                 grouping.status().ToString().c_str());
    std::exit(1);
  }
  // The whole of what the coordinator does for these workers
  // (scheduler::PlanOnTopology): where owner groups are on offer (every
  // matrix replicated on several nodes of 8), both plans, each scheduled
  // and clocked, the grouped one on a second thread.
  const std::vector<scheduler::OwnerGrouping> offered =
      scheduler::ChooseOwnerGroupings(input.matrices, settings.topology,
                                      static_cast<int>(input.workers.size()),
                                      /*dedicated=*/0);
  std::vector<std::string> ids;
  for (const scheduler::WorkerSpec& w : input.workers) ids.push_back(w.id);
  const auto on_topology = [&] {
    return scheduler::PlanOnTopology(
        input.matrices, ids, /*dedicated=*/0, models, settings,
        {.bucket_bytes = 0}, offered, scheduler::OwnerGroupsUse::kWeighed,
        [&](const std::vector<int32_t>& ranks,
            const scheduler::OwnerGrouping* /*grouping*/,
            bool /*experts_at_holders: no trainer shards here*/) {
          PlanInput some{input.matrices, {}, input.options};
          for (const int32_t r : ranks)
            some.workers.push_back(input.workers[r]);
          // As the coordinator plans: the ranks' nodes known.
          some.nodes = settings.topology.NodesOf(ranks);
          return scheduler::PlanOwnership(some);
        });
  };
  const auto topology_start = std::chrono::steady_clock::now();
  const absl::StatusOr<scheduler::TopologyPlan> planned = on_topology();
  const double topology_ms = Ms(topology_start);
  // The same again in this process: a running coordinator's next plan of
  // the job, with the memory the first one freed.
  const auto again_start = std::chrono::steady_clock::now();
  const absl::StatusOr<scheduler::TopologyPlan> again = on_topology();
  const double topology_again_ms = Ms(again_start);
  if (!planned.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(),
                 planned.status().ToString().c_str());
    std::exit(1);
  }
  if (!again.ok() || again->plan.max_seconds != planned->plan.max_seconds ||
      again->grouping.bucket_bytes != planned->grouping.bucket_bytes) {
    std::fprintf(stderr, "%s: planned again, the plan differs\n", name.c_str());
    std::exit(1);
  }
  const OwnershipPlan lpt = *scheduler::PlanFlopLpt(input);
  const OwnershipPlan rr = *scheduler::PlanRoundRobin(input);
  int64_t items = 0;
  for (const auto& m : input.matrices) items += m.experts;
  nlohmann::ordered_json line;
  line["what"] = "plan";
  line["case"] = name;
  line["matrices"] = items;
  line["workers"] = input.workers.size();
  line["plan_ms"] = plan_ms;
  line["schedule_ms"] = schedule_ms;
  line["nodes"] = settings.topology.nodes();
  line["bucket_bytes"] = grouping->bucket_bytes;
  line["topology_ms"] = topology_ms;
  line["topology_again_ms"] = topology_again_ms;
  line["owner_groups_offered"] = !offered.empty();
  line["owner_groups_taken"] = !planned->plan.groups.empty();
  line["groupings_tried"] = planned->weighed.grouped_candidates.size();
  // The predicted steps weighed: each grouping's (0: passed over by its
  // bound, unplanned), the plan of every worker's, and the chosen one's
  // applies (before the votes, or at the commit).
  nlohmann::ordered_json tried = nlohmann::ordered_json::array();
  for (const auto& [members, seconds] : planned->weighed.grouped_candidates) {
    tried.push_back({{"group_size", members}, {"predicted_ms", seconds * 1e3}});
  }
  line["grouped_candidates"] = tried;
  line["ungrouped_ms"] = planned->weighed.ungrouped_seconds * 1e3;
  // Exchange nodes: weighed (unreduced or row_sharded matrices across
  // nodes), passed over by their least step, taken.
  line["exchange_offered"] = planned->weighed.exchange_offered;
  line["exchange_passed_over"] = planned->weighed.exchange_passed_over;
  line["exchange_taken"] = !planned->plan.exchange_nodes.empty();
  line["applied_before_votes"] = !planned->weighed.apply_at_commit &&
                                 planned->weighed.before_votes_seconds > 0;
  line["max_ms"] = plan->max_seconds * 1e3;
  line["lower_bound_ms"] = plan->lower_bound * 1e3;
  line["max_over_lower_bound"] = plan->max_seconds / plan->lower_bound;
  line["imbalance"] = plan->imbalance;
  line["flop_lpt_max_over_lower_bound"] = lpt.max_seconds / plan->lower_bound;
  line["round_robin_max_over_lower_bound"] = rr.max_seconds / plan->lower_bound;
  line["speedup_vs_flop_lpt"] = lpt.max_seconds / plan->max_seconds;
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
  return *plan;
}

void Run() {
  constexpr int64_t kH200 = int64_t{140} << 30;
  for (const int workers : {2, 8, 64}) {
    RunCase(absl::StrCat("llama3_8b_w", workers),
            {scheduler::Llama3_8B(), Workers(workers, kH200), {}});
  }
  for (const int workers : {64, 256}) {
    RunCase(absl::StrCat("deepseek_v3_like_w", workers),
            {scheduler::DeepSeekV3Like(), Workers(workers, kH200), {}});
  }
  RunCase("llama3_8b_w8_half_at_0.5x",
          {scheduler::Llama3_8B(), Workers(8, kH200, true), {}});
  RunCase("deepseek_v3_like_w64_half_at_0.5x",
          {scheduler::DeepSeekV3Like(), Workers(64, kH200, true), {}});
  RunCase("random_1e5_matrices_w1000",
          {scheduler::RandomShapes(100000, 7), Workers(1000, kH200), {}});
  // The same, every matrix replicated: 125 nodes of 8 offer owner groups,
  // so the coordinator plans 8 workers and 1000.
  std::vector<scheduler::MatrixSpec> replicated =
      scheduler::RandomShapes(100000, 7);
  for (scheduler::MatrixSpec& m : replicated) {
    m.layout = scheduler::Layout::kReplicated;
  }
  RunCase("random_1e5_replicated_matrices_w1000",
          {std::move(replicated), Workers(1000, kH200), {}});

  // Re-plan after losing one of 64 workers.
  if (std::string("llama3_8b_w64_lose_1").find(only) == std::string::npos) {
    return;
  }
  const PlanInput before{scheduler::Llama3_8B(), Workers(64, kH200), {}};
  const OwnershipPlan first = *scheduler::PlanOwnership(before);
  PlanInput after = before;
  const int lost = 17;
  after.workers.erase(after.workers.begin() + lost);
  const auto start = std::chrono::steady_clock::now();
  const OwnershipPlan replanned = *scheduler::Replan(after, first);
  const double replan_ms = Ms(start);
  const OwnershipPlan fresh = *scheduler::PlanOwnership(after);
  nlohmann::ordered_json line;
  line["what"] = "replan";
  line["case"] = "llama3_8b_w64_lose_1";
  line["matrices"] = first.matrix_names.size();
  line["workers"] = after.workers.size();
  line["plan_ms"] = replan_ms;
  line["max_over_lower_bound"] = replanned.max_seconds / replanned.lower_bound;
  line["max_over_fresh_plan"] = replanned.max_seconds / fresh.max_seconds;
  line["moved_bytes"] = replanned.moved_bytes;
  line["lost_worker_bytes"] = first.worker_momentum_bytes[lost];
  line["moved_bytes_fraction"] =
      static_cast<double>(replanned.moved_bytes) /
      static_cast<double>(first.worker_momentum_bytes[lost]);
  std::printf("%s\n", line.dump().c_str());
}

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  // As the coordinator plans: glibc's malloc tuned as
  // common/planner_malloc.h says (GLIBC_TUNABLES=glibc.malloc.hugetlb=0
  // measures with glibc's defaults).
  muonps::RestartWithPlannerMalloc(argv);
  if (argc > 1) muonps::only = argv[1];
  muonps::Run();
  return 0;
}
