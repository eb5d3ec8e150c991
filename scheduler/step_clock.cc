#include "scheduler/step_clock.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <future>
#include <iterator>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/rank_tree.h"
#include "common/status.h"
#include "scheduler/node_exchange.h"
#include "scheduler/step_bound.h"

namespace muonps {
namespace scheduler {
namespace {

// Wire bytes each rank moves in one phase, over NVLink and over its NIC.
struct RankBytes {
  double nvlink_sent = 0, nvlink_received = 0;
  double nic_sent = 0, nic_received = 0;
};

// One owner group as the clock sees it: its members, how they sit on the
// nodes, and whether its updates go back by peer writes (see the header).
struct GroupLinks {
  std::vector<int32_t> members;
  int n = 0;             // members
  int g = 0;             // the most members on one node
  bool one_node = true;  // every member on one node
  bool writes = false;   // updates back by peer writes
  // Every member's ring bytes (and the exchange's levels'), every phase.
  RankBytes ring_totals;
  // By trainer shard: the member holding it (ClockSettings::trainer_shards),
  // or -1.
  std::vector<int32_t> holder_of_shard;
};

// The groups of `schedule` (one of every worker when it has none) on
// `settings.topology`.
std::vector<GroupLinks> GroupsOf(const std::vector<MatrixSpec>& matrices,
                                 const StepSchedule& schedule, int workers,
                                 const ClockSettings& settings) {
  std::vector<GroupLinks> out;
  if (schedule.groups.empty()) {
    out.emplace_back();
    for (int r = 0; r < workers; ++r) out[0].members.push_back(r);
  } else {
    for (const std::vector<int32_t>& members : schedule.groups) {
      out.emplace_back();
      out.back().members = members;
    }
  }
  // Trainers keep every parameter whole unless a matrix is row-sharded.
  const bool whole = std::none_of(
      matrices.begin(), matrices.end(),
      [](const MatrixSpec& m) { return m.layout == Layout::kRowSharded; });
  const std::vector<int32_t>& node = settings.topology.node;
  for (GroupLinks& group : out) {
    group.n = static_cast<int>(group.members.size());
    if (node.empty()) {
      group.g = std::numeric_limits<int>::max();
    } else {
      absl::flat_hash_map<int32_t, int> count;
      group.g = 1;
      for (const int32_t r : group.members) {
        group.g = std::max(group.g, ++count[node[r]]);
      }
      group.one_node = count.size() <= 1;
    }
    group.writes =
        settings.peer_writes && group.n >= 2 && group.one_node && whole;
    group.holder_of_shard = settings.trainer_shards.HoldersAmong(group.members);
  }
  return out;
}

// What every phase of one clock shares: the topology's figures, the owner
// groups, each rank's point-to-point bytes of the phase in flight (zero
// between phases), and the step's totals. A ring moves the same bytes
// through every rank of its group, so ring bytes are totalled once per
// group; point-to-point bytes only for the ranks they touch, so a phase
// costs its transfers plus the ranks they touch, not every rank.
struct PhaseState {
  PhaseState(const std::vector<MatrixSpec>& matrices,
             const StepSchedule& schedule, int workers,
             const ClockSettings& settings)
      : settings(settings),
        groups(GroupsOf(matrices, schedule, workers, settings)),
        group_of(workers, 0),
        exchange_nodes(schedule.exchange_nodes),
        phase(workers),
        totals(workers) {
    for (size_t k = 0; k < groups.size(); ++k) {
      for (const int32_t r : groups[k].members) {
        group_of[r] = static_cast<int32_t>(k);
      }
    }
    // Exchange nodes laid otherwise than the hosts: a level that crosses
    // a host anywhere is clocked over the NICs.
    const Topology& t = settings.topology;
    if (!exchange_nodes.empty()) {
      exchange_at = PositionsOf(exchange_nodes, workers);
    }
    for (size_t k = 0; k < exchange_nodes.size(); ++k) {
      const std::vector<int32_t>& node = exchange_nodes[k];
      for (size_t p = 0; p < node.size(); ++p) {
        node_level_nic = node_level_nic || !t.SameNode(node[p], node[0]);
        across_level_nic =
            across_level_nic || !t.SameNode(node[p], exchange_nodes[0][p]);
      }
    }
  }

  const ClockSettings& settings;
  std::vector<GroupLinks> groups;
  std::vector<int32_t> group_of;  // by rank
  // StepSchedule::exchange_nodes, and whether the exchange's levels
  // (within each node, across the nodes) cross the NICs.
  const std::vector<std::vector<int32_t>>& exchange_nodes;
  std::vector<NodePosition> exchange_at;  // by rank
  bool node_level_nic = false;
  bool across_level_nic = false;
  std::vector<RankBytes> phase;   // point-to-point, this phase
  std::vector<int> touched;       // ranks with phase bytes
  std::vector<RankBytes> totals;  // point-to-point, every phase
};

// One step of a bucket's exchange as the pipeline launches it: its busiest
// rank's seconds over each link, the ring hops its launch fills, and its
// HBM seconds on the transfer stream before and after its launch
// (ExchangeStep).
struct LaunchStep {
  double nvlink = 0;
  double nic = 0;
  int hops = 1;
  double hbm_before = 0;
  double hbm_after = 0;
};

// A bucket's phase as the exchange's pipeline launches it (Pipeline): its
// other transfers, which go in the launch of its exchange's first step,
// and that exchange's steps, one a launch.
struct PhaseLaunch {
  bool moves = false;  // some transfer
  // The other transfers as a phase of their own (Phase::Finish), its
  // latency, and its slowest group's bandwidth time on each link.
  double seconds = 0;
  double latency = 0;
  double nvlink = 0;
  double nic = 0;
  std::vector<LaunchStep> steps;  // none without the exchange
  // The relays' second launch (RelaysRows), after the phase's first: its
  // latency and its busiest rank's seconds; 0 for none.
  double after = 0;
  double after_latency = 0;
};

// Accumulates the transfers of one grouped phase (see the header's model)
// and clocks it: every owner group's part on its own members' links, all
// at once, so the phase takes as long as its slowest group's part.
class Phase {
 public:
  explicit Phase(PhaseState* state)
      : s_(*state), parts_(state->groups.size()) {}

  void Add(const Transfer& x, const MatrixSpec& spec) {
    const GroupLinks& group = s_.groups[x.group];
    if (group.n == 1) return;  // NCCL with one rank moves nothing
    Part& part = parts_[x.group];
    if (x.kind == TransferKind::kExchangeToOwner ||
        x.kind == TransferKind::kExchangeFromOwner) {
      // Not a launch of its own: the bucket's exchange (Launch).
      exchange_update_ = x.kind == TransferKind::kExchangeFromOwner;
      exchange_sizes_.push_back(spec.rows * spec.cols);
      exchange_owners_.push_back(x.owner);
      return;
    }
    const bool update = x.kind == TransferKind::kBroadcastFromOwner ||
                        x.kind == TransferKind::kScatterFromOwner;
    const double s =
        static_cast<double>(spec.rows * spec.cols *
                            (update ? s_.settings.update_bytes_per_element
                                    : s_.settings.wire_bytes_per_element));
    // A whole expert moves between its owner and the one member whose
    // trainer holds it, or not at all where that is its owner (or where no
    // member holds it). Without the trainers' shards known, it is clocked
    // as rows from every member, below.
    const bool rows = x.kind == TransferKind::kGatherToOwner ||
                      x.kind == TransferKind::kScatterFromOwner;
    const int32_t shard =
        rows ? s_.settings.trainer_shards.ShardOfExpert(spec, x.item.expert)
             : -1;
    if (shard >= 0) {
      const int32_t holder = group.holder_of_shard[shard];
      if (holder < 0 || holder == x.owner) return;
      ++part.messages;
      const bool in = x.kind == TransferKind::kGatherToOwner;
      Move(in ? holder : x.owner, in ? x.owner : holder, s);
      return;
    }
    ++part.messages;
    switch (x.kind) {
      case TransferKind::kReduceToOwner:
      case TransferKind::kBroadcastFromOwner: {
        part.ring = true;
        // A reduce's NVLink part runs at its own rate (reduce_gbs).
        double& nvlink = x.kind == TransferKind::kReduceToOwner
                             ? part.ring_reduce_nvlink
                             : part.ring_nvlink;
        if (group.one_node) {
          nvlink += s;
        } else {
          nvlink += s * (group.g - 1) / group.g;
          part.ring_nic += s / group.g;
        }
        break;
      }
      case TransferKind::kGatherToOwner:
      case TransferKind::kScatterFromOwner: {
        const bool in = x.kind == TransferKind::kGatherToOwner;
        const double rows = s / group.n;
        const bool relayed = RelaysRows(s_.exchange_nodes, spec);
        for (const int32_t r : group.members) {
          if (r == x.owner) continue;
          const int via =
              relayed ? RelayOf(s_.exchange_nodes, s_.exchange_at, r, x.owner)
                      : x.owner;
          if (via == x.owner) {
            Move(in ? r : x.owner, in ? x.owner : r, rows);
            continue;
          }
          // The network hop in one launch, the node's in the next: a
          // gather's rows to the relay first, a scatter's from it last.
          if (in) {
            Move(r, via, rows);
            Forward(via, x.owner, rows);
          } else {
            Move(x.owner, via, rows);
            Forward(via, r, rows);
          }
        }
        break;
      }
      case TransferKind::kSendToOwner:
        Move(group.members[0], x.owner, s);
        break;
      case TransferKind::kExchangeToOwner:
      case TransferKind::kExchangeFromOwner:
        break;  // above
    }
  }

