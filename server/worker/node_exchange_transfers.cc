#include "server/worker/node_exchange_transfers.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace worker {
namespace {

constexpr DType kF32 = DType::kFloat32;

std::vector<int64_t> SizesOf(const std::vector<ExchangeItem>& items) {
  std::vector<int64_t> sizes;
  sizes.reserve(items.size());
  for (const ExchangeItem& item : items) sizes.push_back(item.size);
  return sizes;
}

}  // namespace

absl::Status PrepareExchange(const scheduler::StepSchedule& schedule,
                             const scheduler::ExchangeBuffers& sizes, int rank,
                             kernels::DeviceOps& ops, ExchangeState* state) {
  if (schedule.exchange_nodes.empty()) return absl::OkStatus();
  state->at = scheduler::PositionsOf(schedule.exchange_nodes);
  state->rail.clear();
  if (rank >= 0 && rank < static_cast<int>(state->at.size()) &&
      state->at[rank].position >= 0) {
    state->rail =
        scheduler::RailsOf(schedule.exchange_nodes)[state->at[rank].position];
  }
  const int64_t packed = sizes.packed, parts = sizes.parts;
  // A bucket holds its buffers for its steps' launches, and one joins a
  // launch: no more than that many are in flight.
  const size_t slots = static_cast<size_t>(sizes.slots);
  if (state->packs.size() < slots) state->packs.resize(slots);
  if (state->parts.size() < slots) state->parts.resize(slots);
  for (size_t s = 0; s < slots; ++s) {
    if (state->packs[s] == nullptr || state->packs[s]->size() < packed) {
      state->packs[s].reset();
      MUONPS_ASSIGN_OR_RETURN(state->packs[s],
                              ops.Allocate(packed, "exchanged gradients"));
    }
    if (state->parts[s] == nullptr || state->parts[s]->size() < parts) {
      state->parts[s].reset();
      MUONPS_ASSIGN_OR_RETURN(state->parts[s],
                              ops.Allocate(parts, "exchanged parts"));
    }
  }
  return absl::OkStatus();
}

// One bucket's exchange in flight.
struct ExchangePipeline::Flight {
  Flight(int id, std::vector<ExchangeItem> items,
         const std::vector<std::vector<int32_t>>& nodes)
      : id(id), items(std::move(items)), x(nodes, SizesOf(this->items)) {}

  const int id;
  const std::vector<ExchangeItem> items;
  const scheduler::NodeExchange x;
  float* pack = nullptr;   // packed() elements (kGather: of the dtype)
  float* parts = nullptr;  // per_node() - 1 blocks
  size_t step = 0;         // the next of steps_
  // kSum: this worker's block summed within the node (from kNode on).
  float* mine = nullptr;
};

ExchangePipeline::ExchangePipeline(
    const std::vector<std::vector<int32_t>>& nodes, int rank,
    transport::Transport& transport, kernels::DeviceOps& ops,
    ExchangeState& state, Stream stream, Way way, DType dtype)
    : nodes_(nodes),
      rank_(rank),
      t_(transport),
      ops_(ops),
      state_(state),
      me_(rank >= 0 && rank < static_cast<int>(state.at.size())
              ? state.at[rank]
              : scheduler::NodePosition{}),
      stream_(stream),
      way_(way),
      dtype_(way == Way::kSum ? kF32 : dtype) {
  if (way == Way::kSum) {
    steps_ = {Step::kNode, Step::kRail, Step::kParts};
  } else {
    steps_ = {Step::kParts, Step::kRail, Step::kNode};
  }
}

ExchangePipeline::~ExchangePipeline() = default;

