#include "server/worker/nccl_bootstrap.h"

#include <algorithm>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "proto/grpc_status.h"
#include "spdlog/spdlog.h"
#include "transport/nccl_transport.h"

namespace muonps {
namespace worker {
namespace {

// How many communicators this worker built per plan version: rank 0 puts
// each rebuilt one's id under the next generation; the others ask for one
// newer than the last they used.
class Generations {
 public:
  int64_t Next(uint64_t version) {
    absl::MutexLock lock(&mu_);
    return next_[version];
  }
  void Used(uint64_t version, int64_t generation) {
    absl::MutexLock lock(&mu_);
    next_[version] = std::max(next_[version], generation + 1);
  }

 private:
  absl::Mutex mu_;
  std::map<uint64_t, int64_t> next_ ABSL_GUARDED_BY(mu_);
};

// The coordinator's answer that `version` is no longer the job's plan
// (FAILED_PRECONDITION on its plan_version: a worker joined or left, or a
// restarted one rejoined, while this one built the version's
// communicator). Nothing of a step ran on it and this worker's agent is
// about to take the new plan, so the step is retried on that:
// UNAVAILABLE, as for a worker that is out, not a refusal that no retry
// fixes.
bool PlanReplaced(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
         absl::StartsWith(status.error_message(), "plan_version: ");
}

absl::Status Replaced(const grpc::Status& status, absl::string_view call,
                      uint64_t version) {
  return absl::UnavailableError(absl::StrCat(
      call, " for plan version ", version, ": ", status.error_message(),
      ": the job's plan changed while this worker built its NCCL "
      "communicator; the step ran nothing: retry it on the new plan"));
}

absl::StatusOr<std::string> ExchangeId(const NcclBootstrapOptions& o,
                                       v1::Coordinator::Stub& stub, int rank,
                                       uint64_t version,
                                       Generations& generations) {
  const int64_t generation = generations.Next(version);
  if (rank == 0) {
    MUONPS_ASSIGN_OR_RETURN(std::string id,
                            transport::NcclTransport::NewUniqueId());
    v1::PutNcclIdRequest put;
    put.set_job(o.job);
    put.set_plan_version(static_cast<int64_t>(version));
    put.set_worker_id(o.worker_id);
    put.set_nccl_id(id);
    put.set_generation(generation);
    put.set_worker_token(o.credentials->worker_token());
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(o.timeout));
    v1::PutNcclIdResponse response;
    const grpc::Status put_status = stub.PutNcclId(&context, put, &response);
    if (PlanReplaced(put_status)) {
      return Replaced(put_status, "PutNcclId", version);
    }
    MUONPS_RETURN_IF_ERROR(FromGrpc(
        put_status, absl::StrCat("PutNcclId for plan version ", version)));
    generations.Used(version, generation);
    return id;
  }
  const absl::Time deadline = absl::Now() + o.timeout;
  std::string last;
  int64_t wanted = generation;
  while (absl::Now() < deadline) {
    v1::GetNcclIdRequest get;
    get.set_job(o.job);
    get.set_plan_version(static_cast<int64_t>(version));
    get.set_min_generation(wanted);
    get.set_worker_id(o.worker_id);
    get.set_worker_token(o.credentials->worker_token());
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(absl::Seconds(2)));
    v1::GetNcclIdResponse response;
    const grpc::Status status = stub.GetNcclId(&context, get, &response);
    if (status.ok() &&
        IdStillJoinable(absl::Milliseconds(response.age_ms()), o.timeout)) {
      generations.Used(version, response.generation());
      return response.nccl_id();
    }
    if (status.ok()) {  // about to be given up: wait for the next one
      wanted = response.generation() + 1;
      last = absl::StrCat("generation ", response.generation(), " was put ",
                          response.age_ms(), " ms ago");
      absl::SleepFor(absl::Milliseconds(20));
      continue;
    }
    if (PlanReplaced(status)) return Replaced(status, "GetNcclId", version);
    last = status.error_message();
    if (status.error_code() != grpc::StatusCode::NOT_FOUND &&
        status.error_code() != grpc::StatusCode::UNAVAILABLE) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no NCCL id from rank 0 for plan version ", version,
                   " within ", absl::FormatDuration(o.timeout), ": ", last));
}

}  // namespace

bool IdStillJoinable(absl::Duration age, absl::Duration timeout) {
  const absl::Duration margin = std::max(timeout / 4, absl::Seconds(1));
  return age + margin < timeout;
}

TransportFactory NcclTransportFactory(NcclBootstrapOptions options) {
  auto stub = std::shared_ptr<v1::Coordinator::Stub>(
      v1::Coordinator::NewStub(options.coordinator));
  auto generations = std::make_shared<Generations>();
  return [options, stub, generations](
             int rank, const std::vector<std::string>& addresses,
             uint64_t session, const std::string& /*data_plane_secret*/)
             -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
    // NCCL's ranks meet through the id the coordinator relays, not
    // through our TCP handshake, so the secret has no use here.
    MUONPS_ASSIGN_OR_RETURN(
        const std::string id,
        ExchangeId(options, *stub, rank, session, *generations));
    MUONPS_ASSIGN_OR_RETURN(
        std::unique_ptr<transport::NcclTransport> nccl,
        transport::NcclTransport::Create(options.cuda_device, rank,
                                         static_cast<int>(addresses.size()), id,
                                         {.timeout = options.timeout}));
    spdlog::info(
        "job={} worker={} plan_version={} NCCL rank {} of {} on cuda:{}",
        options.job, options.worker_id, session, rank, addresses.size(),
        options.cuda_device);
    return std::unique_ptr<transport::Transport>(std::move(nccl));
  };
}

}  // namespace worker
}  // namespace muonps
