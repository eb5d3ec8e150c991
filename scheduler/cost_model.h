// Predicted seconds of a worker's share of a step: Newton-Schulz on batches
// of same-shape matrices, and transfers over its link.
//
// Measured times (a CostTable) win; shapes the table lacks fall back to a
// roofline of the executed FLOPs and bytes plus a fixed cost per batched
// call, which is what makes batching pay even without measurements. Times
// divide by the worker's speed factor. Immutable after construction; safe
// to share between threads.
#ifndef MUONPS_SCHEDULER_COST_MODEL_H_
#define MUONPS_SCHEDULER_COST_MODEL_H_

#include <cstdint>
#include <memory>

#include "kernels/newton_schulz_options.h"
#include "scheduler/cost_table.h"

namespace muonps {
namespace scheduler {

// Which Newton-Schulz algorithm plans may use.
enum class AlgorithmPolicy {
  kAuto,  // the faster predicted one per shape and batch size
  kNs5,
  kGram,
};

// What a device can do when nothing was measured. Defaults describe an H200
// running bf16 NS at a realistic fraction of its 790 TFLOP/s GEMM peak.
struct DeviceRates {
  double flops_per_second = 550e12;
  double memory_bytes_per_second = 4.0e12;
  // Fixed cost of one batched NS call (its kernel launches and syncs).
  double call_overhead_seconds = 60e-6;
  // The worker's link to its peers (NVLink or network), per direction.
  double link_bytes_per_second = 150e9;
};

class CostModel {
 public:
  // `table` may be null (fallback only). `speed` scales every compute time
  // (2.0: twice as fast as the table or rates say); must be > 0.
  CostModel(std::shared_ptr<const CostTable> table, const DeviceRates& rates,
            double speed, int ns_steps);

  // Seconds to orthogonalize `batch` rows x cols matrices with `algorithm`.
  // Measured curves are interpolated linearly in batch; past the largest
  // measured batch they extend with the last segment's slope, below the
  // smallest they scale in proportion. 0 for batch <= 0.
  double NsSeconds(int64_t rows, int64_t cols, int64_t batch,
                   kernels::NsAlgorithm algorithm) const;

  struct Choice {
    kernels::NsAlgorithm algorithm;
    double seconds;
  };
  // The algorithm `policy` allows with the least predicted time (ties go to
  // NS5).
  Choice Best(int64_t rows, int64_t cols, int64_t batch,
              AlgorithmPolicy policy) const;

  double TransferSeconds(double bytes) const {
    return bytes / rates_.link_bytes_per_second;
  }

  double speed() const { return speed_; }

 private:
  double FallbackSeconds(int64_t rows, int64_t cols, int64_t batch,
                         kernels::NsAlgorithm algorithm) const;

  std::shared_ptr<const CostTable> table_;
  // Built once: FallbackSeconds runs in the planner's inner loops.
  kernels::NewtonSchulzOptions ns5_options_;
  kernels::NewtonSchulzOptions gram_options_;
  DeviceRates rates_;
  double speed_;
  int ns_steps_;
};

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_COST_MODEL_H_
