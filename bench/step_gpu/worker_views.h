// What step_gpu_bench's rank 0 reads about the workers of a run: each
// worker's /metrics (its transport byte counters and the last step's
// compute time beside the plan's prediction of it) and the coordinator's
// plan (GetPlan), printed as JSON lines. Functions are thread-compatible.
#ifndef MUONPS_BENCH_STEP_GPU_WORKER_VIEWS_H_
#define MUONPS_BENCH_STEP_GPU_WORKER_VIEWS_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muonps {
namespace bench {

// One worker's transport counters (bytes summed over their "op" labels, and
// by label; calls by label; launches: 0 from a worker built before they were
// counted), and its last step's compute time with the plan's prediction of
// it (-1: the worker has no such gauge).
struct WorkerMetrics {
  double sent = 0, received = 0;
  std::map<std::string, double> sent_by_op;
  std::map<std::string, double> calls_by_op;
  double launches = 0;
  double compute_seconds = -1, predicted_seconds = -1;
};

// GETs http://HOST:PORT/metrics and reads them. INVALID_ARGUMENT for an
// address that is not HOST:PORT; UNAVAILABLE naming the address when it
// cannot be read; FAILED_PRECONDITION when the worker has no transport byte
// counter (a binary built before it); DATA_LOSS for an unparsable sample.
absl::StatusOr<WorkerMetrics> ScrapeWorkerMetrics(const std::string& address);

// Scrapes until two reads 100 ms apart agree on the byte counters (a peer
// may still be counting the last step's final control message), at most
// 2 s.
absl::StatusOr<WorkerMetrics> ScrapeWorkerMetricsSettled(
    const std::string& address);

// Prints the coordinator's current plan of `job`, one muonps_plan_worker
// line per worker (its predicted seconds and batches: shape, members, the
// counts of the calls they run as, predicted seconds). The channel's
// credentials come from the environment (proto/credentials.h). The
// coordinator's error, naming GetPlan, otherwise.
absl::Status PrintPlan(const std::string& coordinator, const std::string& job,
                       const std::string& layout, int ranks);

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_STEP_GPU_WORKER_VIEWS_H_
