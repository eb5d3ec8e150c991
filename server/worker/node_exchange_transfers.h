// The two-level exchange of a step's unreduced gradients on one worker
// (scheduler/node_exchange.h says what is summed where): each bucket's
// gradients summed within the node and then along each rail across the
// nodes, each matrix's sum brought to its owner, and the updates back the
// reverse way onto every rank. Within the nodes, point-to-point calls and
// fp32 adds of this worker's own; along the rails, the transport's reduce
// and broadcast among the rail's members (transport::Split::kRails, formed
// on the transport from scheduler::RailsOf before its first step), told to
// add the nodes in node order: TCP and CUDA IPC add as the replay does
// (scheduler::SumOverNodes); NCCL rings add in its own order.
//
// A bucket's exchange is three dependent launches (steps) each way: within
// the node, along the rails, and within the owner's node. Consecutive
// buckets' exchanges are pipelined: each launch (one transport group)
// carries the next step of every bucket in flight, so one bucket's sums
// cross the network while the next one's are summed within the node.
// Every rank pushes the same buckets in the same order, so launch t
// carries step t - j of bucket j everywhere.
//
// Streams: every call is ordered on the one transfer stream given; the
// adds a step needs follow its launch there, and a bucket's pack copies
// precede its first. Thread-compatible; used by the step's thread.
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

// What a plan version fixes of its exchanges: where each rank is among the
// exchange nodes and its rail's members in node order, and the buffers of
// the buckets in flight at once (at most scheduler::kExchangeSteps of
// them), each for
// the largest bucket: a pack, and per_node() - 1 blocks of parts.
struct ExchangeState {
  std::vector<scheduler::NodePosition> at;  // by rank
  std::vector<int> rail;                    // this rank's
  std::vector<std::unique_ptr<kernels::FloatBuffer>> packs, parts;
};

// Sets `state` up for `schedule` and this worker's `rank`: the ranks'
// positions, its rail, and the buffers (grown only) of `sizes`
// (scheduler::ExchangeBuffersOf the schedule): RESOURCE_EXHAUSTED naming
// them when the device is full. Synchronous.
absl::Status PrepareExchange(const scheduler::StepSchedule& schedule,
                             const scheduler::ExchangeBuffers& sizes, int rank,
                             kernels::DeviceOps& ops, ExchangeState* state);

class ExchangePipeline {
 public:
  enum class Way {
    kSum,     // gradients summed, each matrix's sum to its owner
    kGather,  // each update from its owner to every rank
  };

  // `nodes`: the plan's exchange nodes; `rank`: this worker's; `dtype`:
  // the updates' (kGather). Everything must outlive the pipeline.
  ExchangePipeline(const std::vector<std::vector<int32_t>>& nodes, int rank,
                   transport::Transport& transport, kernels::DeviceOps& ops,
                   ExchangeState& state, Stream stream, Way way,
                   DType dtype = DType::kFloat32);
  ~ExchangePipeline();
  ExchangePipeline(const ExchangePipeline&) = delete;
  ExchangePipeline& operator=(const ExchangePipeline&) = delete;

  // Bucket `id`'s exchange joins (its items in the bucket's order; none:
  // nothing joins) and one launch runs: the next step of every bucket in
  // flight. Adds the bytes this rank sent to `*bytes`.
  absl::Status Push(int id, std::vector<ExchangeItem> items, int64_t* bytes);
  // Launches until every bucket's exchange is done.
  absl::Status Drain(int64_t* bytes);
  // The buckets whose exchange is done (their sums at their owners, or
  // their updates landed, in stream order) since the last call, in order.
  std::vector<int> TakeDone();

 private:
  enum class Step { kNode, kRail, kParts };
  struct Flight;

  // One launch: the next step of every bucket in flight, then their adds.
  absl::Status Launch(int64_t* bytes);
  absl::Status Issue(Flight& f, int64_t* bytes);
  absl::Status Finish(Flight& f);
  // Each item's part of this worker's block along its rail, onto (kSum,
  // reduced) or from (kGather, broadcast) the worker at this position on
  // the item's owner's node, at `at(element of the pack)`.
  absl::Status Rail(const Flight& f, absl::FunctionRef<void*(int64_t)> at,
                    int64_t* bytes);
  // Each item's part in each block between the worker at the block's
  // position on the owner's node and the owner, `to_owner` or back.
  absl::Status NodeParts(const Flight& f, DType dtype, bool to_owner,
                         absl::FunctionRef<void*(int64_t)> at, int64_t* bytes);
  // acc[i] <- acc[i] + part[i] (fp32, one rounding: the replay's add).
  absl::Status AddInto(float* acc, const float* part, int64_t count);

  const std::vector<std::vector<int32_t>>& nodes_;
  const int rank_;
  transport::Transport& t_;
  kernels::DeviceOps& ops_;
  ExchangeState& state_;
  const scheduler::NodePosition me_;
  const Stream stream_;
  const Way way_;
  const DType dtype_;
  std::vector<Step> steps_;                       // in launch order
  std::vector<std::unique_ptr<Flight>> flights_;  // in flight, oldest first
  int64_t joined_ = 0;                            // buckets that had items
  std::vector<int> done_;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_NODE_EXCHANGE_TRANSFERS_H_
