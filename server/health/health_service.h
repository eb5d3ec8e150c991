// grpc.health.v1.Health as a registered service of the server, so that
// server reflection serves its descriptor and grpcurl can call it knowing
// nothing but reflection (gRPC's built-in health service is not
// reflectable). Check answers a service's status; Watch sends the current
// one and every change until the caller cancels (or the server stops).
//
// Thread-safe: SetServing and Shutdown from any thread while RPCs run.
#ifndef MUONPS_SERVER_HEALTH_HEALTH_SERVICE_H_
#define MUONPS_SERVER_HEALTH_HEALTH_SERVICE_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace muonps {
namespace server {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  // "" (the whole server) is SERVING from the start; other services are
  // SERVICE_UNKNOWN (NOT_FOUND for Check) until SetServing names them.
  HealthService();

  void SetServing(const std::string& service, bool serving);
  // Every service NOT_SERVING and open Watch streams end (before the
  // server shuts down, so that no stream holds it up).
  void Shutdown();

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  grpc::Status Watch(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>*
                         writer) override;

 private:
  using Status = grpc::health::v1::HealthCheckResponse::ServingStatus;
  Status StatusOf(const std::string& service) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, Status> statuses_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace server
}  // namespace muonps

#endif  // MUONPS_SERVER_HEALTH_HEALTH_SERVICE_H_
