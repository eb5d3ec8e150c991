// muonps: the operator CLI.
//   muonps plan    --coordinator ADDR --job NAME [--version N] [--json]
//   muonps jobs    --coordinator ADDR [--json]
//   muonps workers --coordinator ADDR [--job NAME] [--json]
//   muonps create-job --coordinator ADDR --spec FILE   (a JobSpec as JSON)
//   muonps delete-job --coordinator ADDR --job NAME
//   muonps drain   --coordinator ADDR --job NAME --worker ID   (the worker
//                  hands its momentum over at the next step, then leaves)
//   muonps health  --coordinator ADDR [--service NAME]   (grpc.health.v1;
//                  exits 0 only when SERVING; NAME defaults to
//                  muonps.v1.Coordinator, "" asks for the whole server)
// Exits 0 on success, 1 with the gRPC status on stderr otherwise, 2 on
// bad usage.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "proto/credentials.h"
#include "tools/muonps/error_hint.h"
#include "tools/muonps/plan_table.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070",
          "Coordinator address, HOST:PORT.");
ABSL_FLAG(std::string, job, "", "Job name.");
ABSL_FLAG(std::string, token_file, "",
          "Bearer token file (default: $MUONPS_TOKEN_FILE).");
ABSL_FLAG(std::string, tls_ca_file, "",
          "CA of the coordinator's certificate: use TLS (default: "
          "$MUONPS_TLS_CA_FILE).");
ABSL_FLAG(std::string, tls_cert_file, "",
          "Client certificate for mutual TLS (default: "
          "$MUONPS_TLS_CERT_FILE).");
ABSL_FLAG(std::string, tls_key_file, "",
          "Its key (default: $MUONPS_TLS_KEY_FILE).");
ABSL_FLAG(std::string, job_token_file, "",
          "create-job writes the job's token here (mode 0600; printed when "
          "unset); delete-job reads it.");
ABSL_FLAG(std::string, worker, "", "drain: the worker's id.");
ABSL_FLAG(int64_t, version, 0, "Plan version (0: the latest).");
ABSL_FLAG(bool, json, false, "Print JSON instead of a table.");
ABSL_FLAG(int, timeout_ms, 10000, "Deadline of the call.");
ABSL_FLAG(std::string, service, "muonps.v1.Coordinator",
          "health: the service to ask about (\"\": the whole server).");
ABSL_FLAG(std::string, spec, "",
          "create-job: file holding a muonps.v1.JobSpec as JSON.");

