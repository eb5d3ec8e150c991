#include "bench/scale_sim/scale_sim.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "scheduler/cost_model.h"
#include "scheduler/planner.h"

namespace muonps {
namespace bench {
namespace {

using scheduler::MatrixSpec;
using scheduler::Transfer;
using scheduler::TransferKind;

// Rates the planner accepts must be finite; an infinite link (a test's
// "free transfers") becomes a very fast one.
constexpr double kFastestLink = 1e18;

// Wire bytes each rank moves in one phase, over NVLink and over its NIC.
struct RankBytes {
  double nvlink_sent = 0, nvlink_received = 0;
  double nic_sent = 0, nic_received = 0;
};

// Accumulates the transfers of one grouped phase (see the header's model)
// and clocks it.
class Phase {
 public:
  Phase(const SimConfig& config, std::vector<RankBytes>* totals)
      : config_(config),
        n_(config.gpus),
        g_(std::min(config.gpus, config.gpus_per_node)),
        ranks_(config.gpus),
        totals_(*totals) {}

  void Add(const Transfer& x, const MatrixSpec& spec) {
    if (n_ == 1) return;  // NCCL with one rank moves nothing
    ++messages_;
    const bool update = x.kind == TransferKind::kBroadcastFromOwner ||
                        x.kind == TransferKind::kScatterFromOwner;
    const double s =
        static_cast<double>(spec.rows * spec.cols *
                            (update ? config_.update_bytes_per_element
                                    : config_.wire_bytes_per_element));
    switch (x.kind) {
      case TransferKind::kReduceToOwner:
      case TransferKind::kBroadcastFromOwner: {
        ring_ = true;
        // A reduce's NVLink part runs at its own rate (reduce_gbs).
        double& nvlink = x.kind == TransferKind::kReduceToOwner
                             ? ring_reduce_nvlink_
                             : ring_nvlink_;
        if (n_ <= g_) {
          nvlink += s;
        } else {
          nvlink += s * (g_ - 1) / g_;
          ring_nic_ += s / g_;
        }
        break;
      }
      case TransferKind::kGatherToOwner:
      case TransferKind::kScatterFromOwner: {
        const bool in = x.kind == TransferKind::kGatherToOwner;
        const double part = s / n_;
        for (int r = 0; r < n_; ++r) {
          if (r != x.owner) Move(in ? r : x.owner, in ? x.owner : r, part);
        }
        break;
      }
      case TransferKind::kSendToOwner:
        Move(0, x.owner, s);
        break;
    }
  }

  // Seconds of the phase (0 with no transfers); adds its bytes to the
  // totals and its latency to `*latency_seconds`.
  double Finish(double* latency_seconds) {
    if (messages_ == 0) return 0;
    const LinkFigures& l = config_.links;
    double latency = messages_ * l.latency_us * 1e-6;
    if (ring_) latency += (n_ - 1) * l.hop_latency_us * 1e-6;
    double bandwidth_seconds = 0;
    const double reduce_gbs = l.reduce_gbs > 0 ? l.reduce_gbs : l.nvlink_gbs;
    const double ring = ring_nvlink_ + ring_reduce_nvlink_;
    for (int r = 0; r < n_; ++r) {
      const RankBytes& b = ranks_[r];
      const double nvlink_seconds =
          (ring_nvlink_ + std::max(b.nvlink_sent, b.nvlink_received)) /
              (l.nvlink_gbs * 1e9) +
          ring_reduce_nvlink_ / (reduce_gbs * 1e9);
      const double nic = ring_nic_ + std::max(b.nic_sent, b.nic_received);
      bandwidth_seconds = std::max(
          {bandwidth_seconds, nvlink_seconds, nic / (l.inter_node_gbs * 1e9)});
      RankBytes& t = totals_[r];
      t.nvlink_sent += ring + b.nvlink_sent;
      t.nvlink_received += ring + b.nvlink_received;
      t.nic_sent += ring_nic_ + b.nic_sent;
      t.nic_received += ring_nic_ + b.nic_received;
    }
    *latency_seconds += latency;
    return latency + bandwidth_seconds;
  }

