#include "scheduler/step_clock.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "common/status.h"

namespace muonps {
namespace scheduler {
namespace {

// Wire bytes each rank moves in one phase, over NVLink and over its NIC.
struct RankBytes {
  double nvlink_sent = 0, nvlink_received = 0;
  double nic_sent = 0, nic_received = 0;
};

// What every phase of one clock shares: the topology's figures, each
// rank's point-to-point bytes of the phase in flight (zero between
// phases), and the step's totals. A ring moves the same bytes through every
// rank, so ring bytes are totalled once for all ranks; point-to-point bytes
// only for the ranks they touch, so a phase costs its transfers plus the
// ranks they touch, not every rank.
struct PhaseState {
  PhaseState(const ClockSettings& settings, int workers)
      : settings(settings),
        n(workers),
        g(settings.topology.most_per_node()),
        one_node(settings.topology.nodes() == 1),
        phase(workers),
        totals(workers) {}

  const ClockSettings& settings;
  const int n;
  const int g;  // the most ranks on one node
  const bool one_node;
  std::vector<RankBytes> phase;   // point-to-point, this phase
  std::vector<int> touched;       // ranks with phase bytes
  std::vector<RankBytes> totals;  // point-to-point, every phase
  RankBytes ring_totals;          // every rank's, every phase
};

// Accumulates the transfers of one grouped phase (see the header's model)
// and clocks it.
class Phase {
 public:
  explicit Phase(PhaseState* state) : s_(*state) {}

