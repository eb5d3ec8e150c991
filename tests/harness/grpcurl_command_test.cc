#include "tests/harness/grpcurl_command.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace muonps {
namespace testing {
namespace {

std::string Unchanged(const std::string& path) { return path; }

TEST(GrpcurlCommandTest, ReadsQuotesHeadersDataAndCatOfTheMappedFile) {
  const std::string token = std::string(getenv("TEST_TMPDIR")) + "/token";
  std::ofstream(token) << "s3cret-token-0123456789\nsecond line\n";
  auto path_of = [&](const std::string& path) {
    return path == "/creds/token" ? token : "/mapped" + path;
  };
  absl::StatusOr<GrpcurlCommand> command =
      ParseGrpcurlLine(R"x(grpcurl -cacert /creds/ca.pem )x"
                       R"x(-H "Authorization: Bearer $(cat /creds/token)" )x"
                       R"x(-d '{"job":"demo", "a b":"$(x)"}' 127.0.0.1:7070 )x"
                       R"x(muonps.v1.Coordinator/GetPlan)x",
                       path_of);
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->cacert, "/mapped/creds/ca.pem");
  ASSERT_EQ(command->headers.size(), 1u);
  EXPECT_EQ(command->headers[0].first, "authorization");
  EXPECT_EQ(command->headers[0].second, "Bearer s3cret-token-0123456789");
  EXPECT_EQ(command->data, R"x({"job":"demo", "a b":"$(x)"})x");
  EXPECT_EQ(command->address, "127.0.0.1:7070");
  EXPECT_EQ(command->verb, GrpcurlCommand::Verb::kCall);
  EXPECT_EQ(command->symbol, "muonps.v1.Coordinator/GetPlan");
  EXPECT_FALSE(command->plaintext);
}

TEST(GrpcurlCommandTest, ReadsListDescribeEqualsFormsAndComments) {
  absl::StatusOr<GrpcurlCommand> list = ParseGrpcurlLine(
      "grpcurl --plaintext -reflect-header='x-a: b' host:1 list  # services",
      Unchanged);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(list->plaintext);
  EXPECT_TRUE(list->headers.empty());
  ASSERT_EQ(list->reflect_headers.size(), 1u);
  EXPECT_EQ(list->reflect_headers[0].second, "b");
  EXPECT_EQ(list->verb, GrpcurlCommand::Verb::kList);
  EXPECT_EQ(list->symbol, "");
  absl::StatusOr<GrpcurlCommand> describe =
      ParseGrpcurlLine("grpcurl host:1 describe muonps.v1.Plan", Unchanged);
  ASSERT_TRUE(describe.ok()) << describe.status();
  EXPECT_EQ(describe->verb, GrpcurlCommand::Verb::kDescribe);
  EXPECT_EQ(describe->symbol, "muonps.v1.Plan");
}

TEST(GrpcurlCommandTest, RefusesWhatItDoesNotUnderstand) {
  for (const char* line : {
           "grpcurl -unknown host:1 list",       // flag
           "grpcurl -H 'no colon' host:1 list",  // header
           "grpcurl host:1 list | head",         // pipe
           "grpcurl -d \"$HOME\" host:1 a.B/C",  // variable
           "grpcurl -d '{' host:1",              // unbalanced, no verb
           "grpcurl host:1 frobnicate",          // verb
           "grpcurl -H \"a: $(cat /nonexistent)\" host:1 list",  // file
           "curl host:1",                                        // program
       }) {
    EXPECT_FALSE(ParseGrpcurlLine(line, Unchanged).ok()) << line;
  }
}

}  // namespace
}  // namespace testing
}  // namespace muonps
