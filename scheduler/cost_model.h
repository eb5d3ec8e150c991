// Predicted seconds of a worker's share of a step: Newton-Schulz on batches
// of same-shape matrices, and transfers over its link; and the fastest way
// to run a batch, as one call or split into several (BatchSplitter).
//
// Measured times (a CostTable) win; shapes the table lacks fall back to a
// roofline of the executed FLOPs and bytes plus a fixed cost per batched
// call, which is what makes batching pay even without measurements. Times
// divide by the worker's speed factor. A CostModel is immutable after
// construction; safe to share between threads.
#ifndef MUONPS_SCHEDULER_COST_MODEL_H_
#define MUONPS_SCHEDULER_COST_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "newton_schulz/options.h"
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
                   NsAlgorithm algorithm) const;

  struct Choice {
    NsAlgorithm algorithm;
    double seconds;
  };
  // The algorithm `policy` allows with the least predicted time (ties go to
  // NS5).
  Choice Best(int64_t rows, int64_t cols, int64_t batch,
              AlgorithmPolicy policy) const;

  // The measured (batch, seconds) curve the model interpolates for this
  // shape and algorithm (owned by the table), or nullptr where it falls back
  // to the roofline.
  const CostTable::Curve* Measured(int64_t rows, int64_t cols,
                                   NsAlgorithm algorithm) const;

  double TransferSeconds(double bytes) const {
    return bytes / rates_.link_bytes_per_second;
  }

  double speed() const { return speed_; }

 private:
  double FallbackSeconds(int64_t rows, int64_t cols, int64_t batch,
                         NsAlgorithm algorithm) const;

  std::shared_ptr<const CostTable> table_;
  // Built once: FallbackSeconds runs in the planner's inner loops.
  NewtonSchulzOptions ns5_options_;
  NewtonSchulzOptions gram_options_;
  DeviceRates rates_;
  double speed_;
  int ns_steps_;
};

// One Newton-Schulz call of a batch: `count` matrices with `algorithm`,
// predicted to take `seconds`.
struct BatchPart {
  int64_t count = 0;
  NsAlgorithm algorithm = NsAlgorithm::kNs5;
  double seconds = 0;
};

// A batch's calls: one unless a split is measured faster, so held inline.
using BatchParts = absl::InlinedVector<BatchPart, 1>;

// A batch is split only when the split is predicted faster than its best
// single call by more than this fraction, so that timing noise in a table
// alone never splits one.
inline constexpr double kSplitMargin = 0.02;

// The fastest way one worker runs n same-shape matrices, for every n: one
// call with the better algorithm the policy allows, or consecutive calls
// (parts), each of its own size and algorithm, where the split is predicted
// faster by more than kSplitMargin. With measured curves, a batch can cost
// more than two halves (a GPU past its cache or its concurrency sweet
// spot); the roofline is a fixed cost per call plus the same cost per
// matrix, so it never gains from a split, and shapes the table lacks (every
// shape, without a table) are never split at all.
//
// The optimum is best(n) = min(whole(n), min over a of whole(a) +
// best(n - a)), memoized over n. Between two measured batch sizes (and past
// the last) a curve is linear, so an optimal split needs at most one part
// whose size is neither a measured size nor 1: with each part's algorithm
// fixed, moving matrices between two parts that both lie inside linear
// stretches changes the total linearly, so it can go on without loss until
// one of them reaches such a size. First parts are therefore drawn from
// those sizes only: O(measured sizes) per n. The margin applies to the
// batch as a whole (the optimum against its best single call).
//
// Thread-compatible: the memo grows on demand. `model` must outlive the
// splitter. Copyable (the copy shares `model`).
class BatchSplitter {
 public:
  BatchSplitter(const CostModel& model, int64_t rows, int64_t cols,
                AlgorithmPolicy policy);

  // Predicted seconds of Parts(n): the best single call, or the split where
  // it saves more than kSplitMargin. 0 for n <= 0.
  double Seconds(int64_t n);

  // How to run n matrices: one part of n when not split, else the parts,
  // largest first (NS5 before Gram among equal sizes), their counts summing
  // to n. Empty for n <= 0.
  BatchParts Parts(int64_t n);

 private:
  struct Entry {
    BatchPart whole;  // the best single call of n
    double optimum;   // the fastest split of n, or whole.seconds
    int64_t first;    // the optimum's first part; 0: one call
  };
  // Memoizes every batch size up to n.
  const Entry& At(int64_t n);
  bool Splits(const Entry& entry) const {
    return entry.first > 0 &&
           entry.optimum < entry.whole.seconds * (1 - kSplitMargin);
  }

  const CostModel* model_;
  int64_t rows_;
  int64_t cols_;
  AlgorithmPolicy policy_;
  std::vector<Entry> memo_;  // memo_[n]; memo_[0] is the empty batch
};

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_COST_MODEL_H_
