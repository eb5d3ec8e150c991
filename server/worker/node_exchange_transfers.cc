#include "server/worker/node_exchange_transfers.h"

#include <algorithm>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace worker {
namespace {

constexpr DType kF32 = DType::kFloat32;

// The exchanged items' sizes of `bucket`, in its order: those of `kind`.
std::vector<int64_t> SizesOf(const scheduler::Bucket& bucket,
                             const std::vector<scheduler::MatrixSpec>& matrices,
                             scheduler::TransferKind kind) {
  std::vector<int64_t> sizes;
  for (const scheduler::Transfer& x : bucket.to_owners) {
    if (x.kind != kind) continue;
    const scheduler::MatrixSpec& spec = matrices[x.item.matrix];
    sizes.push_back(spec.rows * spec.cols);
  }
  return sizes;
}

}  // namespace

absl::Status PrepareExchange(const scheduler::StepSchedule& schedule,
                             const std::vector<scheduler::MatrixSpec>& matrices,
                             kernels::DeviceOps& ops, ExchangeState* state) {
  if (schedule.exchange_nodes.empty()) return absl::OkStatus();
  int workers = 0;
  for (const std::vector<int32_t>& node : schedule.exchange_nodes) {
    for (const int32_t r : node) workers = std::max(workers, r + 1);
  }
  state->at.assign(workers, scheduler::NodePosition{});
  for (size_t k = 0; k < schedule.exchange_nodes.size(); ++k) {
    const std::vector<int32_t>& node = schedule.exchange_nodes[k];
    for (size_t p = 0; p < node.size(); ++p) {
      state->at[node[p]] = {static_cast<int>(k), static_cast<int>(p)};
    }
  }
  int64_t packed = 1, incoming = 1;
  for (const scheduler::Bucket& bucket : schedule.buckets) {
    const std::vector<int64_t> sizes =
        SizesOf(bucket, matrices, scheduler::TransferKind::kExchangeToOwner);
    if (sizes.empty()) continue;
    const scheduler::NodeExchange x(schedule.exchange_nodes, sizes);
    packed = std::max(packed, x.packed());
    incoming = std::max(incoming, x.block() * x.per_node());
  }
  if (state->pack == nullptr || state->pack->size() < packed) {
    state->pack.reset();
    MUONPS_ASSIGN_OR_RETURN(state->pack,
                            ops.Allocate(packed, "exchanged gradients"));
  }
  if (state->incoming == nullptr || state->incoming->size() < incoming) {
    state->incoming.reset();
    MUONPS_ASSIGN_OR_RETURN(state->incoming,
                            ops.Allocate(incoming, "exchanged parts"));
  }
  return absl::OkStatus();
}

NodeExchangeTransfers::NodeExchangeTransfers(
    const std::vector<std::vector<int32_t>>& nodes, int rank,
    transport::Transport& transport, kernels::DeviceOps& ops,
    ExchangeState& state, Stream stream)
    : nodes_(nodes),
      rank_(rank),
      t_(transport),
      ops_(ops),
      state_(state),
      me_(rank >= 0 && rank < static_cast<int>(state.at.size())
              ? state.at[rank]
              : scheduler::NodePosition{}),
      stream_(stream) {}

scheduler::NodeExchange NodeExchangeTransfers::Layout(
    const std::vector<ExchangeItem>& items) const {
  std::vector<int64_t> sizes;
  sizes.reserve(items.size());
  for (const ExchangeItem& item : items) sizes.push_back(item.size);
  return scheduler::NodeExchange(nodes_, sizes);
}

absl::Status NodeExchangeTransfers::AddInto(float* acc, const float* part,
                                            int64_t count) {
  // acc * 1 + 1 * part: both products exact, so one fp32 rounding of the
  // sum, fused or not.
  return ops_.ApplyScaled(acc, kF32, part, kF32, count, 1.0f, 1.0f, stream_);
}

