#include "bench/common/coordinator_plan.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>

#include "common/status.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "proto/credentials.h"
#include "proto/grpc_status.h"

namespace muonps {
namespace bench {

absl::StatusOr<v1::Plan> FetchPlan(const std::string& coordinator,
                                   const std::string& job) {
  MUONPS_ASSIGN_OR_RETURN(
      std::shared_ptr<grpc::Channel> channel,
      OpenChannel(coordinator, WithEnvironmentDefaults({})));
  std::unique_ptr<v1::Coordinator::Stub> stub =
      v1::Coordinator::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  v1::GetPlanRequest request;
  request.set_job(job);
  v1::Plan plan;
  MUONPS_RETURN_IF_ERROR(
      FromGrpc(stub->GetPlan(&context, request, &plan), "GetPlan"));
  return plan;
}

}  // namespace bench
}  // namespace muonps