  // Seconds of the phase (0 with no transfers); adds its bytes to the
  // totals and the latency of its slowest group to `*latency_seconds`.
  // Leaves the state's phase bytes zero. Not for the exchange's transfers
  // (Launch).
  double Finish(double* latency_seconds) {
    PhaseLaunch launch;
    FinishParts(&launch);
    *latency_seconds += launch.latency + launch.after_latency;
    return launch.seconds + launch.after;
  }

  // The phase as the exchange's pipeline launches it (the header's model);
  // adds its bytes to the totals. Leaves the state's phase bytes zero.
  PhaseLaunch Launch() {
    PhaseLaunch out;
    FinishParts(&out);
    if (!exchange_sizes_.empty()) {
      out.moves = true;
      ExchangeSteps(&out.steps);
    }
    return out;
  }

 private:
  // One owner group's share of the phase.
  struct Part {
    double ring_nvlink = 0;         // every member's ring bytes, each way
    double ring_reduce_nvlink = 0;  // of them, reduces' (at reduce_gbs)
    double ring_nic = 0;
    bool ring = false;
    int64_t messages = 0;
    int touched = 0;  // members with point-to-point bytes
    // Its busiest member's seconds over NVLink and over its NIC, and the
    // larger.
    double nvlink_seconds = 0;
    double nic_seconds = 0;
    double bandwidth_seconds = 0;
  };

  // Clocks the phase's transfers but the exchange's into `*out` (seconds,
  // latency and the slowest group's time on each link; moves where any)
  // and adds their bytes to the totals.
  void FinishParts(PhaseLaunch* out) {
    const LinkFigures& l = s_.settings.topology.links;
    FinishForwards(out);
    const double reduce_gbs = l.reduce_gbs > 0 ? l.reduce_gbs : l.nvlink_gbs;
    // A rank's time on each link for `b` point-to-point bytes besides its
    // group's ring.
    const auto seconds = [&](Part& part, const RankBytes& b) {
      const double nvlink_seconds =
          (part.ring_nvlink + std::max(b.nvlink_sent, b.nvlink_received)) /
              (l.nvlink_gbs * 1e9) +
          part.ring_reduce_nvlink / (reduce_gbs * 1e9);
      const double nic = part.ring_nic + std::max(b.nic_sent, b.nic_received);
      const double nic_seconds = nic / (l.inter_node_gbs * 1e9);
      part.nvlink_seconds = std::max(part.nvlink_seconds, nvlink_seconds);
      part.nic_seconds = std::max(part.nic_seconds, nic_seconds);
      part.bandwidth_seconds = std::max(part.bandwidth_seconds,
                                        std::max(nvlink_seconds, nic_seconds));
    };
    for (const int r : s_.touched) {
      Part& part = parts_[s_.group_of[r]];
      seconds(part, s_.phase[r]);
      ++part.touched;
      Retire(r);
    }
    s_.touched.clear();
    for (size_t k = 0; k < parts_.size(); ++k) {
      Part& part = parts_[k];
      if (part.messages == 0) continue;
      out->moves = true;
      GroupLinks& group = s_.groups[k];
      double latency = part.messages * l.latency_us * 1e-6;
      if (part.ring) latency += (group.n - 1) * l.hop_latency_us * 1e-6;
      // Members no transfer touched move only the ring's bytes.
      if (part.touched < group.n) seconds(part, RankBytes{});
      if (latency + part.bandwidth_seconds > out->seconds) {
        out->seconds = latency + part.bandwidth_seconds;
        out->latency = latency;
        out->nvlink = part.nvlink_seconds;
        out->nic = part.nic_seconds;
      }
      const double ring = part.ring_nvlink + part.ring_reduce_nvlink;
      group.ring_totals.nvlink_sent += ring;
      group.ring_totals.nvlink_received += ring;
      group.ring_totals.nic_sent += part.ring_nic;
      group.ring_totals.nic_received += part.ring_nic;
    }
  }

  // Seconds of the exchange's parts within the owners' nodes (`x`, `e`
  // bytes an element): each item's part in each block from the worker at
  // the block's position on the owner's node to the owner (none from the
  // owner's own block); for updates the reverse. Its busiest rank's time;
  // adds the bytes to the totals.
  double Parts(const NodeExchange& x, double e) {
    const bool update = exchange_update_;
    for (size_t i = 0; i < exchange_sizes_.size(); ++i) {
      const int32_t owner = exchange_owners_[i];
      const NodePosition at = s_.exchange_at[owner];
      for (const ExchangePart& part : x.Parts(i)) {
        if (part.position == at.position) continue;
        const double bytes = static_cast<double>(part.count) * e;
        Tally(x.worker(at.node, part.position), update, s_.node_level_nic,
              bytes);
        Tally(owner, !update, s_.node_level_nic, bytes);
      }
    }
    return TakeTouched();
  }

  // NIC or NVLink bytes per second.
  double LinkRate(bool nic) const {
    const LinkFigures& l = s_.settings.topology.links;
    return (nic ? l.inter_node_gbs : l.nvlink_gbs) * 1e9;
  }

  // `bytes` of this phase's point-to-point ones into (`in`) or out of rank
  // `r`, over its NIC or NVLink.
  void Tally(int r, bool in, bool nic, double bytes) {
    RankBytes& b = Touch(r);
    (nic ? (in ? b.nic_received : b.nic_sent)
         : (in ? b.nvlink_received : b.nvlink_sent)) += bytes;
  }

  // Adds rank r's point-to-point bytes of the phase to its totals and
  // zeroes them.
  void Retire(int r) {
    RankBytes& b = s_.phase[r];
    RankBytes& t = s_.totals[r];
    t.nvlink_sent += b.nvlink_sent;
    t.nvlink_received += b.nvlink_received;
    t.nic_sent += b.nic_sent;
    t.nic_received += b.nic_received;
    b = RankBytes{};
  }

  // The busiest touched rank's seconds for its point-to-point bytes, which
  // go to the totals, leaving the phase's zero.
  double TakeTouched() {
    const double nvlink = LinkRate(false);
    const double nic = LinkRate(true);
    double seconds = 0;
    for (const int r : s_.touched) {
      RankBytes& b = s_.phase[r];
      seconds = std::max({seconds,
                          std::max(b.nvlink_sent, b.nvlink_received) / nvlink,
                          std::max(b.nic_sent, b.nic_received) / nic});
      Retire(r);
    }
    s_.touched.clear();
    return seconds;
  }