absl::Status NodeExchangeTransfers::RailPieces(
    const scheduler::NodeExchange& x, const std::vector<ExchangeItem>& items,
    DType dtype, bool inward, absl::FunctionRef<void*(int64_t)> at,
    int64_t* bytes) {
  const int k = me_.node;
  const int p = me_.position;
  const int64_t width = static_cast<int64_t>(DTypeSize(dtype));
  MUONPS_RETURN_IF_ERROR(t_.GroupStart());
  for (size_t i = 0; i < items.size(); ++i) {
    const scheduler::NodePosition o = state_.at[items[i].owner];
    for (const scheduler::ExchangePiece& piece : x.Pieces(i)) {
      if (piece.node == o.node || piece.position != p) continue;
      // From the holder inward, or back from the owner's node.
      const int from = inward ? piece.node : o.node;
      const int to = inward ? o.node : piece.node;
      if (k == from) {
        MUONPS_RETURN_IF_ERROR(t_.Send(at(piece.in_pack), piece.count, dtype,
                                       x.worker(to, p), stream_));
        *bytes += piece.count * width;
      } else if (k == to) {
        MUONPS_RETURN_IF_ERROR(t_.Recv(at(piece.in_pack), piece.count, dtype,
                                       x.worker(from, p), stream_));
      }
    }
  }
  return t_.GroupEnd();
}