 private:
  void Move(int from, int to, double bytes) {
    if (from / config_.gpus_per_node == to / config_.gpus_per_node) {
      ranks_[from].nvlink_sent += bytes;
      ranks_[to].nvlink_received += bytes;
    } else {
      ranks_[from].nic_sent += bytes;
      ranks_[to].nic_received += bytes;
    }
  }

  const SimConfig& config_;
  const int n_;
  const int g_;                   // GPUs per node, at most N
  std::vector<RankBytes> ranks_;  // point-to-point bytes of this phase
  std::vector<RankBytes>& totals_;
  double ring_nvlink_ = 0;         // every rank's ring bytes, each direction
  double ring_reduce_nvlink_ = 0;  // of them, reduces' (at reduce_gbs)
  double ring_nic_ = 0;
  bool ring_ = false;
  int64_t messages_ = 0;
};

struct Clocked {
  double gradients_landed = 0;  // the last gradients-to-owners phase ends
  double stage = 0;             // every update landed, compute done
  double transfer = 0;          // busy time of the transfer timeline
  double latency = 0;
  int phases = 0;
  std::vector<double> compute_end;  // per worker
};

// Clocks the schedule as the header's model says: every gradients-to-owners
// phase first, then the order's compute (each stack after its ready
// bucket's gradients) and updates back (each after all compute issued
// before it, on every worker).
// When compute of `seconds` started at `start` ends, running 1 + c times
// slower inside `busy` (the transfer phases so far: disjoint, in time
// order).
double ComputeEnd(double start, double seconds,
                  const std::vector<std::pair<double, double>>& busy,
                  double c) {
  double t = start, left = seconds;
  for (const auto& [from, to] : busy) {
    if (to <= t) continue;
    if (from > t) {  // free until the phase starts
      if (t + left <= from) return t + left;
      left -= from - t;
      t = from;
    }
    const double slowed = (to - t) / (1 + c);  // work done inside the phase
    if (left <= slowed) return t + left * (1 + c);
    left -= slowed;
    t = to;
  }
  return t + left;
}

// Whether owners write updates into the trainers' staging (see the
// header): one node, every parameter whole on every trainer.
bool PeerWrites(const SimConfig& config) {
  if (!config.peer_writes || config.gpus < 2 ||
      config.gpus > config.gpus_per_node) {
    return false;
  }
  return std::none_of(config.matrices.begin(), config.matrices.end(),
                      [](const MatrixSpec& m) {
                        return m.layout == scheduler::Layout::kRowSharded;
                      });
}

Clocked Clock(const SimConfig& config, const scheduler::StepSchedule& schedule,
              const std::vector<double>& stack_seconds,
              std::vector<RankBytes>* totals) {
  Clocked out;
  double timeline = 0;  // end of the last phase on the transfer timeline
  std::vector<std::pair<double, double>> busy;  // the phases, in time order
  auto run = [&](const std::vector<Transfer>& transfers) {
    Phase phase(config, totals);
    for (const Transfer& x : transfers) {
      phase.Add(x, config.matrices[x.item.matrix]);
    }
    const double seconds = phase.Finish(&out.latency);
    if (seconds > 0) {
      ++out.phases;
      busy.emplace_back(timeline, timeline + seconds);
    }
    out.transfer += seconds;
    timeline += seconds;
  };
  // A bucket without transfers lands with the one before it.
  std::vector<double> landed(schedule.buckets.size(), 0.0);
  for (const scheduler::Phase& p : schedule.order) {
    if (p.kind != scheduler::PhaseKind::kToOwners) continue;
    run(schedule.buckets[p.index].to_owners);
    landed[p.index] = timeline;
  }
  out.gradients_landed = timeline;
  // Compute issued so far ends by `compute_free[w]` on worker w.
  std::vector<double>& compute_free = out.compute_end;
  compute_free.assign(config.gpus, 0.0);
  double compute_so_far = 0;  // max of compute_free
  // Peer writes: each owner's own transfer stream (see the header).
  const bool writes = PeerWrites(config);
  std::vector<double> write_free(config.gpus, 0.0);
  const auto write = [&](const std::vector<Transfer>& transfers) {
    const int n = config.gpus;
    std::vector<double> bytes(n, 0.0);
    for (const Transfer& x : transfers) {
      const MatrixSpec& spec = config.matrices[x.item.matrix];
      const double s = static_cast<double>(spec.rows * spec.cols *
                                           config.update_bytes_per_element);
      bytes[x.owner] += s * (n - 1);
      (*totals)[x.owner].nvlink_sent += s * (n - 1);
      for (int r = 0; r < n; ++r) {
        if (r != x.owner) (*totals)[r].nvlink_received += s;
      }
    }
    for (int w = 0; w < n; ++w) {
      if (bytes[w] == 0) continue;
      const double seconds = bytes[w] / (config.links.copy_engine_gbs * 1e9);
      write_free[w] = std::max(write_free[w], compute_free[w]) + seconds;
      out.transfer += seconds;
      ++out.phases;
    }
  };
  for (const scheduler::Phase& p : schedule.order) {
    if (p.kind == scheduler::PhaseKind::kCompute) {
      const scheduler::OwnerStack& stack = schedule.stacks[p.index];
      double& free = compute_free[stack.owner];
      // Phases issued later wait for this compute: `busy` has every phase
      // it can overlap.
      free =
          ComputeEnd(std::max(free, landed[stack.ready_bucket]),
                     stack_seconds[p.index], busy, config.transfer_contention);
      compute_so_far = std::max(compute_so_far, free);
    } else if (p.kind == scheduler::PhaseKind::kFromOwners) {
      if (writes) {
        write(schedule.buckets[p.index].from_owners);
        continue;
      }
      timeline = std::max(timeline, compute_so_far);
      run(schedule.buckets[p.index].from_owners);
    }
  }
  out.stage = std::max(timeline, compute_so_far);
  for (const double free : write_free) out.stage = std::max(out.stage, free);
  return out;
}

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

scheduler::PlanInput MakePlanInput(const SimConfig& config) {
  scheduler::PlanInput input;
  input.matrices = config.matrices;
  input.options = config.plan;
  for (int w = 0; w < config.gpus; ++w) {
    scheduler::WorkerSpec spec;
    spec.id = absl::StrCat("gpu-", w);
    spec.costs = config.costs;
    spec.speed = 1.0 / config.cost_scale;
    spec.rates.link_bytes_per_second =
        std::min(config.links.nvlink_gbs * 1e9, kFastestLink);
    spec.memory_bytes = config.gpu_memory_bytes;
    input.workers.push_back(std::move(spec));
  }
  return input;
}

}  // namespace

absl::StatusOr<SimResult> SimulateStep(const SimConfig& config) {
  MUONPS_RETURN_IF_ERROR(ValidateSimConfig(config));
  const scheduler::PlanInput input = MakePlanInput(config);
  absl::StatusOr<scheduler::OwnershipPlan> plan =
      scheduler::PlanOwnership(input);
  if (!plan.ok()) return Annotate(plan.status(), "planner");
  absl::StatusOr<scheduler::StepSchedule> schedule =
      scheduler::BuildStepSchedule(config.matrices, *plan, config.schedule);
  if (!schedule.ok()) return Annotate(schedule.status(), "step schedule");

  // A stack runs one Newton-Schulz call per chunk of its owner's batch.
  const scheduler::CostModel model(config.costs, input.workers[0].rates,
                                   1.0 / config.cost_scale,
                                   config.plan.ns_steps);
  std::vector<double> stack_seconds;
  for (const scheduler::OwnerStack& s : schedule->stacks) {
    double seconds = 0;
    for (const scheduler::StackChunk& chunk : s.chunks) {
      seconds += model.NsSeconds(s.rows, s.cols, chunk.count, chunk.algorithm);
    }
    stack_seconds.push_back(seconds);
  }

  SimResult result;
  const int n = config.gpus;
  std::vector<RankBytes> totals(n);
  result.worker_compute_seconds.assign(n, 0.0);
  result.worker_stacks.assign(n, {});
  for (const scheduler::Phase& p : schedule->order) {
    if (p.kind != scheduler::PhaseKind::kCompute) continue;
    const int w = schedule->stacks[p.index].owner;
    result.worker_compute_seconds[w] += stack_seconds[p.index];
    result.worker_stacks[w].push_back(p.index);
  }
  Clocked clock = Clock(config, *schedule, stack_seconds, &totals);
  result.stage_seconds = clock.stage;
  result.gradients_landed_seconds = clock.gradients_landed;
  result.transfer_seconds = clock.transfer;
  result.latency_seconds = clock.latency;
  result.phases = clock.phases;
  result.worker_compute_end_seconds = std::move(clock.compute_end);

  // The commit: every worker applies what its trainer holds.
  double applied = 0;  // parameters per worker
  for (const MatrixSpec& m : config.matrices) {
    const double elements = static_cast<double>(m.rows * m.cols * m.experts);
    applied +=
        m.layout == scheduler::Layout::kRowSharded ? elements / n : elements;
  }
  // The fp32 parameter read and written, the update read.
  result.apply_seconds = applied * (2 * 4 + config.update_bytes_per_element) /
                         config.hbm_bytes_per_second;
  result.commit_seconds =
      config.control_rounds_ms * 1e-3 + result.apply_seconds;
  result.predicted_seconds = result.stage_seconds + result.commit_seconds;

  const std::vector<double>& ends = result.worker_compute_end_seconds;
  const int last = static_cast<int>(std::max_element(ends.begin(), ends.end()) -
                                    ends.begin());
  result.compute_end_seconds_max = ends[last];
  result.critical_compute_seconds = result.worker_compute_seconds[last];
  result.critical_wait_seconds =
      ends[last] - result.worker_compute_seconds[last];
  result.updates_tail_seconds =
      result.stage_seconds - result.compute_end_seconds_max;
  const std::pair<double, const char*> parts[] = {
      {result.critical_compute_seconds, "compute"},
      {result.critical_wait_seconds, "gradients"},
      {result.updates_tail_seconds, "updates_back"},
      {result.commit_seconds, "commit"}};
  result.limited_by = std::max_element(std::begin(parts), std::end(parts),
                                       [](const auto& a, const auto& b) {
                                         return a.first < b.first;
                                       })
                          ->second;

  const std::vector<double>& c = result.worker_compute_seconds;
  result.compute_seconds_max = *std::max_element(c.begin(), c.end());
  result.compute_seconds_mean = std::accumulate(c.begin(), c.end(), 0.0) / n;
  result.imbalance =
      result.compute_seconds_mean > 0
          ? result.compute_seconds_max / result.compute_seconds_mean
          : 1.0;
  double bytes = 0;
  for (const RankBytes& t : totals) {
    bytes = std::max({bytes, t.nvlink_sent + t.nic_sent,
                      t.nvlink_received + t.nic_received});
  }
  result.bytes_per_gpu = std::llround(bytes);
  for (const MatrixSpec& m : config.matrices) {
    result.parameters += m.rows * m.cols * m.experts;
  }
  result.owning_workers = static_cast<int>(
      std::count_if(c.begin(), c.end(), [](double s) { return s > 0; }));
  result.plan_max_seconds = plan->max_seconds;
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