  // The bucket's exchange's steps into `*out`, in their launch order (the
  // header's model; ExchangeStepsOf), each on the link its level takes;
  // adds their bytes to the totals, every member's levels as a ring's.
  void ExchangeSteps(std::vector<LaunchStep>* out) {
    const ClockSettings& c = s_.settings;
    const LinkFigures& l = c.topology.links;
    const bool update = exchange_update_;
    const NodeExchange x(s_.exchange_nodes, exchange_sizes_);
    const double parts = Parts(
        x, update ? c.update_bytes_per_element : c.wire_bytes_per_element);
    RankBytes& every = s_.groups[0].ring_totals;
    for (const ExchangeStep& step : ExchangeStepsOf(
             x.nodes(), x.per_node(), static_cast<double>(x.elements()),
             static_cast<double>(x.packed()), update, c)) {
      const bool nic = step.across ? s_.across_level_nic : s_.node_level_nic;
      double seconds = parts;
      if (!step.parts) {
        // A ring reduce over NVLink runs at reduce_gbs, as a flat ring's
        // NVLink part does; over the NICs at their rate.
        const double rate = !nic && step.reduce && l.reduce_gbs > 0
                                ? l.reduce_gbs * 1e9
                                : LinkRate(nic);
        seconds = step.bytes / rate;
        (nic ? every.nic_sent : every.nvlink_sent) += step.bytes;
        (nic ? every.nic_received : every.nvlink_received) += step.bytes;
      }
      LaunchStep& launch = out->emplace_back();
      (nic ? launch.nic : launch.nvlink) = seconds;
      launch.hops = step.hops;
      launch.hbm_before = step.hbm_before_seconds;
      launch.hbm_after = step.hbm_after_seconds;
    }
    exchange_sizes_.clear();
    exchange_owners_.clear();
  }

  // `bytes` a relay passes on from `from` to `to` in the second launch.
  void Forward(int from, int to, double bytes) {
    if (bytes <= 0) return;
    const bool nic = !s_.settings.topology.SameNode(from, to);
    // One lookup at a time: an insertion may move the map's entries.
    {
      RankBytes& f = forwards_[from];
      (nic ? f.nic_sent : f.nvlink_sent) += bytes;
    }
    RankBytes& t = forwards_[to];
    (nic ? t.nic_received : t.nvlink_received) += bytes;
  }

