#include "bench/step_cpu/step_report.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "common/statistics.h"

namespace muonps {
namespace bench {
namespace {

double Ms(SteadyTime a, SteadyTime b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Per step of `steps`: ms from the first rank's start to the last rank's
// end. Clears *plan_stable if any rank stepped under another plan version or
// had momentum reset.
std::vector<double> StepSpansMs(const InterleavedRun& run,
                                std::vector<RankStep> TrainerRankResult::*steps,
                                bool* plan_stable) {
  std::vector<double> spans;
  for (size_t s = 0; s < (run.ranks[0].*steps).size(); ++s) {
    SteadyTime first = (run.ranks[0].*steps)[s].start;
    SteadyTime last = (run.ranks[0].*steps)[s].end;
    for (const TrainerRankResult& r : run.ranks) {
      const RankStep& step = (r.*steps)[s];
      first = std::min(first, step.start);
      last = std::max(last, step.end);
      *plan_stable = *plan_stable && step.plan_version == run.plan_version &&
                     step.momentum_reset == 0;
    }
    spans.push_back(Ms(first, last));
  }
  return spans;
}

}  // namespace

nlohmann::ordered_json StepCpuLine(const InterleavedRun& run,
                                   const ReportContext& context) {
  const std::vector<StepMatrix>& matrices = context.matrices;
  const size_t ranks = run.ranks.size();
  const size_t timed = run.ranks[0].timed.size();
  bool plan_stable = true;
  const std::vector<double> step_ms =
      StepSpansMs(run, &TrainerRankResult::timed, &plan_stable);
  const std::vector<double> probe_ms =
      StepSpansMs(run, &TrainerRankResult::probes, &plan_stable);
  std::vector<int64_t> bytes_by_worker;
  std::vector<double> ns_by_worker, worker_step_by_worker;
  for (const TrainerRankResult& r : run.ranks) {
    std::vector<double> bytes, ns, worker_step;
    for (const RankStep& s : r.timed) bytes.push_back(s.bytes_moved);
    for (const RankStep& s : r.probes) {
      ns.push_back(s.ns_seconds * 1e3);
      worker_step.push_back(s.worker_seconds * 1e3);
    }
    // Whole bytes: the same every step unless the plan changed.
    bytes_by_worker.push_back(std::llround(Median(bytes)));
    ns_by_worker.push_back(Median(ns));
    worker_step_by_worker.push_back(Median(worker_step));
  }
  double max_diff = 0, max_param = 0;
  for (size_t i = 0; i < run.peer_final_params.size(); ++i) {
    max_diff = std::max(
        max_diff, std::fabs(static_cast<double>(run.ranks[0].final_params[i]) -
                            run.peer_final_params[i]));
    max_param = std::max(
        max_param, std::fabs(static_cast<double>(run.peer_final_params[i])));
  }
  bool ranks_identical = true;
  for (size_t r = 1; r < ranks; ++r) {
    ranks_identical = ranks_identical &&
                      run.ranks[r].final_params == run.ranks[0].final_params;
  }
  nlohmann::ordered_json algorithms;
  for (const StepMatrix& m : matrices) {
    auto it = run.algorithms.find(m.name);
    algorithms[m.name] = std::string(NsAlgorithmName(
        it == run.algorithms.end() ? NsAlgorithm::kNs5 : it->second));
  }
  const double muonps = Median(step_ms);
  const double one = Median(run.peer_step_seconds) * 1e3;
  nlohmann::ordered_json line;
  line["what"] = "step_cpu";
  line["workers"] = ranks;
  line["trainers"] = ranks;
  line["parameters"] = ParameterCount(matrices);
  line["matrices"] = matrices.size();
  line["widths"] = context.widths;
  line["layout"] = "unreduced";
  line["muonps_step_ms"] = muonps;
  line["one_process_step_ms"] = one;
  line["speedup_vs_one_process"] = one / muonps;
  line["bytes_moved_per_step"] = bytes_by_worker[0];
  line["bytes_moved_per_step_by_worker"] = bytes_by_worker;
  line["ns_ms_per_worker"] =
      *std::max_element(ns_by_worker.begin(), ns_by_worker.end());
  line["ns_ms_by_worker"] = ns_by_worker;
  line["worker_step_ms_by_worker"] = worker_step_by_worker;
  line["probe_step_ms"] = Median(probe_ms);
  line["muonps_step_ms_all"] = step_ms;
  std::vector<double> one_ms;
  for (double s : run.peer_step_seconds) one_ms.push_back(s * 1e3);
  line["one_process_step_ms_all"] = one_ms;
  line["cores"] = std::thread::hardware_concurrency();
  line["worker_openblas_threads"] =
      run.worker_openblas_threads > 0
          ? nlohmann::ordered_json(run.worker_openblas_threads)
          : nlohmann::ordered_json("default");
  line["one_process_openblas_threads"] = openblas_get_num_threads();
  line["ns_algorithms"] = algorithms;
  line["foreign_cpu_fraction"] = run.foreign_cpu_fraction;
  line["plan_version"] = run.plan_version;
  line["plan_stable"] = plan_stable;
  line["warmup_steps"] = context.warmup_steps;
  line["timed_steps"] = timed;
  line["parity_max_abs_diff"] = max_diff;
  line["param_max_abs"] = max_param;
  line["ranks_identical"] = ranks_identical;
  return line;
}

}  // namespace bench
}  // namespace muonps