absl::Status ExchangePipeline::Push(int id, std::vector<ExchangeItem> items,
                                    int64_t* bytes) {
  if (!items.empty()) {
    if (me_.node < 0) {
      return absl::InternalError(
          absl::StrCat("rank ", rank_, " is on none of the exchange's nodes"));
    }
    auto f = std::make_unique<Flight>(id, std::move(items), nodes_);
    const size_t slots = state_.packs.size();
    const size_t slot = slots == 0 ? 0 : static_cast<size_t>(joined_) % slots;
    if (slots == 0 || state_.packs[slot]->size() < f->x.packed() ||
        state_.parts[slot]->size() < f->x.block() * (f->x.per_node() - 1)) {
      return absl::InternalError("the exchange's buffers were not prepared");
    }
    f->pack = state_.packs[slot]->data();
    f->parts = state_.parts[slot]->data();
    // Until the node's parts are added in: this worker's own.
    f->mine = f->pack + me_.position * f->x.block();
    if (way_ == Way::kSum) {
      for (size_t i = 0; i < f->items.size(); ++i) {
        MUONPS_RETURN_IF_ERROR(ops_.Copy(f->pack + f->x.offset(i),
                                         f->items[i].part, f->items[i].size,
                                         stream_));
      }
    }
    flights_.push_back(std::move(f));
    ++joined_;
  }
  return Launch(bytes);
}

absl::Status ExchangePipeline::Drain(int64_t* bytes) {
  while (!flights_.empty()) MUONPS_RETURN_IF_ERROR(Launch(bytes));
  return absl::OkStatus();
}

std::vector<int> ExchangePipeline::TakeDone() {
  std::vector<int> out;
  out.swap(done_);
  return out;
}

absl::Status ExchangePipeline::Launch(int64_t* bytes) {
  if (flights_.empty()) return absl::OkStatus();
  MUONPS_RETURN_IF_ERROR(t_.GroupStart());
  for (const std::unique_ptr<Flight>& f : flights_) {
    MUONPS_RETURN_IF_ERROR(Issue(*f, bytes));
  }
  MUONPS_RETURN_IF_ERROR(t_.GroupEnd());
  for (const std::unique_ptr<Flight>& f : flights_) {
    MUONPS_RETURN_IF_ERROR(Finish(*f));
    ++f->step;
  }
  // Every bucket has as many steps, so they end in the order they joined.
  while (!flights_.empty() && flights_.front()->step == steps_.size()) {
    done_.push_back(flights_.front()->id);
    flights_.erase(flights_.begin());
  }
  return absl::OkStatus();
}

absl::Status ExchangePipeline::Issue(Flight& f, int64_t* bytes) {
  const Step step = steps_[f.step];
  const scheduler::NodeExchange& x = f.x;
  const int k = me_.node;
  const int p = me_.position;
  const int64_t block = x.block();
  const int64_t width = static_cast<int64_t>(DTypeSize(dtype_));
  const int64_t base = p * block;  // this worker's block, in elements
  // kGather: the pack, of dtype_.
  const auto at = [&](int64_t element) {
    return kernels::ElementsPast(f.pack, dtype_, element);
  };
  // kSum: this worker's block, as summed so far.
  const auto in_block = [&](int64_t element) -> void* {
    return f.mine + (element - base);
  };
  const bool sum = way_ == Way::kSum;
  switch (step) {
    case Step::kNode:
      // Gradients: block q to position q, the node's parts of block p in,
      // each in a slot of its own. Updates: block p to every position, the
      // others' blocks in.
      for (int q = 0; q < x.per_node(); ++q) {
        if (q == p) continue;
        const int peer = x.worker(k, q);
        MUONPS_RETURN_IF_ERROR(
            t_.Send(at(sum ? q * block : base), block, dtype_, peer, stream_));
        *bytes += block * width;
        MUONPS_RETURN_IF_ERROR(
            t_.Recv(sum ? f.parts + (q < p ? q : q - 1) * block : at(q * block),
                    block, dtype_, peer, stream_));
      }
      return absl::OkStatus();
    case Step::kRail:
      return sum ? Rail(f, in_block, bytes) : Rail(f, at, bytes);
    case Step::kParts:
      return sum ? NodeParts(f, kF32, /*to_owner=*/true, in_block, bytes)
                 : NodeParts(f, dtype_, /*to_owner=*/false, at, bytes);
  }
  return absl::OkStatus();
}