  void Add(const Transfer& x, const MatrixSpec& spec) {
    if (s_.n == 1) return;  // NCCL with one rank moves nothing
    ++messages_;
    const bool update = x.kind == TransferKind::kBroadcastFromOwner ||
                        x.kind == TransferKind::kScatterFromOwner;
    const double s =
        static_cast<double>(spec.rows * spec.cols *
                            (update ? s_.settings.update_bytes_per_element
                                    : s_.settings.wire_bytes_per_element));
    switch (x.kind) {
      case TransferKind::kReduceToOwner:
      case TransferKind::kBroadcastFromOwner: {
        ring_ = true;
        // A reduce's NVLink part runs at its own rate (reduce_gbs).
        double& nvlink = x.kind == TransferKind::kReduceToOwner
                             ? ring_reduce_nvlink_
                             : ring_nvlink_;
        if (s_.one_node) {
          nvlink += s;
        } else {
          nvlink += s * (s_.g - 1) / s_.g;
          ring_nic_ += s / s_.g;
        }
        break;
      }
      case TransferKind::kGatherToOwner:
      case TransferKind::kScatterFromOwner: {
        const bool in = x.kind == TransferKind::kGatherToOwner;
        const double part = s / s_.n;
        for (int r = 0; r < s_.n; ++r) {
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
  // totals and its latency to `*latency_seconds`. Leaves the state's
  // phase bytes zero.
  double Finish(double* latency_seconds) {
    if (messages_ == 0) return 0;
    const LinkFigures& l = s_.settings.topology.links;
    double latency = messages_ * l.latency_us * 1e-6;
    if (ring_) latency += (s_.n - 1) * l.hop_latency_us * 1e-6;
    const double reduce_gbs = l.reduce_gbs > 0 ? l.reduce_gbs : l.nvlink_gbs;
    // A rank's time for `b` point-to-point bytes besides the ring's.
    const auto seconds = [&](const RankBytes& b) {
      const double nvlink_seconds =
          (ring_nvlink_ + std::max(b.nvlink_sent, b.nvlink_received)) /
              (l.nvlink_gbs * 1e9) +
          ring_reduce_nvlink_ / (reduce_gbs * 1e9);
      const double nic = ring_nic_ + std::max(b.nic_sent, b.nic_received);
      return std::max(nvlink_seconds, nic / (l.inter_node_gbs * 1e9));
    };
    // Ranks no transfer touched move only the ring's bytes.
    double bandwidth_seconds =
        static_cast<int>(s_.touched.size()) < s_.n ? seconds(RankBytes{}) : 0;
    for (const int r : s_.touched) {
      RankBytes& b = s_.phase[r];
      bandwidth_seconds = std::max(bandwidth_seconds, seconds(b));
      RankBytes& t = s_.totals[r];
      t.nvlink_sent += b.nvlink_sent;
      t.nvlink_received += b.nvlink_received;
      t.nic_sent += b.nic_sent;
      t.nic_received += b.nic_received;
      b = RankBytes{};
    }
    s_.touched.clear();
    const double ring = ring_nvlink_ + ring_reduce_nvlink_;
    s_.ring_totals.nvlink_sent += ring;
    s_.ring_totals.nvlink_received += ring;
    s_.ring_totals.nic_sent += ring_nic_;
    s_.ring_totals.nic_received += ring_nic_;
    *latency_seconds += latency;
    return latency + bandwidth_seconds;
  }

 private:
  RankBytes& Touch(int r) {
    RankBytes& b = s_.phase[r];
    if (b.nvlink_sent == 0 && b.nvlink_received == 0 && b.nic_sent == 0 &&
        b.nic_received == 0) {
      s_.touched.push_back(r);
    }
    return b;
  }

  void Move(int from, int to, double bytes) {
    if (bytes <= 0) return;
    if (s_.settings.topology.SameNode(from, to)) {
      Touch(from).nvlink_sent += bytes;
      Touch(to).nvlink_received += bytes;
    } else {
      Touch(from).nic_sent += bytes;
      Touch(to).nic_received += bytes;
    }
  }

  PhaseState& s_;
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

// When compute of `seconds` started at `start` ends, running 1 + c times
// slower inside `busy` (the transfer phases so far: disjoint, in time
// order).
double ComputeEnd(double start, double seconds,
                  const std::vector<std::pair<double, double>>& busy,
                  double c) {
  double t = start, left = seconds;
  // The phases are in time order: skip those over by `start` at once.
  const auto first = std::partition_point(
      busy.begin(), busy.end(), [start](const std::pair<double, double>& p) {
        return p.second <= start;
      });
  for (auto it = first; it != busy.end(); ++it) {
    const auto& [from, to] = *it;
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
bool PeerWrites(const std::vector<MatrixSpec>& matrices, int workers,
                const ClockSettings& settings) {
  if (!settings.peer_writes || workers < 2 || settings.topology.nodes() > 1) {
    return false;
  }
  return std::none_of(
      matrices.begin(), matrices.end(),
      [](const MatrixSpec& m) { return m.layout == Layout::kRowSharded; });
}

// Clocks the schedule as the header's model says: every gradients-to-owners
// phase first, then the order's compute (each stack after its ready
// bucket's gradients) and updates back (each after all compute issued
// before it, on every worker).
Clocked Clock(const std::vector<MatrixSpec>& matrices,
              const StepSchedule& schedule,
              const std::vector<double>& stack_seconds, int workers,
              const ClockSettings& settings, PhaseState* state) {
  Clocked out;
  double timeline = 0;  // end of the last phase on the transfer timeline
  std::vector<std::pair<double, double>> busy;  // the phases, in time order
  auto run = [&](const std::vector<Transfer>& transfers) {
    Phase phase(state);
    for (const Transfer& x : transfers) {
      phase.Add(x, matrices[x.item.matrix]);
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
    if (p.kind != PhaseKind::kToOwners) continue;
    run(schedule.buckets[p.index].to_owners);
    landed[p.index] = timeline;
  }
  out.gradients_landed = timeline;
  // Compute issued so far ends by `compute_free[w]` on worker w.
  std::vector<double>& compute_free = out.compute_end;
  compute_free.assign(workers, 0.0);
  double compute_so_far = 0;  // max of compute_free
  // Peer writes: each owner's own transfer stream (see the header).
  const bool writes = PeerWrites(matrices, workers, settings);
  std::vector<double> write_free(workers, 0.0);
  const double copy_rate = settings.topology.links.copy_engine_gbs * 1e9;
  const auto write = [&](const std::vector<Transfer>& transfers) {
    const int n = workers;
    std::vector<double> bytes(n, 0.0);
    for (const Transfer& x : transfers) {
      const MatrixSpec& spec = matrices[x.item.matrix];
      const double s = static_cast<double>(spec.rows * spec.cols *
                                           settings.update_bytes_per_element);
      bytes[x.owner] += s * (n - 1);
      // Every rank receives s, its owner sends (n - 1) s and none to itself.
      state->ring_totals.nvlink_received += s;
      state->totals[x.owner].nvlink_received -= s;
      state->totals[x.owner].nvlink_sent += s * (n - 1);
    }
    for (int w = 0; w < n; ++w) {
      if (bytes[w] == 0) continue;
      const double seconds = bytes[w] / copy_rate;
      write_free[w] = std::max(write_free[w], compute_free[w]) + seconds;
      out.transfer += seconds;
      ++out.phases;
    }
  };
  for (const scheduler::Phase& p : schedule.order) {
    if (p.kind == PhaseKind::kCompute) {
      const OwnerStack& stack = schedule.stacks[p.index];
      double& free = compute_free[stack.owner];
      // Phases issued later wait for this compute: `busy` has every phase
      // it can overlap.
      free = ComputeEnd(std::max(free, landed[stack.ready_bucket]),
                        stack_seconds[p.index], busy,
                        settings.transfer_contention);
      compute_so_far = std::max(compute_so_far, free);
    } else if (p.kind == PhaseKind::kFromOwners) {
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

}  // namespace

Topology Topology::Blocks(int workers, int per_node) {
  Topology t;
  t.node.resize(std::max(workers, 0));
  for (int r = 0; r < workers; ++r) t.node[r] = r / std::max(per_node, 1);
  return t;
}

std::vector<std::vector<int32_t>> ChooseOwnerGroups(
    const std::vector<MatrixSpec>& matrices, const Topology& topology,
    int workers, int dedicated) {
  if (dedicated != 0 || topology.node.size() != static_cast<size_t>(workers) ||
      topology.nodes() < 2) {
    return {};
  }
  for (const MatrixSpec& spec : matrices) {
    if (spec.layout != Layout::kReplicated) return {};
  }
  std::vector<std::vector<int32_t>> groups(topology.nodes());
  for (int r = 0; r < workers; ++r) {
    const int32_t n = topology.node[r];
    if (n < 0 || n >= static_cast<int32_t>(groups.size())) return {};
    groups[n].push_back(r);
  }
  for (const std::vector<int32_t>& group : groups) {
    if (group.size() != groups[0].size()) return {};
  }
  return groups;
}

int Topology::nodes() const {
  if (node.empty()) return 1;
  std::vector<int32_t> sorted = node;
  std::sort(sorted.begin(), sorted.end());
  return static_cast<int>(std::unique(sorted.begin(), sorted.end()) -
                          sorted.begin());
}

int Topology::most_per_node() const {
  if (node.empty()) return std::numeric_limits<int>::max();
  absl::flat_hash_map<int32_t, int> count;
  int most = 1;
  for (const int32_t n : node) most = std::max(most, ++count[n]);
  return most;
}

std::vector<double> StackSeconds(const StepSchedule& schedule,
                                 const std::vector<const CostModel*>& models) {
  std::vector<double> out;
  out.reserve(schedule.stacks.size());
  for (const OwnerStack& s : schedule.stacks) {
    double seconds = 0;
    for (const StackChunk& chunk : s.chunks) {
      seconds += models[s.owner]->NsSeconds(s.rows, s.cols, chunk.count,
                                            chunk.algorithm);
    }
    out.push_back(seconds);
  }
  return out;
}

StepClock ClockStep(const std::vector<MatrixSpec>& matrices,
                    const StepSchedule& schedule,
                    const std::vector<double>& stack_seconds, int workers,
                    const ClockSettings& settings) {
  StepClock r;
  const int n = workers;
  PhaseState state(settings, workers);
  r.worker_compute_seconds.assign(n, 0.0);
  r.worker_stacks.assign(n, {});
  for (const scheduler::Phase& p : schedule.order) {
    if (p.kind != PhaseKind::kCompute) continue;
    const int w = schedule.stacks[p.index].owner;
    r.worker_compute_seconds[w] += stack_seconds[p.index];
    r.worker_stacks[w].push_back(p.index);
  }
  Clocked clock =
      Clock(matrices, schedule, stack_seconds, workers, settings, &state);
  r.stage_seconds = clock.stage;
  r.gradients_landed_seconds = clock.gradients_landed;
  r.transfer_seconds = clock.transfer;
  r.latency_seconds = clock.latency;
  r.phases = clock.phases;
  r.worker_compute_end_seconds = std::move(clock.compute_end);

  // The commit: every worker applies what its trainer holds.
  double applied = 0;  // parameters per worker
  for (const MatrixSpec& m : matrices) {
    const double elements = static_cast<double>(m.rows * m.cols * m.experts);
    applied += m.layout == Layout::kRowSharded ? elements / n : elements;
  }
  // The fp32 parameter read and written, the update read.
  r.apply_seconds = applied * (2 * 4 + settings.update_bytes_per_element) /
                    settings.hbm_bytes_per_second;
  r.commit_seconds = settings.control_rounds_ms * 1e-3 + r.apply_seconds;
  r.predicted_seconds = r.stage_seconds + r.commit_seconds;

  const std::vector<double>& ends = r.worker_compute_end_seconds;
  const int last = static_cast<int>(std::max_element(ends.begin(), ends.end()) -
                                    ends.begin());
  r.compute_end_seconds_max = ends[last];
  r.critical_compute_seconds = r.worker_compute_seconds[last];
  r.critical_wait_seconds = ends[last] - r.worker_compute_seconds[last];
  r.updates_tail_seconds = r.stage_seconds - r.compute_end_seconds_max;
  const std::pair<double, const char*> parts[] = {
      {r.critical_compute_seconds, "compute"},
      {r.critical_wait_seconds, "gradients"},
      {r.updates_tail_seconds, "updates_back"},
      {r.commit_seconds, "commit"}};
  r.limited_by = std::max_element(std::begin(parts), std::end(parts),
                                  [](const auto& a, const auto& b) {
                                    return a.first < b.first;
                                  })
                     ->second;
  double bytes = 0;
  const RankBytes& ring = state.ring_totals;
  for (const RankBytes& t : state.totals) {
    bytes = std::max(
        {bytes, ring.nvlink_sent + ring.nic_sent + t.nvlink_sent + t.nic_sent,
         ring.nvlink_received + ring.nic_received + t.nvlink_received +
             t.nic_received});
  }
  r.bytes_per_gpu = std::llround(bytes);
  return r;
}

absl::StatusOr<StepGrouping> ChooseStepGrouping(
    const std::vector<MatrixSpec>& matrices, const OwnershipPlan& plan,
    const std::vector<const CostModel*>& models, const ClockSettings& settings,
    const ScheduleOptions& options) {
  StepGrouping out;
  if (options.bucket_bytes > 0 || settings.topology.nodes() == 1) {
    if (options.bucket_bytes > 0) out.bucket_bytes = options.bucket_bytes;
    MUONPS_ASSIGN_OR_RETURN(
        out.schedule, BuildStepSchedule(matrices, plan,
                                        {.bucket_bytes = out.bucket_bytes,
                                         .stack_bytes = options.stack_bytes}));
    return out;
  }
  int64_t everything = 0;
  for (const MatrixSpec& m : matrices) {
    everything += PayloadBytes(m) * m.experts;
  }
  constexpr int64_t kBase = int64_t{64} << 20;
  std::vector<int64_t> bounds;                    // largest first
  bounds.push_back(std::max(everything, kBase));  // one bucket
  for (const int64_t times : {64, 16, 4, 1}) {
    if (kBase * times < everything) bounds.push_back(kBase * times);
  }
  MUONPS_ASSIGN_OR_RETURN(
      StepScheduleCutter cutter,
      StepScheduleCutter::Create(matrices, plan, options.stack_bytes));
  // Every candidate has the same stacks: one schedule, cut again for each,
  // and their seconds once.
  StepSchedule schedule = cutter.TakeStacks();
  const int workers = static_cast<int>(plan.worker_ids.size());
  const std::vector<double> stack_seconds = StackSeconds(schedule, models);
  out.predicted_seconds = std::numeric_limits<double>::infinity();
  // Two bounds in a row that do not beat the best end the search.
  int misses = 0;
  int64_t cut = 0;
  for (size_t i = 0; i < bounds.size() && misses < 2; ++i) {
    MUONPS_RETURN_IF_ERROR(cutter.Cut(bounds[i], &schedule));
    cut = bounds[i];
    const double predicted =
        ClockStep(matrices, schedule, stack_seconds, workers, settings)
            .predicted_seconds;
    out.candidates.emplace_back(bounds[i], predicted);
    if (predicted <= out.predicted_seconds) {
      out.predicted_seconds = predicted;
      out.bucket_bytes = bounds[i];
      misses = 0;
    } else {
      ++misses;
    }
  }
  if (cut != out.bucket_bytes) {
    MUONPS_RETURN_IF_ERROR(cutter.Cut(out.bucket_bytes, &schedule));
  }
  out.schedule = std::move(schedule);
  return out;
}

}  // namespace scheduler
}  // namespace muonps