  // The relays' second launch into `*out` (after, after_latency): one
  // launch, its busiest rank's seconds; its bytes to the totals.
  void FinishForwards(PhaseLaunch* out) {
    if (forwards_.empty()) return;
    double seconds = 0;
    for (const auto& [r, b] : forwards_) {
      seconds = std::max(
          {seconds,
           std::max(b.nvlink_sent, b.nvlink_received) / LinkRate(false),
           std::max(b.nic_sent, b.nic_received) / LinkRate(true)});
      RankBytes& t = s_.totals[r];
      t.nvlink_sent += b.nvlink_sent;
      t.nvlink_received += b.nvlink_received;
      t.nic_sent += b.nic_sent;
      t.nic_received += b.nic_received;
    }
    forwards_.clear();
    out->moves = true;
    out->after_latency = s_.settings.topology.links.latency_us * 1e-6;
    out->after = out->after_latency + seconds;
  }

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
  std::vector<Part> parts_;  // by owner group
  // The bucket's exchanged items (kExchangeToOwner or kExchangeFromOwner,
  // in the bucket's order): their elements and owners.
  std::vector<int64_t> exchange_sizes_;
  std::vector<int32_t> exchange_owners_;
  bool exchange_update_ = false;
  // By rank: the bytes relays pass on in the phase's second launch.
  absl::flat_hash_map<int, RankBytes> forwards_;
};

struct Clocked {
  double agreed = 0;            // the agreement ends
  double gradients_landed = 0;  // the last gradients-to-owners phase ends
  double stage = 0;             // every update landed, compute done
  double transfer = 0;          // busy time of the transfer timeline
  double latency = 0;
  int phases = 0;
  int exchange_launches = 0;
  std::vector<double> compute_end;  // per worker
  std::vector<double> stage_begin;  // per worker: 0 or `agreed`
  // Each updates-back phase, in the schedule's order: its bucket, and when
  // its last update has landed (its collective's end, or its last
  // writer's copies).
  std::vector<int> update_buckets;
  std::vector<double> updates_landed;
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

// Per worker, the stack (StepSchedule::stacks index) it computes ahead of
// the agreement, or -1: its first in the order, where every item of it is
// replicated and the worker has a trainer (no gradient is sent to it).
std::vector<int> StacksAhead(const std::vector<MatrixSpec>& matrices,
                             const StepSchedule& schedule, int workers) {
  std::vector<bool> trainer(workers, true);
  for (const Bucket& b : schedule.buckets) {
    for (const Transfer& x : b.to_owners) {
      if (x.kind == TransferKind::kSendToOwner) trainer[x.owner] = false;
    }
  }
  std::vector<int> out(workers, -1);
  std::vector<bool> seen(workers, false);
  for (const scheduler::Phase& p : schedule.order) {
    if (p.kind != PhaseKind::kCompute) continue;
    const OwnerStack& stack = schedule.stacks[p.index];
    if (seen[stack.owner]) continue;
    seen[stack.owner] = true;
    const bool in_place = std::all_of(
        stack.items.begin(), stack.items.end(), [&](const ItemRef& item) {
          return matrices[item.matrix].layout == Layout::kReplicated;
        });
    if (in_place && trainer[stack.owner]) out[stack.owner] = p.index;
  }
  return out;
}

// Clocks the schedule as the header's model says: every gradients-to-owners
// phase first, then the order's compute (each stack after its ready
// bucket's gradients) and updates back (each after all compute issued
// before it, on every worker). With exchange nodes, each sequence of phases
// issued back to back (every gradients-to-owners phase; each run of
// consecutive updates-back phases in the order) is pipelined.
Clocked Clock(const std::vector<MatrixSpec>& matrices,
              const StepSchedule& schedule,
              const std::vector<double>& stack_seconds, int workers,
              const ClockSettings& settings, PhaseState* state) {
  Clocked out;
  // Every transfer, and every stack but those computed ahead, waits for
  // the agreement.
  out.agreed = AgreementSeconds(workers, settings);
  const std::vector<int> ahead = StacksAhead(matrices, schedule, workers);
  // End of the last phase on the transfer timeline.
  double timeline = out.agreed;
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
  const bool pipelined = !state->exchange_nodes.empty();
  const auto launch = [&](const std::vector<Transfer>& transfers) {
    Phase phase(state);
    for (const Transfer& x : transfers) {
      phase.Add(x, matrices[x.item.matrix]);
    }
    return phase.Launch();
  };
  // Launches `phases`, issued back to back from `timeline`, as the
  // exchange's pipeline (see the header): launch t holds step t - j of the
  // j-th phase that moves something, and that phase's other transfers go
  // in the launch of its step 0. `*landed`: when each phase's last launch
  // ends (one that moves nothing: with the one before it, or at the start).
  const auto pipeline = [&](const std::vector<PhaseLaunch>& phases,
                            std::vector<double>* landed) {
    const LinkFigures& l = settings.topology.links;
    std::vector<size_t> moving;  // the j-th phase that moves something
    size_t launches = 0, longest = 1;
    const auto steps_of = [&](size_t j) {
      return std::max<size_t>(1, phases[moving[j]].steps.size());
    };
    for (size_t i = 0; i < phases.size(); ++i) {
      if (!phases[i].moves) continue;
      moving.push_back(i);
      const size_t j = moving.size() - 1;
      longest = std::max(longest, steps_of(j));
      launches = std::max(launches, j + steps_of(j));
    }
    const double start = timeline;
    std::vector<double> ends(moving.size(), start);
    for (size_t t = 0; t < launches; ++t) {
      const size_t first = t + 1 > longest ? t + 1 - longest : 0;
      const size_t last = std::min(t + 1, moving.size());
      double seconds = 0, latency = 0, nvlink = 0, nic = 0, hbm = 0;
      double after = 0, after_latency = 0;  // relays' second launches
      bool steps = false;
      int hops = 0;  // the most of its steps'
      for (size_t j = first; j < last; ++j) {
        const PhaseLaunch& p = phases[moving[j]];
        const size_t k = t - j;
        if (k == 0) {
          seconds = p.seconds;
          latency = p.latency;
          nvlink += p.nvlink;
          nic += p.nic;
          after += p.after;
          after_latency += p.after_latency;
        }
        if (k < p.steps.size()) {
          const LaunchStep& step = p.steps[k];
          steps = true;
          hops = std::max(hops, step.hops);
          nvlink += step.nvlink;
          nic += step.nic;
          hbm += step.hbm_before + step.hbm_after;
        }
      }
      // One launch of the steps with the other transfers: one latency and
      // its longest ring's fill; different links overlap, one link's bytes
      // add up; the HBM copies and adds run on the transfer stream around
      // it.
      if (steps) {
        latency += (l.latency_us + hops * l.hop_latency_us) * 1e-6;
        seconds = latency + std::max(nvlink, nic) + hbm;
      }
      // The relays' second launches follow the launch's group.
      seconds += after;
      latency += after_latency;
      if (seconds > 0) busy.emplace_back(timeline, timeline + seconds);
      out.transfer += seconds;
      out.latency += latency;
      timeline += seconds;
      ++out.exchange_launches;
      for (size_t j = first; j < last; ++j) {
        if (j + steps_of(j) == t + 1) ends[j] = timeline;
      }
    }
    out.phases += static_cast<int>(moving.size());
    landed->resize(phases.size());
    double before = start;
    for (size_t i = 0, j = 0; i < phases.size(); ++i) {
      if (j < moving.size() && moving[j] == i) before = ends[j++];
      (*landed)[i] = before;
    }
  };
  // A bucket without transfers lands with the one before it.
  std::vector<double> landed(schedule.buckets.size(), out.agreed);
  if (pipelined) {
    std::vector<PhaseLaunch> phases;
    std::vector<int32_t> buckets;
    for (const scheduler::Phase& p : schedule.order) {
      if (p.kind != PhaseKind::kToOwners) continue;
      phases.push_back(launch(schedule.buckets[p.index].to_owners));
      buckets.push_back(p.index);
    }
    std::vector<double> at;
    pipeline(phases, &at);
    for (size_t k = 0; k < buckets.size(); ++k) landed[buckets[k]] = at[k];
  } else {
    for (const scheduler::Phase& p : schedule.order) {
      if (p.kind != PhaseKind::kToOwners) continue;
      run(schedule.buckets[p.index].to_owners);
      landed[p.index] = timeline;
    }
  }
  out.gradients_landed = timeline;
  // Compute issued so far ends by `compute_free[w]` on worker w.
  std::vector<double>& compute_free = out.compute_end;
  compute_free.assign(workers, out.agreed);
  out.stage_begin.assign(workers, out.agreed);
  for (int w = 0; w < workers; ++w) {
    if (ahead[w] >= 0) out.stage_begin[w] = 0;
  }
  double compute_so_far = 0;  // max of compute_free
  // Peer writes: each owner's own transfer stream (see the header), in the
  // groups that write; the others' updates go back by collectives.
  std::vector<GroupLinks>& groups = state->groups;
  const bool none_write =
      std::none_of(groups.begin(), groups.end(),
                   [](const GroupLinks& g) { return g.writes; });
  std::vector<double> write_free(workers, out.agreed);
  const double copy_rate = settings.topology.links.copy_engine_gbs * 1e9;
  const auto write = [&](const std::vector<Transfer>& transfers) {
    std::vector<double> bytes(workers, 0.0);
    for (const Transfer& x : transfers) {
      const MatrixSpec& spec = matrices[x.item.matrix];
      const double s = static_cast<double>(spec.rows * spec.cols *
                                           settings.update_bytes_per_element);
      GroupLinks& group = groups[x.group];
      bytes[x.owner] += s * (group.n - 1);
      // Every member receives s, its owner sends (n - 1) s and none to
      // itself.
      group.ring_totals.nvlink_received += s;
      state->totals[x.owner].nvlink_received -= s;
      state->totals[x.owner].nvlink_sent += s * (group.n - 1);
    }
    // The groups write at once: the busiest one's writes count.
    std::vector<double> group_seconds(groups.size(), 0.0);
    std::vector<int> group_writes(groups.size(), 0);
    for (int w = 0; w < workers; ++w) {
      if (bytes[w] == 0) continue;
      const double seconds = bytes[w] / copy_rate;
      write_free[w] = std::max(write_free[w], compute_free[w]) + seconds;
      group_seconds[state->group_of[w]] += seconds;
      ++group_writes[state->group_of[w]];
    }
    out.transfer +=
        *std::max_element(group_seconds.begin(), group_seconds.end());
    out.phases += *std::max_element(group_writes.begin(), group_writes.end());
  };
  std::vector<Transfer> written, collective;  // of one bucket, when mixed
  // Writes the updates of `from` that go by peer writes, where a group
  // writes, noting when they have landed in `*landed_at`; returns the
  // others, which go by collectives (null for none).
  const auto by_collectives =
      [&](const std::vector<Transfer>& from,
          double* landed_at) -> const std::vector<Transfer>* {
    if (none_write) return &from;
    written.clear();
    collective.clear();
    for (const Transfer& x : from) {
      const GroupLinks& group = groups[x.group];
      // Updates the exchange carries never go by peer writes.
      (group.writes && !x.by_collective &&
               x.kind != TransferKind::kExchangeFromOwner
           ? written
           : collective)
          .push_back(x);
    }
    write(written);
    for (const Transfer& x : written) {
      *landed_at = std::max(*landed_at, write_free[x.owner]);
    }
    return collective.empty() ? nullptr : &collective;
  };
  const std::vector<scheduler::Phase>& order = schedule.order;
  for (size_t i = 0; i < order.size(); ++i) {
    const scheduler::Phase& p = order[i];
    if (p.kind == PhaseKind::kCompute) {
      const OwnerStack& stack = schedule.stacks[p.index];
      double& free = compute_free[stack.owner];
      // Phases issued later wait for this compute: `busy` has every phase
      // it can overlap.
      const double start = p.index == ahead[stack.owner]
                               ? 0.0
                               : std::max(free, landed[stack.ready_bucket]);
      free = ComputeEnd(start, stack_seconds[p.index], busy,
                        settings.transfer_contention);
      compute_so_far = std::max(compute_so_far, free);
    } else if (p.kind == PhaseKind::kFromOwners && pipelined) {
      // The run of updates-back phases from here (consecutive in the
      // order), one pipeline.
      const size_t first = out.updates_landed.size();
      std::vector<PhaseLaunch> phases;
      std::vector<bool> collectives;  // by phase: some update goes by one
      bool moves = none_write;
      for (; i < order.size() && order[i].kind == PhaseKind::kFromOwners; ++i) {
        out.update_buckets.push_back(order[i].index);
        out.updates_landed.push_back(0.0);
        const std::vector<Transfer>* from =
            by_collectives(schedule.buckets[order[i].index].from_owners,
                           &out.updates_landed.back());
        collectives.push_back(from != nullptr);
        phases.push_back(from != nullptr ? launch(*from) : PhaseLaunch{});
        moves = moves || from != nullptr;
      }
      --i;
      if (!moves) continue;
      timeline = std::max(timeline, compute_so_far);
      std::vector<double> at;
      pipeline(phases, &at);
      for (size_t k = 0; k < phases.size(); ++k) {
        double& landed_at = out.updates_landed[first + k];
        if (collectives[k]) landed_at = std::max(landed_at, at[k]);
      }
    } else if (p.kind == PhaseKind::kFromOwners) {
      out.update_buckets.push_back(p.index);
      double& landed_at = out.updates_landed.emplace_back(0.0);
      const std::vector<Transfer>* from =
          by_collectives(schedule.buckets[p.index].from_owners, &landed_at);
      if (from == nullptr) continue;
      timeline = std::max(timeline, compute_so_far);
      run(*from);
      landed_at = std::max(landed_at, timeline);
    }
  }
  out.stage = std::max(timeline, compute_so_far);
  for (const double free : write_free) out.stage = std::max(out.stage, free);
  return out;
}

// When the last worker's applies before the votes end (ClockSettings::
// apply_early): each worker's compute stream, once its own stacks are done,
// applies each bucket's updates once they have landed, in the schedule's
// order, each parameter its trainer keeps copied aside first (as
// ApplySeconds counts it, plus the copy's read and write).
double EarlyApplyEnd(const std::vector<MatrixSpec>& matrices,
                     const StepSchedule& schedule, const Clocked& clock,
                     const std::vector<double>& compute_end, int workers,
                     const ClockSettings& settings) {
  std::vector<double> seconds(clock.update_buckets.size(), 0.0);
  for (size_t k = 0; k < clock.update_buckets.size(); ++k) {
    for (const Transfer& x :
         schedule.buckets[clock.update_buckets[k]].from_owners) {
      // Each group sends every update to its own members: a worker applies
      // one copy of each.
      if (x.group != 0) continue;
      const MatrixSpec& spec = matrices[x.item.matrix];
      const double elements = static_cast<double>(spec.rows * spec.cols);
      seconds[k] += ApplyBeforeVotesSeconds(
          spec.layout == Layout::kRowSharded ? elements / workers : elements,
          settings);
    }
  }
  // A worker starting at c ends at max(c + every bucket's seconds, the
  // latest over k of bucket k's landing + the seconds of k and after): the
  // worker whose stacks end last ends last.
  double after = 0;  // seconds of buckets k and after
  double end = 0;
  for (size_t k = seconds.size(); k-- > 0;) {
    after += seconds[k];
    end = std::max(end, clock.updates_landed[k] + after);
  }
  const double last =
      workers > 0 ? *std::max_element(compute_end.begin(), compute_end.end())
                  : 0.0;
  return std::max(end, last + after);
}

// Whether every owner group of `plan` (all its workers, without groups)
// is on one node. False for ranks out of the topology's range: the
// schedule reports those.
bool GroupsWithinNodes(const OwnershipPlan& plan, const Topology& topology) {
  if (topology.node.empty()) return true;
  const int32_t workers = static_cast<int32_t>(topology.node.size());
  const auto within = [&](const std::vector<int32_t>& members) {
    for (const int32_t r : members) {
      if (r < 0 || r >= workers) return false;
      if (topology.node[r] != topology.node[members[0]]) return false;
    }
    return true;
  };
  if (plan.groups.empty()) return topology.nodes() == 1;
  return std::all_of(plan.groups.begin(), plan.groups.end(), within);
}

// The nodes of `topology`'s `workers` ranks, each node's ranks in rank
// order, the nodes by number; none (empty) unless the ranks span at least
// two nodes and every node has as many.
std::vector<std::vector<int32_t>> EqualNodes(const Topology& topology,
                                             int workers) {
  if (topology.node.size() != static_cast<size_t>(workers)) return {};
  absl::flat_hash_map<int32_t, std::vector<int32_t>> by_node;
  for (int r = 0; r < workers; ++r) by_node[topology.node[r]].push_back(r);
  if (by_node.size() < 2) return {};
  std::vector<std::pair<int32_t, std::vector<int32_t>>> numbered(
      std::make_move_iterator(by_node.begin()),
      std::make_move_iterator(by_node.end()));
  std::sort(numbered.begin(), numbered.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  const size_t size = numbered[0].second.size();
  std::vector<std::vector<int32_t>> nodes;
  nodes.reserve(numbered.size());
  for (auto& [number, members] : numbered) {
    if (members.size() != size) return {};
    nodes.push_back(std::move(members));
  }
  return nodes;
}

}  // namespace

Topology Topology::Blocks(int workers, int per_node) {
  Topology t;
  t.node.resize(std::max(workers, 0));
  for (int r = 0; r < workers; ++r) t.node[r] = r / std::max(per_node, 1);
  return t;
}

std::vector<OwnerGrouping> ChooseOwnerGroupings(
    const std::vector<MatrixSpec>& matrices, const Topology& topology,
    int workers, int dedicated) {
  if (dedicated != 0) return {};
  for (const MatrixSpec& spec : matrices) {
    if (spec.layout != Layout::kReplicated) return {};
  }
  const std::vector<std::vector<int32_t>> nodes = EqualNodes(topology, workers);
  const int count = static_cast<int>(nodes.size());
  std::vector<OwnerGrouping> out;
  for (int k = 1; k < count; ++k) {
    if (count % k != 0) continue;
    OwnerGrouping grouping(count / k);
    for (int n = 0; n < count; ++n) {
      std::vector<int32_t>& group = grouping[n / k];
      group.insert(group.end(), nodes[n].begin(), nodes[n].end());
    }
    for (std::vector<int32_t>& group : grouping) {
      std::sort(group.begin(), group.end());
    }
    out.push_back(std::move(grouping));
  }
  return out;
}

std::vector<std::vector<int32_t>> ChooseExchangeNodes(
    const std::vector<MatrixSpec>& matrices, const Topology& topology,
    int workers, int dedicated) {
  if (dedicated != 0) return {};
  std::vector<std::vector<int32_t>> nodes = EqualNodes(topology, workers);
  // Only where they change some matrix's transfers: unreduced ones summed
  // in two levels, or rows relayed.
  if (SumsOverNodes(nodes, matrices) ||
      std::any_of(matrices.begin(), matrices.end(),
                  [&](const MatrixSpec& m) { return RelaysRows(nodes, m); })) {
    return nodes;
  }
  return {};
}

std::vector<int32_t> Topology::NodesOf(
    const std::vector<int32_t>& ranks) const {
  std::vector<int32_t> out;
  if (node.empty()) return out;
  out.reserve(ranks.size());
  for (const int32_t r : ranks) out.push_back(node[r]);
  return out;
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

std::vector<double> StackSeconds(const std::vector<MatrixSpec>& matrices,
                                 const StepSchedule& schedule,
                                 const std::vector<const CostModel*>& models,
                                 const ClockSettings& settings) {
  std::vector<double> out;
  out.reserve(schedule.stacks.size());
  for (const OwnerStack& s : schedule.stacks) {
    const CostModel& model = *models[s.owner];
    double seconds = 0;
    for (const StackChunk& chunk : s.chunks) {
      seconds += model.NsSeconds(s.rows, s.cols, chunk.count, chunk.algorithm);
    }
    double bytes = 0;
    for (const ItemRef& item : s.items) {
      bytes += kMomentumBytesPerElement +
               (matrices[item.matrix].layout == Layout::kUnreduced
                    ? kMeanBytesPerElement
                    : 0);
    }
    bytes *= static_cast<double>(s.rows * s.cols);
    out.push_back(seconds +
                  bytes / settings.hbm_bytes_per_second / model.speed());
  }
  return out;
}

StepClock ClockStep(const std::vector<MatrixSpec>& matrices,
                    const StepSchedule& schedule,
                    const std::vector<double>& stack_seconds, int workers,
                    const ClockSettings& settings) {
  StepClock r;
  const int n = workers;
  PhaseState state(matrices, schedule, workers, settings);
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
  r.exchange_launches = clock.exchange_launches;
  r.worker_compute_end_seconds = std::move(clock.compute_end);
  r.agreement_seconds = clock.agreed;
  r.worker_stage_begin_seconds = std::move(clock.stage_begin);

  // The commit: every worker applies what its trainer holds, or what is
  // left of its applies before the votes.
  r.apply_seconds = ApplySeconds(matrices, n, settings);
  if (settings.apply_early && n > 1 &&
      MayApplyBeforeVotes(matrices, state.groups.size())) {
    ApplyWays& ways = r.applies;
    ways.at_commit_seconds = r.apply_seconds;
    ways.left_seconds =
        std::max(0.0, EarlyApplyEnd(matrices, schedule, clock,
                                    r.worker_compute_end_seconds, n, settings) -
                          r.stage_seconds);
    ways.before_votes = ways.left_seconds < ways.at_commit_seconds;
    if (ways.before_votes) r.apply_seconds = ways.left_seconds;
  }
  r.commit_seconds = VoteSeconds(n, settings) + r.apply_seconds;
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
  for (int w = 0; w < n; ++w) {
    const RankBytes& ring = state.groups[state.group_of[w]].ring_totals;
    const RankBytes& t = state.totals[w];
    bytes = std::max(
        {bytes, ring.nvlink_sent + ring.nic_sent + t.nvlink_sent + t.nic_sent,
         ring.nvlink_received + ring.nic_received + t.nvlink_received +
             t.nic_received});
  }
  r.bytes_per_gpu = std::llround(bytes);
  return r;
}

bool MayApplyBeforeVotes(const std::vector<MatrixSpec>& matrices,
                         size_t groups) {
  if (groups <= 1) return true;
  for (const MatrixSpec& m : matrices) {
    if (m.layout == Layout::kRowSharded) return false;
  }
  return true;
}

double ControlMessagesOnPath(int workers, int fanout) {
  if (workers <= 1) return 0;
  if (fanout <= 0 || fanout >= workers - 1) return 2.0 * (workers - 1);
  const int depth = RankTree(workers, fanout).Depth();
  return 2.0 * (fanout + (depth - 1) * (fanout + 1.0));
}

namespace {

// One round among `workers` ranks whose fixed part is `ms`.
double RoundSeconds(double ms, int workers, const ClockSettings& settings) {
  if (workers <= 1) return 0;
  return ms * 1e-3 +
         ControlMessagesOnPath(workers, settings.control_tree_fanout) *
             settings.control_message_us * 1e-6;
}

}  // namespace

double AgreementSeconds(int workers, const ClockSettings& settings) {
  return RoundSeconds(settings.agreement_ms, workers, settings);
}

double VoteSeconds(int workers, const ClockSettings& settings) {
  return RoundSeconds(settings.control_rounds_ms - settings.agreement_ms,
                      workers, settings);
}

double ControlSeconds(int workers, const ClockSettings& settings) {
  return AgreementSeconds(workers, settings) + VoteSeconds(workers, settings);
}

double ApplyBeforeVotesSeconds(double elements, const ClockSettings& settings) {
  return elements * (4 * 4 + settings.update_bytes_per_element) /
         settings.hbm_bytes_per_second;
}

double ApplySeconds(const std::vector<MatrixSpec>& matrices, int workers,
                    const ClockSettings& settings) {
  double applied = 0;  // parameters per worker
  for (const MatrixSpec& m : matrices) {
    const double elements = static_cast<double>(m.rows * m.cols * m.experts);
    applied += m.layout == Layout::kRowSharded ? elements / workers : elements;
  }
  // The fp32 parameter read and written, the update read.
  return applied * (2 * 4 + settings.update_bytes_per_element) /
         settings.hbm_bytes_per_second;
}

std::vector<int64_t> BucketBoundsTried(
    const std::vector<MatrixSpec>& matrices) {
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
  return bounds;
}

absl::StatusOr<StepGrouping> ChooseStepGrouping(
    const std::vector<MatrixSpec>& matrices, const OwnershipPlan& plan,
    const std::vector<const CostModel*>& models, const ClockSettings& settings,
    const ScheduleOptions& options) {
  StepGrouping out;
  if (options.bucket_bytes > 0 || GroupsWithinNodes(plan, settings.topology)) {
    if (options.bucket_bytes > 0) out.bucket_bytes = options.bucket_bytes;
    MUONPS_ASSIGN_OR_RETURN(
        StepScheduleCutter cutter,
        StepScheduleCutter::Create(matrices, plan, options.stack_bytes));
    out.schedule = cutter.TakeStacks();
    MUONPS_RETURN_IF_ERROR(cutter.Cut(out.bucket_bytes, &out.schedule));
    return out;
  }
  const std::vector<int64_t> bounds = BucketBoundsTried(matrices);
  MUONPS_ASSIGN_OR_RETURN(
      StepScheduleCutter cutter,
      StepScheduleCutter::Create(matrices, plan, options.stack_bytes));
  // Every candidate has the same stacks: one schedule, cut again for each,
  // and their seconds once.
  StepSchedule schedule = cutter.TakeStacks();
  const int workers = static_cast<int>(plan.worker_ids.size());
  const std::vector<double> stack_seconds =
      StackSeconds(matrices, schedule, models, settings);
  out.predicted_seconds = std::numeric_limits<double>::infinity();
  // Each bound's least step (StepBound, where it holds): one that cannot
  // beat the best so far is neither cut nor clocked, and counts as a miss.
  std::vector<double> least;
  if (static_cast<int>(settings.topology.node.size()) == workers) {
    std::vector<double> busy(workers, 0.0);
    for (size_t s = 0; s < schedule.stacks.size(); ++s) {
      busy[schedule.stacks[s].owner] += stack_seconds[s];
    }
    std::vector<int32_t> ranks(workers);
    std::iota(ranks.begin(), ranks.end(), 0);
    least = StepBound(matrices, settings, {.bucket_bytes = 0}, plan.dedicated)
                .CutSeconds(ranks, *std::max_element(busy.begin(), busy.end()));
  }
  // Two bounds in a row that do not beat the best end the search. The
  // best cut so far is kept aside (its buckets, order and the stacks' ready
  // buckets), not cut again.
  int misses = 0;
  std::vector<Bucket> best_buckets;
  decltype(schedule.order) best_order;
  std::vector<int32_t> best_ready(schedule.stacks.size());
  for (size_t i = 0; i < bounds.size() && misses < 2; ++i) {
    if (i < least.size() && least[i] >= out.predicted_seconds) {
      ++misses;
      continue;
    }
    MUONPS_RETURN_IF_ERROR(cutter.Cut(bounds[i], &schedule));
    const StepClock clock =
        ClockStep(matrices, schedule, stack_seconds, workers, settings);
    const double predicted = clock.predicted_seconds;
    out.candidates.emplace_back(bounds[i], predicted);
    if (predicted <= out.predicted_seconds) {
      out.predicted_seconds = predicted;
      out.applies = clock.applies;
      out.bucket_bytes = bounds[i];
      best_buckets.swap(schedule.buckets);
      best_order.swap(schedule.order);
      for (size_t s = 0; s < schedule.stacks.size(); ++s) {
        best_ready[s] = schedule.stacks[s].ready_bucket;
      }
      misses = 0;
    } else {
      ++misses;
    }
  }
  schedule.buckets = std::move(best_buckets);
  schedule.order = std::move(best_order);
  for (size_t s = 0; s < schedule.stacks.size(); ++s) {
    schedule.stacks[s].ready_bucket = best_ready[s];
  }
  out.schedule = std::move(schedule);
  return out;
}

namespace {

// PlanOnTopology's choice of plan, groups and schedule (its comment), before
// the applies are weighed.
absl::StatusOr<TopologyPlan> ChoosePlanOnTopology(
    const std::vector<MatrixSpec>& matrices,
    const std::vector<std::string>& worker_ids, int dedicated,
    const std::vector<const CostModel*>& models, const ClockSettings& settings,
    const ScheduleOptions& options, const std::vector<OwnerGrouping>& offered,
    OwnerGroupsUse use, const PlanRanks& plan_ranks) {
  const auto scheduled =
      [&](OwnershipPlan plan, const std::vector<const CostModel*>& by_rank,
          const ClockSettings& on,
          const ScheduleOptions& cut) -> absl::StatusOr<TopologyPlan> {
    plan.dedicated = dedicated;
    TopologyPlan out;
    MUONPS_ASSIGN_OR_RETURN(
        out.grouping, ChooseStepGrouping(matrices, plan, by_rank, on, cut));
    out.plan = std::move(plan);
    return out;
  };
  // A step's prediction: the grouping's, else (a bound the job set, or one
  // node) the schedule clocked once.
  const auto predicted = [&](const TopologyPlan& p,
                             const std::vector<const CostModel*>& by_rank,
                             const ClockSettings& on) {
    if (p.grouping.predicted_seconds > 0) return p.grouping.predicted_seconds;
    const std::vector<double> stacks =
        StackSeconds(matrices, p.grouping.schedule, by_rank, on);
    return ClockStep(matrices, p.grouping.schedule, stacks,
                     static_cast<int>(p.plan.worker_ids.size()), on)
        .predicted_seconds;
  };
  // Trainers that hold whole experts: the plan with every expert where it
  // is held, against `free` (experts there only where that costs nothing),
  // by the clock; the faster stands.
  const bool holders =
      HoldsWholeExperts(matrices) && settings.trainer_shards.known();
  const auto weigh_holders = [&](TopologyPlan free,
                                 const std::vector<int32_t>& ranks,
                                 const OwnerGrouping* grouping) {
    if (!holders) return free;
    absl::StatusOr<OwnershipPlan> one = plan_ranks(ranks, grouping, true);
    if (!one.ok()) return free;
    absl::StatusOr<TopologyPlan> at = scheduled(
        grouping == nullptr
            ? *std::move(one)
            : ReplicateOverGroups(*std::move(one), *grouping, worker_ids),
        models, settings, options);
    if (!at.ok()) return free;
    const double free_seconds = predicted(free, models, settings);
    const double at_seconds = predicted(*at, models, settings);
    TopologyPlan out = at_seconds < free_seconds ? *std::move(at) : free;
    out.weighed.experts_at_holders = at_seconds < free_seconds;
    out.weighed.at_holders_seconds = at_seconds;
    out.weighed.where_free_seconds = free_seconds;
    return out;
  };
  const auto annotate = [](const absl::Status& status,
                           const OwnerGrouping& grouping) {
    return Annotate(status, absl::StrCat("one owner group of ",
                                         grouping[0].size(), " workers"));
  };
  if (use == OwnerGroupsUse::kRequired) {
    if (offered.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("owner groups: ", offered.size(),
                       " groupings required, where a plan takes one"));
    }
    absl::StatusOr<OwnershipPlan> one =
        plan_ranks(offered[0][0], &offered[0], false);
    if (!one.ok()) return annotate(one.status(), offered[0]);
    absl::StatusOr<TopologyPlan> out =
        scheduled(ReplicateOverGroups(*std::move(one), offered[0], worker_ids),
                  models, settings, options);
    if (!out.ok()) return out;
    out = weigh_holders(*std::move(out), offered[0][0], &offered[0]);
    out->weighed.grouped_seconds = out->grouping.predicted_seconds;
    return out;
  }
  // A grouping clocked as its first group alone on that group's nodes.
  struct Grouped {
    absl::StatusOr<TopologyPlan> first_group =
        absl::FailedPreconditionError("no owner groups on offer");
    const OwnerGrouping* grouping = nullptr;
    double seconds = 0;
  };
  const auto plan_group = [&](const OwnerGrouping& grouping) {
    Grouped out;
    out.grouping = &grouping;
    const std::vector<int32_t>& ranks = grouping[0];
    absl::StatusOr<OwnershipPlan> one = plan_ranks(ranks, &grouping, false);
    if (!one.ok()) {
      out.first_group = annotate(one.status(), grouping);
      return out;
    }
    std::vector<const CostModel*> by_rank;
    ClockSettings alone = settings;
    alone.topology.node.clear();
    alone.apply_early =
        settings.apply_early && MayApplyBeforeVotes(matrices, grouping.size());
    for (const int32_t r : ranks) {
      by_rank.push_back(models[r]);
      if (!settings.topology.node.empty()) {
        alone.topology.node.push_back(settings.topology.node[r]);
      }
    }
    out.first_group = scheduled(*std::move(one), by_rank, alone, options);
    if (!out.first_group.ok()) {
      out.first_group = annotate(out.first_group.status(), grouping);
      return out;
    }
    out.seconds = predicted(*out.first_group, by_rank, alone);
    return out;
  };
  std::vector<int32_t> all(worker_ids.size());
  std::iota(all.begin(), all.end(), 0);
  // The groupings on a thread of their own while this one plans every
  // worker: the two are independent, and a coordinator has the cores.
  Grouped best;
  std::vector<std::pair<int, double>> tried;
  std::string passed_over;  // why a grouping was passed over unplanned
  std::thread grouping;
  // No worker is faster than the fastest model: a group of m workers
  // computes the Newton-Schulz set in no less than work / (m * fastest).
  double fastest = 0;
  for (const CostModel* m : models) fastest = std::max(fastest, m->speed());
  // The plan of every worker's predicted step and its Newton-Schulz work
  // (no more than a group's: it may use every worker's model), told to the
  // groupings' thread once known (an infinite step where it failed).
  struct Every {
    double seconds = std::numeric_limits<double>::infinity();
    double work = 0;
  };
  std::promise<Every> every_known;
  const std::shared_future<Every> every_done = every_known.get_future().share();
  // What the groupings planned at once found (the best one's predicted
  // step, infinite for none, and their Newton-Schulz work), told once the
  // thread reaches a grouping that waits for the plan of every worker, or
  // its end.
  struct AtOnce {
    double seconds = std::numeric_limits<double>::infinity();
    double work = 0;
  };
  std::promise<AtOnce> at_once_known;
  std::future<AtOnce> at_once_done = at_once_known.get_future();
  const StepBound bound(matrices, settings, options, dedicated);
  if (!offered.empty()) {
    grouping = std::thread([&] {
      absl::Status first_failure;
      int misses = 0;
      double work = 0;  // of the last grouping planned (Problem::Work)
      bool told = false;
      const auto tell = [&] {
        if (told) return;
        told = true;
        at_once_known.set_value({best.first_group.ok()
                                     ? best.seconds
                                     : std::numeric_limits<double>::infinity(),
                                 work});
      };
      const double every_transfers = bound.Seconds(all, 0);
      // A grouping's transfers must save at least this fraction of the
      // plan of every worker's bound for it to be planned before that plan
      // is known.
      constexpr double kWaitMargin = 0.01;
      // Groups of one node first (their updates cross no network port, so
      // they may win where every larger grouping loses), then the larger
      // ones, largest first: each smaller one computes more per worker.
      std::vector<size_t> order = {0};
      for (size_t i = offered.size(); i-- > 1;) order.push_back(i);
      for (size_t k = 0; k < order.size() && misses < 2; ++k) {
        const size_t i = order[k];
        const int members = static_cast<int>(offered[i][0].size());
        if (k > 0 && best.first_group.ok() && work > 0 && fastest > 0 &&
            work / (members * fastest) >= best.seconds) {
          break;  // its compute alone outlasts the best: so do smaller ones
        }
        // A grouping whose transfers alone save less than kWaitMargin of
        // the plan of every worker's bound computes several times more on
        // each worker: it wins only where that plan turns out worse than
        // its bound. So wait for that plan, and where the grouping's bound
        // with its compute does not beat it, pass it over unplanned (a
        // miss). Elsewhere it is planned at once, beside that plan.
        const double transfers = bound.Seconds(offered[i][0], 0);
        if (transfers > 0 && transfers >= every_transfers * (1 - kWaitMargin)) {
          tell();
          const Every every = every_done.get();
          const double least = bound.Seconds(
              offered[i][0],
              fastest > 0 ? every.work / (members * fastest) : 0.0);
          if (least > every.seconds) {
            tried.emplace_back(members, 0.0);
            if (passed_over.empty()) {
              passed_over = absl::StrCat(
                  "a step of at least ", least * 1e3, " ms with ",
                  offered[i].size(), " owner groups of ", members,
                  " workers against ", every.seconds * 1e3, " ms without");
            }
            if (k > 0) ++misses;
            continue;
          }
        }
        Grouped next = plan_group(offered[i]);
        tried.emplace_back(members, next.seconds);
        if (!next.first_group.ok()) {
          if (first_failure.ok()) first_failure = next.first_group.status();
          // Smaller groups hold less memory: they fail alike.
          if (k > 0) break;
          continue;
        }
        work = next.first_group->plan.work_seconds;
        if (!best.first_group.ok() || next.seconds < best.seconds) {
          best = std::move(next);
          if (k > 0) misses = 0;
        } else if (k > 0) {
          ++misses;
        }
      }
      tell();
      if (!best.first_group.ok() && !first_failure.ok()) {
        best.first_group = first_failure;
      }
    });
  }
  // The best grouping's plan over all its groups (once the groupings'
  // thread is done). Its schedule stays the first group's, cut where that
  // group's was: each group's is the same on its own members (the same
  // buckets), and every worker builds its own. Moves the best grouping's
  // plan out (once only); where it fails, best.first_group says why.
  const auto whole = [&]() -> absl::StatusOr<TopologyPlan> {
    TopologyPlan out = *std::move(best.first_group);
    out.plan =
        ReplicateOverGroups(std::move(out.plan), *best.grouping, worker_ids);
    out.plan.dedicated = dedicated;
    if (const absl::Status checked = CheckPlanLayout(matrices, out.plan);
        !checked.ok()) {
      best.first_group = checked;
      return checked;
    }
    out.grouping.predicted_seconds = best.seconds;
    out.weighed.groups_offered = true;
    out.weighed.grouped_seconds = best.seconds;
    out.weighed.grouped_candidates = tried;
    return out;
  };
  // The best grouping planned at once may already predict no more than the
  // plan of every worker's least step (its bound, with their common
  // Newton-Schulz work on every worker at the fastest model's speed): then
  // that plan cannot win and is not made. Else it is made as below.
  bool every_told = false;
  if (grouping.joinable() && bound.Seconds(all, 0) > 0) {
    const AtOnce found = at_once_done.get();
    const double least =
        found.work > 0 && fastest > 0
            ? bound.Seconds(all, found.work / (all.size() * fastest))
            : 0.0;
    if (least > 0 && found.seconds <= least) {
      every_known.set_value(Every{least, found.work});
      every_told = true;
      grouping.join();
      absl::StatusOr<TopologyPlan> out = whole();
      if (out.ok()) {
        out->weighed.ungrouped_seconds = least;
        out->weighed.ungrouped_passed_over = true;
        return out;
      }
    }
  }
  absl::StatusOr<OwnershipPlan> every = plan_ranks(all, nullptr, false);
  absl::StatusOr<TopologyPlan> scheduled_every =
      every.ok() ? scheduled(*std::move(every), models, settings, options)
                 : absl::StatusOr<TopologyPlan>(every.status());
  if (scheduled_every.ok()) {
    scheduled_every = weigh_holders(*std::move(scheduled_every), all, nullptr);
  }
  if (scheduled_every.ok() && !offered.empty()) {
    scheduled_every->weighed.ungrouped_seconds =
        predicted(*scheduled_every, models, settings);
  }
  if (!every_told) {
    every_known.set_value(
        scheduled_every.ok() ? Every{scheduled_every->weighed.ungrouped_seconds,
                                     scheduled_every->plan.work_seconds}
                             : Every{});
  }
  if (grouping.joinable()) grouping.join();
  if (!scheduled_every.ok()) {
    if (best.first_group.ok()) return whole();  // a grouped plan stands alone
    return scheduled_every.status();
  }
  TopologyPlan ungrouped = *std::move(scheduled_every);
  if (offered.empty()) return ungrouped;
  ungrouped.weighed.groups_offered = true;
  ungrouped.weighed.grouped_candidates = tried;
  if (!best.first_group.ok()) {
    ungrouped.weighed.groups_declined =
        passed_over.empty() ? best.first_group.status().ToString()
                            : passed_over;
    return ungrouped;
  }
  ungrouped.weighed.grouped_seconds = best.seconds;
  if (best.seconds <= ungrouped.weighed.ungrouped_seconds) {
    absl::StatusOr<TopologyPlan> out = whole();
    if (out.ok()) {
      out->weighed.ungrouped_seconds = ungrouped.weighed.ungrouped_seconds;
      return out;
    }
    ungrouped.weighed.groups_declined = out.status().ToString();
    return ungrouped;
  }
  ungrouped.weighed.groups_declined = absl::StrCat(
      "a step of ", best.seconds * 1e3, " ms with ", best.grouping->size(),
      " owner groups of ", (*best.grouping)[0].size(), " workers against ",
      ungrouped.weighed.ungrouped_seconds * 1e3, " ms without");
  return ungrouped;
}

// Why some worker of `plan` has no room for the buffers of `schedule`'s
// exchange nodes (ExchangeBuffersOf) beside its owned matrices, by
// settings.capacity_bytes: the first such worker, its bytes; "" where
// every one has (or capacities are not given).
std::string ExchangeRoomLacking(const std::vector<MatrixSpec>& matrices,
                                const OwnershipPlan& plan,
                                const StepSchedule& schedule,
                                const ClockSettings& settings) {
  const int workers = static_cast<int>(plan.worker_ids.size());
  if (settings.capacity_bytes.size() != plan.worker_ids.size()) return "";
  const OwnerGroups groups(plan);
  const ExchangeBuffers buffers = ExchangeBuffersOf(
      schedule, matrices, workers, groups, workers / groups.count(),
      settings.update_bytes_per_element);
  for (int r = 0; r < workers; ++r) {
    const int64_t owned = r < static_cast<int>(plan.worker_memory_bytes.size())
                              ? plan.worker_memory_bytes[r]
                              : 0;
    const int64_t exchange = buffers.Bytes(r);
    const int64_t lacking = owned + exchange - settings.capacity_bytes[r];
    if (lacking <= 0) continue;
    return absl::StrCat(
        "worker \"", plan.worker_ids[r], "\" would need ", exchange,
        " bytes for the exchange's buffers beside its ", owned,
        " bytes of owned matrices, ", lacking, " more than the ",
        settings.capacity_bytes[r], " it has beside its workspace");
  }
  return "";
}

}  // namespace

absl::StatusOr<TopologyPlan> PlanOnTopology(
    const std::vector<MatrixSpec>& matrices,
    const std::vector<std::string>& worker_ids, int dedicated,
    const std::vector<const CostModel*>& models, const ClockSettings& settings,
    const ScheduleOptions& options, const std::vector<OwnerGrouping>& offered,
    OwnerGroupsUse use, const PlanRanks& plan_ranks) {
  MUONPS_ASSIGN_OR_RETURN(
      TopologyPlan out,
      ChoosePlanOnTopology(matrices, worker_ids, dedicated, models, settings,
                           options, offered, use, plan_ranks));
  const int workers = static_cast<int>(worker_ids.size());
  // A schedule's predicted step and applies: its chosen bound's clock, or
  // (a bound not clocked) one now.
  const auto clocked = [&](const StepGrouping& g) {
    if (g.predicted_seconds > 0) {
      return std::make_pair(g.predicted_seconds, g.applies);
    }
    const StepClock clock =
        ClockStep(matrices, g.schedule,
                  StackSeconds(matrices, g.schedule, models, settings), workers,
                  settings);
    return std::make_pair(clock.predicted_seconds, clock.applies);
  };
  double predicted = 0;
  ApplyWays ways;
  bool known = false;  // predicted and ways are out.grouping's
  // The same plan with exchange nodes: only its schedule differs.
  std::vector<std::vector<int32_t>> nodes;
  if (settings.node_exchange) {
    nodes =
        ChooseExchangeNodes(matrices, settings.topology, workers, dedicated);
  }
  if (!nodes.empty()) {
    std::tie(predicted, ways) = clocked(out.grouping);
    known = true;
    // Where the exchange cannot be shorter, its schedule is not made.
    const double least =
        ExchangeStepBound(matrices, workers, static_cast<int>(nodes.size()),
                          static_cast<int>(nodes[0].size()), settings);
    if (least >= predicted) {
      out.weighed.exchange_offered = true;
      out.weighed.exchange_passed_over = true;
      out.weighed.exchange_seconds = least;
      out.weighed.rings_seconds = predicted;
      nodes.clear();
    }
  }
  if (!nodes.empty()) {
    out.plan.exchange_nodes = std::move(nodes);
    absl::StatusOr<StepGrouping> exchange =
        ChooseStepGrouping(matrices, out.plan, models, settings, options);
    bool taken = false;
    if (exchange.ok()) {
      const auto [seconds, applies] = clocked(*exchange);
      out.weighed.exchange_offered = true;
      out.weighed.exchange_seconds = seconds;
      out.weighed.rings_seconds = predicted;
      taken = seconds < predicted;
      if (taken) {
        out.weighed.exchange_declined = ExchangeRoomLacking(
            matrices, out.plan, exchange->schedule, settings);
        taken = out.weighed.exchange_declined.empty();
      }
      if (taken) {
        out.grouping = *std::move(exchange);
        predicted = seconds;
        ways = applies;
      }
    }
    if (!taken) out.plan.exchange_nodes.clear();
  }
  if (!settings.apply_early || workers < 2 ||
      !MayApplyBeforeVotes(matrices, out.plan.groups.size())) {
    return out;
  }
  if (!known) std::tie(predicted, ways) = clocked(out.grouping);
  const double rest = predicted - (ways.before_votes ? ways.left_seconds
                                                     : ways.at_commit_seconds);
  out.weighed.at_commit_seconds = rest + ways.at_commit_seconds;
  out.weighed.before_votes_seconds = rest + ways.left_seconds;
  out.weighed.apply_at_commit = !ways.before_votes;
  return out;
}

}  // namespace scheduler
}  // namespace muonps
