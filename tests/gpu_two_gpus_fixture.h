// The fixture of gpu_two_gpus_test: a coordinator, workers w0 (cuda:0)
// and w1 (cuda:1) over NCCL, trainer processes (gpu_two_gpus_trainer.h),
// and the waits the cases use, every one bounded. Logs of a case go to a
// temp dir, printed whole (tails of long ones) when the case fails and
// kept; removed otherwise. On a machine of one GPU everything runs on
// cuda:0, each worker a NCCL host of its own; skips without a GPU.
// Test-only; thread-compatible.
#ifndef MUONPS_TESTS_GPU_TWO_GPUS_FIXTURE_H_
#define MUONPS_TESTS_GPU_TWO_GPUS_FIXTURE_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "muonps/v1/worker.grpc.pb.h"
#include "tests/gpu_two_gpus_trainer.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace testing {

inline constexpr char kTwoGpusJob[] = "gpu2x";
// A step whose peer is silent this long fails (--io_timeout_ms).
inline constexpr int64_t kIoTimeoutMs = 10000;
// What "bounded" means for a failed step: well past the I/O timeout and an
// abort, far below the client's 60 s.
inline constexpr int64_t kFailWithinMs = 30000;

int64_t UnixMs();
// Waits until `pid` is stopped (SIGSTOP; /proc state T).
absl::Status WaitUntilStopped(pid_t pid, absl::Duration timeout);
// Waits for `child` to exit, OK only with exit status 0.
absl::Status WaitForSuccess(ChildProcess& child, absl::Duration timeout);
// The answer trainer `child` logged to attempt `attempt` of step `step`;
// DEADLINE_EXCEEDED (a hang) after `timeout`, FAILED_PRECONDITION if the
// trainer exited without it.
absl::StatusOr<StepAttempt> WaitForAttempt(ChildProcess& child, int64_t step,
                                           int attempt, absl::Duration timeout);
// The plan versions for which `worker`'s log says it joined a communicator
// as NCCL rank `rank` of `size` (nccl_bootstrap.cc's line).
std::vector<int64_t> NcclPlanVersions(const std::string& log,
                                      const std::string& worker, int rank,
                                      int size);
bool AllFinite(const std::vector<std::vector<float>>& params);

class TwoGpusTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  // Every log of the case (the tail of long ones), for a failure's report.
  void DumpLogs();
  std::string Socket(int w) const;
  // A coordinator whose leases last `lease_ms` (renewed every 500 ms).
  void StartCoordinator(int64_t lease_ms);
  // Worker `w` on cuda:GpuOf(w) over NCCL, serving its socket.
  void StartWorker(int w, const std::vector<std::string>& extra_flags,
                   const std::string& log_name);
  // Trainer `rank`, stepping first..last of the case's layout and dtype.
  std::unique_ptr<ChildProcess> StartTrainer(int rank, int64_t first,
                                             int64_t last,
                                             const std::string& name);
  // The coordinator, then w0 and trainer 0 (which creates the job), then
  // w1 and trainer 1: w0 joins first, so it is NCCL rank 0 (the
  // communicator's root and the step's decider) and w1 rank 1. With
  // `dedicated_`, w1 is a worker with no trainer (--dedicated) and trainer 0
  // the job's only one.
  void StartJob(int64_t lease_ms, const std::vector<std::string>& w0_flags,
                const std::vector<std::string>& w1_flags, int64_t last_step);
  // The worker's own account (its local GetStatus), within 5 s.
  absl::StatusOr<v1::WorkerStatus> WorkerStatus(int w);
  std::string log_dir_, socket_dir_, address_;
  std::string layout_ = "unreduced";
  bool dedicated_ = false;
  int trainer_count() const { return dedicated_ ? 1 : kTrainers; }
  DType dtype_ = DType::kBFloat16;
  absl::Duration retry_for_ = absl::ZeroDuration();
  std::unique_ptr<ChildProcess> coordinator_;
  std::unique_ptr<ChildProcess> workers_[2];
  std::vector<std::unique_ptr<ChildProcess>> trainers_;
};

}  // namespace testing
}  // namespace muonps

#endif  // MUONPS_TESTS_GPU_TWO_GPUS_FIXTURE_H_
