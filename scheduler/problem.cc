#include "scheduler/problem.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace scheduler {
namespace {

constexpr int64_t kMaxDim = int64_t{1} << 31;
constexpr int64_t kMaxExperts = int64_t{1} << 20;

// sum + each * times (each and times >= 0), or the largest int64 where that
// is larger: the sums of bytes below stay ordered whatever the input.
int64_t SaturatingAdd(int64_t sum, int64_t each, int64_t times) {
  constexpr int64_t kMost = std::numeric_limits<int64_t>::max();
  if (each > 0 && times > (kMost - sum) / each) return kMost;
  return sum + each * times;
}

absl::Status ValidateMatrix(const MatrixSpec& m, size_t index) {
  // Built only for an error: planning checks every matrix.
  auto field = [&] {
    return m.name.empty() ? absl::StrCat("matrices[", index, "]")
                          : absl::StrCat("matrix ", Quoted(m.name));
  };
  if (m.name.empty()) return InvalidField(field(), "name is empty");
  if (m.rows < 1 || m.cols < 1 || m.rows > kMaxDim || m.cols > kMaxDim) {
    return InvalidField(field(), absl::StrCat("shape [", m.rows, ", ", m.cols,
                                              "]: dimensions must be in [1, "
                                              "2^31]"));
  }
  if (m.experts < 1 || m.experts > kMaxExperts) {
    return InvalidField(
        field(), absl::StrCat("experts ", m.experts, " is not in [1, 2^20]"));
  }
  if (m.layer < 0) {
    return InvalidField(field(), absl::StrCat("layer ", m.layer, " is < 0"));
  }
  return absl::OkStatus();
}

absl::Status ValidateWorker(const WorkerSpec& w, size_t index,
                            int64_t workspace_bytes) {
  auto field = [&] {
    return w.id.empty() ? absl::StrCat("workers[", index, "]")
                        : absl::StrCat("worker ", Quoted(w.id));
  };
  if (w.id.empty()) return InvalidField(field(), "id is empty");
  if (!(w.speed > 0) || !std::isfinite(w.speed)) {
    return InvalidField(field(), absl::StrCat("speed ", w.speed,
                                              " must be positive and finite"));
  }
  if (!w.owns_nothing && w.memory_bytes <= workspace_bytes) {
    return InvalidField(field(), absl::StrCat("memory_bytes ", w.memory_bytes,
                                              " must exceed the workspace of ",
                                              workspace_bytes, " bytes"));
  }
  const DeviceRates& r = w.rates;
  for (const double rate : {r.flops_per_second, r.memory_bytes_per_second,
                            r.link_bytes_per_second}) {
    if (!(rate > 0) || !std::isfinite(rate)) {
      return InvalidField(field(), "device rates must be positive and finite");
    }
  }
  if (!(r.call_overhead_seconds >= 0) ||
      !std::isfinite(r.call_overhead_seconds)) {
    return InvalidField(field(), "call_overhead_seconds must be >= 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePlanInput(const PlanInput& input) {
  if (input.workers.empty()) return InvalidField("workers", "is empty");
  const PlanOptions& o = input.options;
  if (o.ns_steps < 1 || o.ns_steps > 100) {
    return InvalidField("ns_steps",
                        absl::StrCat(o.ns_steps, " is not in [1, 100]"));
  }
  if (o.workspace_bytes < 0) {
    return InvalidField("workspace_bytes", "must be >= 0");
  }
  if (o.max_improvements < 0) {
    return InvalidField("max_improvements", "must be >= 0");
  }
  if (!(o.replan_tolerance >= 0) || !std::isfinite(o.replan_tolerance)) {
    return InvalidField("replan_tolerance", "must be finite and >= 0");
  }
  const TrainerShards& t = input.trainer_shards;
  if (!t.shard_of.empty()) {
    if (t.shard_of.size() != input.workers.size()) {
      return InvalidField("trainer_shards",
                          absl::StrCat(t.shard_of.size(), " shards for ",
                                       input.workers.size(), " workers"));
    }
    for (size_t w = 0; w < t.shard_of.size(); ++w) {
      if (t.shard_of[w] < -1 || t.shard_of[w] >= t.shards) {
        return InvalidField(absl::StrCat("trainer_shards of worker ",
                                         Quoted(input.workers[w].id)),
                            absl::StrCat("shard ", t.shard_of[w],
                                         " is not in [-1, ", t.shards, ")"));
      }
    }
  }
  if (!input.nodes.empty()) {
    if (input.nodes.size() != input.workers.size()) {
      return InvalidField("nodes",
                          absl::StrCat(input.nodes.size(), " nodes for ",
                                       input.workers.size(), " workers"));
    }
    for (size_t w = 0; w < input.nodes.size(); ++w) {
      if (input.nodes[w] < 0) {
        return InvalidField(
            absl::StrCat("nodes of worker ", Quoted(input.workers[w].id)),
            absl::StrCat("node ", input.nodes[w], " is negative"));
      }
    }
  }
  // Worker ids and matrix names are checked for repeats in sets of their
  // own, each sized once: a set cleared and refilled gives back its table
  // (absl frees any over 127 slots) and grows again through every rehash.
  absl::flat_hash_set<absl::string_view> worker_ids;
  worker_ids.reserve(input.workers.size());
  int64_t largest_capacity = 0;
  int64_t total_capacity = 0;
  int owning = 0;
  std::string roomiest;
  for (size_t i = 0; i < input.workers.size(); ++i) {
    const WorkerSpec& w = input.workers[i];
    MUONPS_RETURN_IF_ERROR(ValidateWorker(w, i, o.workspace_bytes));
    if (!worker_ids.insert(w.id).second) {
      return InvalidField(absl::StrCat("worker ", Quoted(w.id)),
                          "id appears twice");
    }
    if (w.owns_nothing) continue;
    const int64_t capacity = w.memory_bytes - o.workspace_bytes;
    total_capacity = SaturatingAdd(total_capacity, capacity, 1);
    ++owning;
    if (capacity > largest_capacity) {
      largest_capacity = capacity;
      roomiest = w.id;
    }
  }
  if (roomiest.empty() && !input.matrices.empty()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "workers",
                      "every worker is leaving (owns_nothing): none can own "
                      "the matrices");
  }
  absl::flat_hash_set<absl::string_view> matrix_names;
  matrix_names.reserve(input.matrices.size());
  int64_t total_owned = 0;
  for (size_t i = 0; i < input.matrices.size(); ++i) {
    const MatrixSpec& m = input.matrices[i];
    MUONPS_RETURN_IF_ERROR(ValidateMatrix(m, i));
    if (!matrix_names.insert(m.name).second) {
      return InvalidField(absl::StrCat("matrix ", Quoted(m.name)),
                          "name appears twice");
    }
    if (OwnedBytes(m) > largest_capacity) {
      return FieldError(
          absl::StatusCode::kResourceExhausted,
          absl::StrCat("matrix ", Quoted(m.name)),
          absl::StrCat("needs ", OwnedBytes(m),
                       " bytes per expert to own; the roomiest worker, ",
                       Quoted(roomiest), ", has ", largest_capacity,
                       " beside its workspace"));
    }
    total_owned = SaturatingAdd(total_owned, OwnedBytes(m), m.experts);
  }
  // No placement fits more than every owning worker holds together: said
  // at once, not after a placement ran out of room.
  if (total_owned > total_capacity) {
    return FieldError(
        absl::StatusCode::kResourceExhausted, "matrices",
        absl::StrCat("need ", total_owned, " bytes to own; the ", owning,
                     " workers that may own hold ", total_capacity,
                     " together beside their workspaces"));
  }
  return absl::OkStatus();
}

Problem::Problem(const PlanInput& input) : input_(input) {
  absl::flat_hash_map<std::pair<int64_t, int64_t>, int> shape_ids;
  size_t items = 0;
  for (const MatrixSpec& spec : input.matrices) {
    items += static_cast<size_t>(spec.experts);
  }
  for (auto* v : {&owned_bytes_, &momentum_bytes_, &link_bytes_}) {
    v->reserve(items);
  }
  items_.reserve(items);
  item_shape_.reserve(items);
  for (size_t m = 0; m < input.matrices.size(); ++m) {
    const MatrixSpec& spec = input.matrices[m];
    // NS runs on the wide side: r x c and c x r batch together.
    const std::pair<int64_t, int64_t> key{std::min(spec.rows, spec.cols),
                                          std::max(spec.rows, spec.cols)};
    auto [it, inserted] =
        shape_ids.emplace(key, static_cast<int>(shapes_.size()));
    if (inserted) {
      shapes_.push_back({key.first, key.second});
      shape_count_.push_back(0);
    }
    // Replicated gradients need no transfer in; every layout sends the
    // update back out.
    const int64_t payload = PayloadBytes(spec);
    const int64_t link =
        spec.layout == Layout::kReplicated ? payload : 2 * payload;
    for (int64_t e = 0; e < spec.experts; ++e) {
      items_.push_back({static_cast<int32_t>(m), static_cast<int32_t>(e)});
      item_shape_.push_back(it->second);
      owned_bytes_.push_back(OwnedBytes(spec));
      momentum_bytes_.push_back(spec.rows * spec.cols * 4);
      link_bytes_.push_back(link);
      ++shape_count_[it->second];
    }
  }
  // Workers with the same table, rates and speed share a class (and a
  // memoized cost curve). Tables compare by what they hold: each worker's
  // is parsed from its own join.
  const auto same_costs = [](const std::shared_ptr<const CostTable>& a,
                             const std::shared_ptr<const CostTable>& b) {
    return a == b || (a != nullptr && b != nullptr && *a == *b);
  };
  std::vector<const WorkerSpec*> class_spec;
  for (const WorkerSpec& w : input.workers) {
    int c = 0;
    for (; c < static_cast<int>(class_spec.size()); ++c) {
      const WorkerSpec& o = *class_spec[c];
      if (same_costs(o.costs, w.costs) && o.speed == w.speed &&
          o.rates.flops_per_second == w.rates.flops_per_second &&
          o.rates.memory_bytes_per_second == w.rates.memory_bytes_per_second &&
          o.rates.call_overhead_seconds == w.rates.call_overhead_seconds &&
          o.rates.link_bytes_per_second == w.rates.link_bytes_per_second) {
        break;
      }
    }
    if (c == static_cast<int>(class_spec.size())) {
      class_spec.push_back(&w);
      models_.emplace_back(w.costs, w.rates, w.speed, input.options.ns_steps);
      class_speed_sum_.push_back(0);
    }
    worker_class_.push_back(c);
    class_speed_sum_[c] += w.speed;
    // A leaving worker fits nothing, so no placement gives it an item.
    capacity_.push_back(
        w.owns_nothing ? -1 : w.memory_bytes - input.options.workspace_bytes);
  }
  splitters_.resize(models_.size());
  one_seconds_.resize(models_.size());
  for (size_t c = 0; c < models_.size(); ++c) {
    splitters_[c].reserve(shapes_.size());
    one_seconds_[c].reserve(shapes_.size());
    for (const Shape& shape : shapes_) {
      splitters_[c].emplace_back(models_[c], shape.rows, shape.cols,
                                 input.options.algorithm);
      one_seconds_[c].push_back(splitters_[c].back().Seconds(1));
    }
  }
}

double Problem::TransferSeconds(int c, int i) const {
  return models_[c].TransferSeconds(static_cast<double>(link_bytes_[i]));
}

double Problem::BestStandalone(int i) const {
  double best = 0;
  for (int c = 0; c < num_classes(); ++c) {
    const double t = one_seconds_[c][item_shape_[i]] + TransferSeconds(c, i);
    if (c == 0 || t < best) best = t;
  }
  return best;
}

double Problem::Work() const {
  // Per shape: N items cost at least N times the cheapest per-matrix time
  // of any batch size up to N (for concave measured curves that is the
  // full batch; noisy curves may make a smaller batch cheaper per matrix).
  double work = 0;
  for (int s = 0; s < num_shapes(); ++s) {
    double best = 0;
    for (int c = 0; c < num_classes(); ++c) {
      double per_matrix = one_seconds_[c][s];
      for (int64_t n = 2; n <= shape_count_[s]; ++n) {
        per_matrix = std::min(per_matrix, BatchSeconds(c, s, n) / n);
      }
      const double t = per_matrix * shape_count_[s] * models_[c].speed();
      if (c == 0 || t < best) best = t;
    }
    work += best;
  }
  return work;
}

double Problem::LowerBound(double work) const {
  // Compute in "seconds at speed 1" (a class's seconds times its speed):
  // sum_w speed_w * compute_w >= the work below. Transfers do not speed up
  // with the GPU: sum_w speed_w * transfer_w >= min speed * total transfer.
  // So max load >= (work + min speed * transfers) / total speed.
  double speed_total = 0;
  double speed_min = 0;
  for (const WorkerSpec& w : input_.workers) {
    if (w.owns_nothing) continue;
    speed_min = speed_total == 0 ? w.speed : std::min(speed_min, w.speed);
    speed_total += w.speed;
  }
  double transfers = 0;
  double largest = 0;
  for (int i = 0; i < num_items(); ++i) {
    double transfer = 0;
    for (int c = 0; c < num_classes(); ++c) {
      const double t = TransferSeconds(c, i);
      if (c == 0 || t < transfer) transfer = t;
    }
    transfers += transfer;
    largest = std::max(largest, BestStandalone(i));
  }
  return std::max((work + speed_min * transfers) / speed_total, largest);
}

Assignment::Assignment(const Problem& problem)
    : problem_(problem),
      owner_(problem.num_items(), -1),
      older_(problem.num_items(), -1),
      newer_(problem.num_items(), -1),
      load_(problem.num_workers(), 0.0),
      used_bytes_(problem.num_workers(), 0),
      slots_on_(problem.num_workers()),
      holder_slots_(problem.num_shapes()) {
  // At most a slot per item: sized once rather than grown while placing.
  slots_.reserve(problem.num_items());
  slot_index_.reserve(problem.num_items());
}

int Assignment::SlotOf(int w, int shape) const {
  auto it = slot_index_.find(Key(w, shape));
  return it == slot_index_.end() ? -1 : it->second;
}

int64_t Assignment::count(int w, int shape) const {
  const int id = SlotOf(w, shape);
  return id < 0 ? 0 : slots_[id].count;
}

double Assignment::ShapeSeconds(int w, int shape, int64_t n) const {
  return problem_.BatchSeconds(problem_.worker_class(w), shape, n);
}

void Assignment::Price(Slot& slot) const {
  slot.fewer = ShapeSeconds(slot.worker, slot.shape, slot.count - 1);
  slot.now = ShapeSeconds(slot.worker, slot.shape, slot.count);
  slot.more = ShapeSeconds(slot.worker, slot.shape, slot.count + 1);
}

void Assignment::PriceOneMore(Slot& slot) const {
  slot.fewer = slot.now;
  slot.now = slot.more;
  slot.more = ShapeSeconds(slot.worker, slot.shape, slot.count + 1);
}

void Assignment::PriceOneFewer(Slot& slot) const {
  slot.more = slot.now;
  slot.now = slot.fewer;
  slot.fewer = ShapeSeconds(slot.worker, slot.shape, slot.count - 1);
}

double Assignment::LoadWith(int w, int item) const {
  const int s = problem_.shape_of(item);
  const int id = SlotOf(w, s);
  if (id >= 0) return LoadWithOnSlot(id, item);
  return load_[w] + ShapeSeconds(w, s, 1) - ShapeSeconds(w, s, 0) +
         problem_.TransferSeconds(problem_.worker_class(w), item);
}

double Assignment::LoadWithOnSlot(int id, int item) const {
  const Slot& slot = slots_[id];
  return load_[slot.worker] + slot.more - slot.now +
         problem_.TransferSeconds(problem_.worker_class(slot.worker), item);
}

double Assignment::LoadWithout(int w, int item) const {
  const Slot& slot = slots_[SlotOf(w, problem_.shape_of(item))];
  return load_[w] - (slot.now - slot.fewer) -
         problem_.TransferSeconds(problem_.worker_class(w), item);
}

void Assignment::Assign(int item, int w) {
  const double before = load_[w];
  load_[w] = LoadWith(w, item);
  total_load_ += load_[w] - before;
  used_bytes_[w] += problem_.owned_bytes(item);
  const int s = problem_.shape_of(item);
  int id = SlotOf(w, s);
  if (id < 0) {
    if (free_slots_.empty()) {
      id = static_cast<int>(slots_.size());
      slots_.emplace_back();
    } else {
      id = free_slots_.back();
      free_slots_.pop_back();
    }
    slots_[id] = Slot{w, s, 0, -1};
    Price(slots_[id]);
    slot_index_[Key(w, s)] = id;
    slots_on_[w].push_back(id);
    holder_slots_[s].push_back(id);
  }
  Slot& slot = slots_[id];
  older_[item] = slot.newest;
  newer_[item] = -1;
  if (slot.newest >= 0) newer_[slot.newest] = item;
  slot.newest = item;
  ++slot.count;
  PriceOneMore(slot);
  owner_[item] = w;
}

void Assignment::Unassign(int item) {
  const int w = owner_[item];
  const int s = problem_.shape_of(item);
  const double before = load_[w];
  load_[w] = LoadWithout(w, item);
  total_load_ += load_[w] - before;
  used_bytes_[w] -= problem_.owned_bytes(item);
  const int id = SlotOf(w, s);
  Slot& slot = slots_[id];
  if (newer_[item] >= 0) {
    older_[newer_[item]] = older_[item];
  } else {
    slot.newest = older_[item];
  }
  if (older_[item] >= 0) newer_[older_[item]] = newer_[item];
  older_[item] = newer_[item] = -1;
  owner_[item] = -1;
  if (--slot.count > 0) {
    PriceOneFewer(slot);
    return;
  }
  slot_index_.erase(Key(w, s));
  std::vector<int>& on = slots_on_[w];
  on.erase(std::find(on.begin(), on.end(), id));
  std::vector<int>& h = holder_slots_[s];
  h.erase(std::find(h.begin(), h.end(), id));
  free_slots_.push_back(id);
}

int Assignment::MaxWorker() const {
  return static_cast<int>(std::max_element(load_.begin(), load_.end()) -
                          load_.begin());
}

}  // namespace scheduler
}  // namespace muonps