absl::Status NodeExchangeTransfers::Sum(const std::vector<ExchangeItem>& items,
                                        int64_t* bytes) {
  if (items.empty()) return absl::OkStatus();
  if (me_.node < 0) {
    return absl::InternalError(
        absl::StrCat("rank ", rank_, " is on none of the exchange's nodes"));
  }
  const scheduler::NodeExchange x = Layout(items);
  if (state_.pack == nullptr || state_.pack->size() < x.packed() ||
      state_.incoming == nullptr ||
      state_.incoming->size() < x.block() * x.per_node()) {
    return absl::InternalError("the exchange's buffers were not prepared");
  }
  const int k = me_.node;
  const int p = me_.position;
  const int per_node = x.per_node();
  const int64_t block = x.block();
  const int64_t c = x.segment();
  float* pack = state_.pack->data();
  float* incoming = state_.incoming->data();
  // Slots 0..per_node-2 of `incoming` take the node's other parts of this
  // worker's block; the last takes what the rounds across the nodes bring.
  float* spare = incoming + (per_node - 1) * block;
  for (size_t i = 0; i < items.size(); ++i) {
    MUONPS_RETURN_IF_ERROR(
        ops_.Copy(pack + x.offset(i), items[i].part, items[i].size, stream_));
  }
  // 1. Within the node: block q to position q, the node's parts of block p
  // in, added in position order into the first of them.
  const auto slot = [&](int q) { return q < p ? q : q - 1; };
  MUONPS_RETURN_IF_ERROR(t_.GroupStart());
  for (int q = 0; q < per_node; ++q) {
    if (q == p) continue;
    const int32_t peer = x.worker(k, q);
    MUONPS_RETURN_IF_ERROR(
        t_.Send(pack + q * block, block, kF32, peer, stream_));
    MUONPS_RETURN_IF_ERROR(
        t_.Recv(incoming + slot(q) * block, block, kF32, peer, stream_));
    *bytes += block * 4;
  }
  MUONPS_RETURN_IF_ERROR(t_.GroupEnd());
  const auto part_of = [&](int q) {
    return q == p ? pack + p * block : incoming + slot(q) * block;
  };
  float* mine = part_of(0);
  for (int q = 1; q < per_node; ++q) {
    MUONPS_RETURN_IF_ERROR(AddInto(mine, part_of(q), block));
  }
  // 2. Across the nodes, among position p: the fold, then halving.
  const int nodes = x.nodes();
  const int halving = x.halving_nodes();
  if (k >= halving) {
    MUONPS_RETURN_IF_ERROR(t_.GroupStart());
    MUONPS_RETURN_IF_ERROR(
        t_.Send(mine, block, kF32, x.worker(k - halving, p), stream_));
    MUONPS_RETURN_IF_ERROR(t_.GroupEnd());
    *bytes += block * 4;
  } else {
    if (k + halving < nodes) {
      MUONPS_RETURN_IF_ERROR(t_.GroupStart());
      MUONPS_RETURN_IF_ERROR(
          t_.Recv(spare, block, kF32, x.worker(k + halving, p), stream_));
      MUONPS_RETURN_IF_ERROR(t_.GroupEnd());
      MUONPS_RETURN_IF_ERROR(AddInto(mine, spare, block));
    }
    int64_t lo = 0;  // in segments of block p
    for (int d = halving / 2; d >= 1; d /= 2) {
      const int32_t partner = x.worker(k ^ d, p);
      const int64_t keep = (k & d) == 0 ? lo : lo + d;
      const int64_t give = (k & d) == 0 ? lo + d : lo;
      MUONPS_RETURN_IF_ERROR(t_.GroupStart());
      MUONPS_RETURN_IF_ERROR(
          t_.Send(mine + give * c, d * c, kF32, partner, stream_));
      MUONPS_RETURN_IF_ERROR(t_.Recv(spare, d * c, kF32, partner, stream_));
      MUONPS_RETURN_IF_ERROR(t_.GroupEnd());
      *bytes += d * c * 4;
      MUONPS_RETURN_IF_ERROR(AddInto(mine + keep * c, spare, d * c));
      lo = keep;
    }
  }
  // 3. Each item's sum to its owner in two hops: each segment's piece to
  // the segment's position on the owner's node, into the same place of
  // that worker's block (over the network), then each block's part on to
  // the owner (within the node).
  const auto in_block = [&](const scheduler::ExchangePiece& piece) {
    return mine + (piece.in_pack - piece.position * block);
  };
  MUONPS_RETURN_IF_ERROR(RailPieces(
      x, items, kF32, /*inward=*/true,
      [&](int64_t e) -> void* { return mine + (e - p * block); }, bytes));
  MUONPS_RETURN_IF_ERROR(t_.GroupStart());
  for (size_t i = 0; i < items.size(); ++i) {
    const ExchangeItem& item = items[i];
    const scheduler::NodePosition o = state_.at[item.owner];
    if (k != o.node) continue;
    for (const scheduler::ExchangePiece& part : x.Parts(i)) {
      float* sum = item.sum + part.in_item;
      if (part.position == p && p == o.position) {
        MUONPS_RETURN_IF_ERROR(
            ops_.Copy(sum, in_block(part), part.count, stream_));
      } else if (part.position == p) {
        MUONPS_RETURN_IF_ERROR(
            t_.Send(in_block(part), part.count, kF32, item.owner, stream_));
        *bytes += part.count * 4;
      } else if (p == o.position) {
        MUONPS_RETURN_IF_ERROR(t_.Recv(sum, part.count, kF32,
                                       x.worker(k, part.position), stream_));
      }
    }
  }
  return t_.GroupEnd();
}

