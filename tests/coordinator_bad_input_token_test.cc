// One real muonps-coordinator: every method of every service but health
// refuses a caller without the bearer token, or with a wrong one, before
// its handler runs, without echoing the token; plaintext against the TLS
// port reaches no handler; the healthy job "keep" is what it was after.
#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "proto/credentials.h"
#include "tests/coordinator_bad_input_fixture.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace {

using bad_input_test::CoordinatorBadInputTest;
using bad_input_test::Deadline;
using bad_input_test::Deterministic;
using grpc::StatusCode;

// Every method of every service but health refuses a caller without the
// bearer token, or with a wrong one, before its handler runs: the methods
// come from the service descriptors, so a method added later is covered.
TEST_F(CoordinatorBadInputTest,
       EveryMethodButHealthRefusesCallersWithoutTheToken) {
  CreateJobs();
  const v1::Job job_before = KeepJob();
  const std::string wrong_token = testing::NewTempDir("wrong-token") + "/token";
  std::ofstream(wrong_token) << "ffffffffffffffffffffffffffffffff\n";
  const std::string ca = testing::TestCredential("ca.pem");
  for (const std::string& token_file : {std::string(), wrong_token}) {
    auto channel =
        OpenChannel(address_, {.token_file = token_file, .tls_ca_file = ca});
    ASSERT_TRUE(channel.ok());
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            "muonps.v1.Coordinator");
    ASSERT_NE(service, nullptr);
    for (int i = 0; i < service->method_count(); ++i) {
      const google::protobuf::MethodDescriptor* method = service->method(i);
      std::string response;
      // A real request, so that only the token can be wrong.
      v1::DeleteJobRequest valid_delete;
      valid_delete.set_job("keep");
      valid_delete.set_job_token(job_tokens_.at("keep"));
      const std::string request = method->name() == "DeleteJob"
                                      ? valid_delete.SerializeAsString()
                                      : std::string();
      grpc::Status status;
      if (method->server_streaming()) {
        v1::WatchPlanRequest watch;
        watch.set_job("keep");
        grpc::ClientContext context;
        context.set_deadline(Deadline());
        auto reader =
            v1::Coordinator::NewStub(*channel)->WatchPlan(&context, watch);
        v1::Plan plan;
        EXPECT_FALSE(reader->Read(&plan));
        status = reader->Finish();
      } else {
        status = Call(method->name(), request, &response,
                      "muonps.v1.Coordinator", *channel);
      }
      EXPECT_EQ(status.error_code(), StatusCode::UNAUTHENTICATED)
          << method->name() << " with token file \"" << token_file
          << "\": " << status.error_message();
      EXPECT_EQ(status.error_message().find("ffff"), std::string::npos)
          << "a refusal must not echo the token";
    }
    // Reflection is behind the token too; health is not.
    std::string response;
    auto reflection =
        grpc::reflection::v1alpha::ServerReflection::NewStub(*channel);
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    auto stream = reflection->ServerReflectionInfo(&context);
    grpc::reflection::v1alpha::ServerReflectionRequest list;
    list.set_list_services("");
    stream->Write(list);
    stream->WritesDone();
    grpc::reflection::v1alpha::ServerReflectionResponse listed;
    EXPECT_FALSE(stream->Read(&listed));
    EXPECT_EQ(stream->Finish().error_code(), StatusCode::UNAUTHENTICATED);
    auto health = grpc::health::v1::Health::NewStub(*channel);
    grpc::ClientContext health_context;
    health_context.set_deadline(Deadline());
    grpc::health::v1::HealthCheckResponse serving;
    EXPECT_TRUE(health->Check(&health_context, {}, &serving).ok());
  }
  // Plaintext against the TLS port never reaches a handler.
  auto plaintext =
      OpenChannel(address_, {.token_file = testing::TestCredential("token")});
  ASSERT_TRUE(plaintext.ok());
  std::string response;
  EXPECT_EQ(Call("ListJobs", "", &response, "muonps.v1.Coordinator", *plaintext)
                .error_code(),
            StatusCode::UNAVAILABLE);
  EXPECT_EQ(Deterministic(KeepJob()), Deterministic(job_before));
}

}  // namespace
}  // namespace muonps
