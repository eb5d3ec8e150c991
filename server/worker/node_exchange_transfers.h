// One bucket's two-level exchange on one worker (scheduler/node_exchange.h
// says what is summed where): its unreduced gradients summed within the
// node and then across the nodes, each matrix's sum gathered to its owner,
// and the updates back the reverse way onto every rank. Built from
// point-to-point calls and fp32 adds of this worker's own, so the sums have
// the same bits on every transport (NCCL included) and the replay can add
// as it does (scheduler::SumAcrossNodes).
//
// Streams: every call is ordered on the one transfer stream it is given,
// each launch (a transport group) after the adds that feed it. Launches per
// bucket, each way: one within the node, a fold where the node count is not
// a power of two, one per halving round, and two of the pieces to or from
// the owners (across the nodes, then within the owner's node).
// Thread-compatible; used by the step's thread.
#ifndef MUONPS_SERVER_WORKER_NODE_EXCHANGE_TRANSFERS_H_
#define MUONPS_SERVER_WORKER_NODE_EXCHANGE_TRANSFERS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/device.h"
#include "common/dtype.h"
#include "kernels/device_ops.h"
#include "scheduler/node_exchange.h"
#include "scheduler/step_schedule.h"
#include "transport/transport.h"

namespace muonps {
namespace worker {

// One exchanged item of a bucket, in the bucket's order.
struct ExchangeItem {
  int64_t size = 0;   // elements
  int32_t owner = 0;  // rank
  // To owners: this worker's part (zeros on a worker with no trainer) and,
  // on the owner, where the sum goes.
  const float* part = nullptr;
  float* sum = nullptr;
  // From owners: on the owner, the update (of the exchange's dtype); on
  // every rank, where it lands (null: nowhere).
  const void* update = nullptr;
  void* landing = nullptr;
};

// What a plan version fixes of its exchanges: where each rank is among
// the exchange nodes, and the buffers, sized for its largest bucket.
struct ExchangeState {
  std::vector<scheduler::NodePosition> at;         // by rank
  std::unique_ptr<kernels::FloatBuffer> pack;      // packed() elements
  std::unique_ptr<kernels::FloatBuffer> incoming;  // per_node() blocks
};

// Sets `state` up for `schedule`: the ranks' positions, and the buffers
// (grown only) for every bucket with exchange transfers:
// RESOURCE_EXHAUSTED naming them when the device is full. Synchronous.
absl::Status PrepareExchange(const scheduler::StepSchedule& schedule,
                             const std::vector<scheduler::MatrixSpec>& matrices,
                             kernels::DeviceOps& ops, ExchangeState* state);

class NodeExchangeTransfers {
 public:
  // `nodes`: the plan's exchange nodes; `rank`: this worker's. Everything
  // must outlive the object.
  NodeExchangeTransfers(const std::vector<std::vector<int32_t>>& nodes,
                        int rank, transport::Transport& transport,
                        kernels::DeviceOps& ops, ExchangeState& state,
                        Stream stream);

  // Sums every rank's parts of `items` and leaves each item's sum in its
  // owner's `sum`. Adds the bytes this rank sent to `*bytes`.
  absl::Status Sum(const std::vector<ExchangeItem>& items, int64_t* bytes);
  // Sends each item's `update` (on its owner) to every rank's `landing`,
  // `dtype` elements. Adds the bytes this rank sent to `*bytes`.
  absl::Status Gather(const std::vector<ExchangeItem>& items, DType dtype,
                      int64_t* bytes);

 private:
  scheduler::NodeExchange Layout(const std::vector<ExchangeItem>& items) const;
  // Each item's pieces between their segments' holders and the worker at
  // the segment's position on the item's owner's node (none where the
  // holder is on that node), `inward` (toward the owner's node) or back,
  // in `dtype`, from and into `at(element of the pack)` on either side: one
  // launch.
  absl::Status RailPieces(const scheduler::NodeExchange& x,
                          const std::vector<ExchangeItem>& items, DType dtype,
                          bool inward, absl::FunctionRef<void*(int64_t)> at,
                          int64_t* bytes);
  // acc[i] <- acc[i] + part[i] (fp32, one rounding: the replay's add).
  absl::Status AddInto(float* acc, const float* part, int64_t count);

  const std::vector<std::vector<int32_t>>& nodes_;
  const int rank_;
  transport::Transport& t_;
  kernels::DeviceOps& ops_;
  ExchangeState& state_;
  const scheduler::NodePosition me_;
  const Stream stream_;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_NODE_EXCHANGE_TRANSFERS_H_
