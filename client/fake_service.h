// A coordinator and a local worker in the test's own process, each on a
// Unix socket of a fresh temporary directory, that answer a Client's
// CreateJob, Attach and Step and keep what they were sent. The worker
// answers a step id it has seen before as already applied. Test-only;
// thread-safe (gRPC's threads record, the test reads).
#ifndef MUONPS_CLIENT_FAKE_SERVICE_H_
#define MUONPS_CLIENT_FAKE_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "muonps/v1/worker.grpc.pb.h"

namespace muonps {
namespace testing {

class FakeService {
 public:
  FakeService();
  ~FakeService();
  FakeService(const FakeService&) = delete;
  FakeService& operator=(const FakeService&) = delete;

  // gRPC targets for ClientOptions.coordinator and the worker's socket
  // path for ClientOptions.worker_socket.
  std::string coordinator_target() const;
  std::string worker_socket() const;

  // Takes the coordinator down (its socket refuses connections) and brings
  // it up again on the same target, with what it was sent so far.
  void StopCoordinator();
  void StartCoordinator();
  // The next `calls` CreateJob calls fail UNAVAILABLE, as one does whose
  // coordinator died during the call ("Socket closed").
  void FailCreateJobs(int calls);

  // The job of every CreateJob call, in order.
  std::vector<v1::JobSpec> jobs() const;
  std::vector<v1::AttachRequest> attaches() const;
  std::vector<v1::StepRequest> steps() const;

 private:
  class Coordinator;
  class Worker;
  std::string dir_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<grpc::Server> server_;              // the worker's
  std::unique_ptr<grpc::Server> coordinator_server_;  // null: stopped
};

}  // namespace testing
}  // namespace muonps

#endif  // MUONPS_CLIENT_FAKE_SERVICE_H_