absl::Status ExchangePipeline::Finish(Flight& f) {
  const scheduler::NodeExchange& x = f.x;
  if (way_ == Way::kGather) {
    if (f.step + 1 < steps_.size()) return absl::OkStatus();
    const int64_t width = static_cast<int64_t>(DTypeSize(dtype_));
    for (size_t i = 0; i < f.items.size(); ++i) {
      if (f.items[i].landing == nullptr) continue;
      MUONPS_RETURN_IF_ERROR(
          ops_.CopyBytes(f.items[i].landing,
                         kernels::ElementsPast(f.pack, dtype_, x.offset(i)),
                         f.items[i].size * width, stream_));
    }
    return absl::OkStatus();
  }
  if (steps_[f.step] != Step::kNode) return absl::OkStatus();
  // Added in position order into the first part.
  const int p = me_.position;
  const int64_t block = x.block();
  const auto part_of = [&](int q) {
    return q == p ? f.pack + p * block : f.parts + (q < p ? q : q - 1) * block;
  };
  f.mine = part_of(0);
  for (int q = 1; q < x.per_node(); ++q) {
    MUONPS_RETURN_IF_ERROR(AddInto(f.mine, part_of(q), block));
  }
  return absl::OkStatus();
}

absl::Status ExchangePipeline::Rail(const Flight& f,
                                    absl::FunctionRef<void*(int64_t)> at,
                                    int64_t* bytes) {
  const int p = me_.position;
  const int64_t width = static_cast<int64_t>(DTypeSize(dtype_));
  for (size_t i = 0; i < f.items.size(); ++i) {
    const int32_t root = f.x.worker(state_.at[f.items[i].owner].node, p);
    for (const scheduler::ExchangePart& part : f.x.Parts(i)) {
      if (part.position != p) continue;
      void* data = at(part.in_pack);
      if (way_ == Way::kSum) {
        float* sums = static_cast<float*>(data);
        MUONPS_RETURN_IF_ERROR(t_.ReduceSumIn(transport::Split::kRails, sums,
                                              sums, part.count, root,
                                              state_.rail, stream_));
        if (rank_ != root) *bytes += part.count * width;
      } else {
        MUONPS_RETURN_IF_ERROR(t_.BroadcastIn(
            transport::Split::kRails, data, part.count, dtype_, root, stream_));
        if (rank_ == root) *bytes += part.count * width;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ExchangePipeline::NodeParts(const Flight& f, DType dtype,
                                         bool to_owner,
                                         absl::FunctionRef<void*(int64_t)> at,
                                         int64_t* bytes) {
  const int k = me_.node;
  const int p = me_.position;
  const int64_t width = static_cast<int64_t>(DTypeSize(dtype));
  for (size_t i = 0; i < f.items.size(); ++i) {
    const ExchangeItem& item = f.items[i];
    const scheduler::NodePosition o = state_.at[item.owner];
    if (k != o.node) continue;
    for (const scheduler::ExchangePart& part : f.x.Parts(i)) {
      const bool held = part.position == p;  // the block is this worker's
      const bool owned = p == o.position;
      if (!held && !owned) continue;
      // The owner's side: where the sum goes, or where the update is.
      float* sum = owned && to_owner ? item.sum + part.in_item : nullptr;
      const void* update =
          owned && !to_owner
              ? kernels::ElementsPast(item.update, dtype, part.in_item)
              : nullptr;
      const int peer = held ? item.owner : f.x.worker(k, part.position);
      if (held && owned) {
        MUONPS_RETURN_IF_ERROR(
            to_owner ? ops_.CopyBytes(sum, at(part.in_pack), part.count * width,
                                      stream_)
                     : ops_.CopyBytes(at(part.in_pack), update,
                                      part.count * width, stream_));
      } else if (held == to_owner) {
        // The block's worker to the owner, or the owner to it.
        MUONPS_RETURN_IF_ERROR(t_.Send(held ? at(part.in_pack) : update,
                                       part.count, dtype, peer, stream_));
        *bytes += part.count * width;
      } else {
        MUONPS_RETURN_IF_ERROR(t_.Recv(held ? at(part.in_pack) : sum,
                                       part.count, dtype, peer, stream_));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ExchangePipeline::AddInto(float* acc, const float* part,
                                       int64_t count) {
  // acc * 1 + 1 * part: both products exact, so one fp32 rounding of the
  // sum, fused or not.
  return ops_.ApplyScaled(acc, kF32, part, kF32, count, 1.0f, 1.0f, stream_);
}

}  // namespace worker
}  // namespace muonps
