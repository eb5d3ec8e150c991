#include "server/health/health_service.h"

#include "absl/time/time.h"

namespace muonps {
namespace server {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

HealthService::HealthService() {
  absl::MutexLock lock(&mu_);
  statuses_[""] = HealthCheckResponse::SERVING;
}

void HealthService::SetServing(const std::string& service, bool serving) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  statuses_[service] =
      serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
}

void HealthService::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  for (auto& [name, status] : statuses_) {
    status = HealthCheckResponse::NOT_SERVING;
  }
}

HealthService::Status HealthService::StatusOf(
    const std::string& service) const {
  auto it = statuses_.find(service);
  return it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN
                               : it->second;
}

grpc::Status HealthService::Check(grpc::ServerContext*,
                                  const HealthCheckRequest* request,
                                  HealthCheckResponse* response) {
  absl::MutexLock lock(&mu_);
  const Status status = StatusOf(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "service name unknown");
  }
  response->set_status(status);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(
    grpc::ServerContext* context, const HealthCheckRequest* request,
    grpc::ServerWriter<HealthCheckResponse>* writer) {
  bool first = true;
  Status sent = HealthCheckResponse::UNKNOWN;
  while (!context->IsCancelled()) {
    Status now;
    bool done;
    {
      absl::MutexLock lock(&mu_);
      now = StatusOf(request->service());
      done = shut_down_;
    }
    if (first || now != sent) {
      HealthCheckResponse response;
      response.set_status(now);
      if (!writer->Write(response)) break;
      sent = now;
      first = false;
    }
    if (done) break;
    // Polled: a change shows within 250 ms, a cancel ends the stream.
    absl::SleepFor(absl::Milliseconds(250));
  }
  return grpc::Status::OK;
}

}  // namespace server
}  // namespace muonps
