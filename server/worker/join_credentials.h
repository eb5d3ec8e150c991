// What the coordinator's JoinJob handed this worker: its worker token (the
// credential its Heartbeat, LeaveJob, ReportStepStats and NCCL-id calls
// carry) and the job's data-plane secret (the key of the transport
// handshake between workers). The agent writes them at every (re)join; the
// transports read them when a plan version's communicator is built.
// Thread-safe.
#ifndef MUONPS_SERVER_WORKER_JOIN_CREDENTIALS_H_
#define MUONPS_SERVER_WORKER_JOIN_CREDENTIALS_H_

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace muonps {
namespace worker {

class JoinCredentials {
 public:
  JoinCredentials() = default;
  JoinCredentials(const JoinCredentials&) = delete;
  JoinCredentials& operator=(const JoinCredentials&) = delete;

  void Set(std::string worker_token, std::string data_plane_secret) {
    absl::MutexLock lock(&mu_);
    worker_token_ = std::move(worker_token);
    data_plane_secret_ = std::move(data_plane_secret);
  }
  // "" until the first join.
  std::string worker_token() const {
    absl::MutexLock lock(&mu_);
    return worker_token_;
  }
  std::string data_plane_secret() const {
    absl::MutexLock lock(&mu_);
    return data_plane_secret_;
  }

 private:
  mutable absl::Mutex mu_;
  std::string worker_token_ ABSL_GUARDED_BY(mu_);
  std::string data_plane_secret_ ABSL_GUARDED_BY(mu_);
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_JOIN_CREDENTIALS_H_