absl::Status NodeExchangeTransfers::Gather(
    const std::vector<ExchangeItem>& items, DType dtype, int64_t* bytes) {
  if (items.empty()) return absl::OkStatus();
  if (me_.node < 0) {
    return absl::InternalError(
        absl::StrCat("rank ", rank_, " is on none of the exchange's nodes"));
  }
  const scheduler::NodeExchange x = Layout(items);
  if (state_.pack == nullptr || state_.pack->size() < x.packed()) {
    return absl::InternalError("the exchange's buffers were not prepared");
  }
  const int k = me_.node;
  const int p = me_.position;
  const int64_t width = static_cast<int64_t>(DTypeSize(dtype));
  const int64_t block = x.block();
  const int64_t c = x.segment();
  const int halving = x.halving_nodes();
  // The updates, packed as the gradients were, in `dtype`.
  void* pack = state_.pack->data();
  const auto at = [&](int64_t element) {
    return kernels::ElementsPast(pack, dtype, element);
  };
  // 1. Each item's update from its owner in two hops: each block's part
  // to the block's position on the owner's node (within the node), then
  // each segment's piece on to the segment's holder (over the network),
  // into the same place of the pack.
  MUONPS_RETURN_IF_ERROR(t_.GroupStart());
  for (size_t i = 0; i < items.size(); ++i) {
    const ExchangeItem& item = items[i];
    const scheduler::NodePosition o = state_.at[item.owner];
    if (k != o.node) continue;
    for (const scheduler::ExchangePiece& part : x.Parts(i)) {
      void* into = at(part.in_pack);
      if (part.position == p && p == o.position) {
        MUONPS_RETURN_IF_ERROR(ops_.CopyBytes(
            into, kernels::ElementsPast(item.update, dtype, part.in_item),
            part.count * width, stream_));
      } else if (p == o.position) {
        MUONPS_RETURN_IF_ERROR(
            t_.Send(kernels::ElementsPast(item.update, dtype, part.in_item),
                    part.count, dtype, x.worker(k, part.position), stream_));
        *bytes += part.count * width;
      } else if (part.position == p) {
        MUONPS_RETURN_IF_ERROR(
            t_.Recv(into, part.count, dtype, item.owner, stream_));
      }
    }
  }
  MUONPS_RETURN_IF_ERROR(t_.GroupEnd());
  MUONPS_RETURN_IF_ERROR(
      RailPieces(x, items, dtype, /*inward=*/false, at, bytes));
  // 2. Across the nodes, among position p: doubling, then the fold's nodes
  // get their block whole.
  const int64_t base = p * block;  // block p, in elements
  if (k < halving) {
    int64_t lo = k;  // in segments of block p
    for (int d = 1; d < halving; d *= 2) {
      const int32_t partner = x.worker(k ^ d, p);
      const int64_t theirs = lo ^ d;
      MUONPS_RETURN_IF_ERROR(t_.GroupStart());
      MUONPS_RETURN_IF_ERROR(
          t_.Send(at(base + lo * c), d * c, dtype, partner, stream_));
      MUONPS_RETURN_IF_ERROR(
          t_.Recv(at(base + theirs * c), d * c, dtype, partner, stream_));
      MUONPS_RETURN_IF_ERROR(t_.GroupEnd());
      *bytes += d * c * width;
      lo = std::min(lo, theirs);
    }
    if (k + halving < x.nodes()) {
      MUONPS_RETURN_IF_ERROR(t_.GroupStart());
      MUONPS_RETURN_IF_ERROR(
          t_.Send(at(base), block, dtype, x.worker(k + halving, p), stream_));
      MUONPS_RETURN_IF_ERROR(t_.GroupEnd());
      *bytes += block * width;
    }
  } else {
    MUONPS_RETURN_IF_ERROR(t_.GroupStart());
    MUONPS_RETURN_IF_ERROR(
        t_.Recv(at(base), block, dtype, x.worker(k - halving, p), stream_));
    MUONPS_RETURN_IF_ERROR(t_.GroupEnd());
  }
  // 3. Within the node: block p to every other position, theirs in.
  MUONPS_RETURN_IF_ERROR(t_.GroupStart());
  for (int q = 0; q < x.per_node(); ++q) {
    if (q == p) continue;
    const int32_t peer = x.worker(k, q);
    MUONPS_RETURN_IF_ERROR(t_.Send(at(base), block, dtype, peer, stream_));
    MUONPS_RETURN_IF_ERROR(t_.Recv(at(q * block), block, dtype, peer, stream_));
    *bytes += block * width;
  }
  MUONPS_RETURN_IF_ERROR(t_.GroupEnd());
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].landing == nullptr) continue;
    MUONPS_RETURN_IF_ERROR(ops_.CopyBytes(items[i].landing, at(x.offset(i)),
                                          items[i].size * width, stream_));
  }
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace muonps