namespace muonps {
namespace {

// What the failed call went through, for its hint.
struct Call {
  std::string address;
  cli::CallSecurity security;
};

int Fail(const grpc::Status& status, const Call& call) {
  std::fprintf(stderr, "error: %s (code %d)\n%s",
               status.error_message().c_str(),
               static_cast<int>(status.error_code()),
               cli::ErrorHint(status, call.address, call.security).c_str());
  return 1;
}

template <typename Response>
int Print(const Call& call, const grpc::Status& status,
          const Response& response, std::string (*table)(const Response&)) {
  if (!status.ok()) return Fail(status, call);
  const std::string text =
      absl::GetFlag(FLAGS_json) ? cli::ToJson(response) : table(response);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

int Run(const std::string& command) {
  // Plans of big jobs exceed gRPC's default 4 MiB receive limit.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  const SecurityConfig security = WithEnvironmentDefaults(
      {.token_file = absl::GetFlag(FLAGS_token_file),
       .tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file),
       .tls_key_file = absl::GetFlag(FLAGS_tls_key_file),
       .tls_ca_file = absl::GetFlag(FLAGS_tls_ca_file)});
  const Call call{absl::GetFlag(FLAGS_coordinator),
                  {.tls = !security.tls_ca_file.empty(),
                   .token = !security.token_file.empty()}};
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      OpenChannel(call.address, security, args);
  if (!channel.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string(channel.status().message()).c_str());
    return 2;
  }
  auto stub = v1::Coordinator::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
  if (command == "health") {
    auto health = grpc::health::v1::Health::NewStub(*channel);
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(absl::GetFlag(FLAGS_service));
    grpc::health::v1::HealthCheckResponse response;
    const grpc::Status status = health->Check(&context, request, &response);
    if (!status.ok()) return Fail(status, call);
    const std::string name =
        grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
            response.status());
    std::printf("%s\n", name.c_str());
    return response.status() == grpc::health::v1::HealthCheckResponse::SERVING
               ? 0
               : 1;
  }
  if (command == "plan") {
    v1::GetPlanRequest request;
    request.set_job(absl::GetFlag(FLAGS_job));
    request.set_version(absl::GetFlag(FLAGS_version));
    v1::Plan plan;
    return Print(call, stub->GetPlan(&context, request, &plan), plan,
                 &cli::PlanTable);
  }
  if (command == "jobs") {
    v1::ListJobsResponse jobs;
    return Print(call, stub->ListJobs(&context, v1::ListJobsRequest(), &jobs),
                 jobs, &cli::JobsTable);
  }
  if (command == "workers") {
    v1::ListWorkersRequest request;
    request.set_job(absl::GetFlag(FLAGS_job));
    v1::ListWorkersResponse workers;
    return Print(call, stub->ListWorkers(&context, request, &workers), workers,
                 &cli::WorkersTable);
  }
  if (command == "create-job") {
    std::ifstream in(absl::GetFlag(FLAGS_spec));
    if (!in) {
      std::fprintf(stderr, "--spec: cannot open \"%s\"\n",
                   absl::GetFlag(FLAGS_spec).c_str());
      return 2;
    }
    const std::string text((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
    v1::CreateJobRequest request;
    const auto parsed = google::protobuf::util::JsonStringToMessage(
        text, request.mutable_job());
    if (!parsed.ok()) {
      std::fprintf(stderr, "--spec: not a JobSpec: %s\n",
                   parsed.ToString().c_str());
      return 2;
    }
    request.set_request_id(absl::StrCat("cli-", request.job().name()));
    v1::Job job;
    const grpc::Status status = stub->CreateJob(&context, request, &job);
    if (!status.ok()) return Fail(status, call);
    std::printf("created %s (%d matrices)\n", job.name().c_str(),
                job.spec().matrices_size());
    const std::string token_path = absl::GetFlag(FLAGS_job_token_file);
    if (token_path.empty()) {
      std::printf("job token: %s\n", job.job_token().c_str());
      return 0;
    }
    const mode_t old_umask = umask(077);
    std::ofstream out(token_path, std::ios::trunc);
    umask(old_umask);
    out << job.job_token() << "\n";
    if (!out.flush()) {
      std::fprintf(stderr, "--job_token_file: cannot write \"%s\"\n",
                   token_path.c_str());
      return 1;
    }
    return 0;
  }
  if (command == "delete-job") {
    v1::DeleteJobRequest request;
    request.set_job(absl::GetFlag(FLAGS_job));
    absl::StatusOr<std::string> job_token =
        ReadToken(absl::GetFlag(FLAGS_job_token_file), "--job_token_file");
    if (!job_token.ok()) {
      std::fprintf(stderr, "%s (delete-job needs the job's token)\n",
                   std::string(job_token.status().message()).c_str());
      return 2;
    }
    request.set_job_token(*job_token);
    v1::DeleteJobResponse response;
    const grpc::Status status = stub->DeleteJob(&context, request, &response);
    if (!status.ok()) return Fail(status, call);
    std::printf("deleted %s\n", request.job().c_str());
    return 0;
  }
  if (command == "drain") {
    v1::DrainWorkerRequest request;
    request.set_job(absl::GetFlag(FLAGS_job));
    request.set_worker_id(absl::GetFlag(FLAGS_worker));
    v1::DrainWorkerResponse response;
    const grpc::Status status = stub->DrainWorker(&context, request, &response);
    if (!status.ok()) return Fail(status, call);
    std::printf(
        "draining %s of %s: it owns nothing from plan version %lld, hands its "
        "momentum over at the next step, then leaves\n",
        request.worker_id().c_str(), request.job().c_str(),
        static_cast<long long>(response.plan_version()));
    return 0;
  }
  std::fprintf(stderr,
               "unknown command \"%s\": plan, jobs, workers, create-job, "
               "delete-job, drain\n",
               command.c_str());
  return 2;
}

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "muonps operator CLI.\n"
      "  muonps plan    --coordinator ADDR --job NAME [--version N] [--json]\n"
      "  muonps jobs    --coordinator ADDR [--json]\n"
      "  muonps workers --coordinator ADDR [--job NAME] [--json]\n"
      "  muonps create-job --coordinator ADDR --spec FILE\n"
      "  muonps delete-job --coordinator ADDR --job NAME\n"
      "  muonps drain   --coordinator ADDR --job NAME --worker ID\n"
      "  muonps health  --coordinator ADDR [--service NAME]");
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  return muonps::Run(args[1]);
}
