// A gRPC client that knows nothing of a server's API but what server
// reflection (grpc.reflection.v1alpha) tells it, as grpcurl does: it lists
// services, describes symbols from the descriptors reflection sends, and
// calls unary methods with requests built from JSON by dynamic messages
// over a generic stub. No generated code of the server's API is used.
// Thread-compatible: one thread at a time per client.
#ifndef MUONPS_TESTS_HARNESS_REFLECTION_CLIENT_H_
#define MUONPS_TESTS_HARNESS_REFLECTION_CLIENT_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor_database.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/harness/grpcurl_command.h"

namespace muonps {
namespace testing {

class ReflectionClient {
 public:
  // A client of `command.address`: TLS verified by `command.cacert`, or
  // plaintext with `command.plaintext`; every call carries
  // `command.headers`, reflection calls `command.reflect_headers` as well,
  // and nothing else (no token from the environment). Each call gives up after
  // `timeout`. INVALID_ARGUMENT when the CA file cannot be read.
  static absl::StatusOr<std::unique_ptr<ReflectionClient>> Connect(
      const GrpcurlCommand& command, absl::Duration timeout);

  ReflectionClient(const ReflectionClient&) = delete;
  ReflectionClient& operator=(const ReflectionClient&) = delete;
  ~ReflectionClient();

  // The services the server lists, in its order. The reflection call's
  // status (e.g. UNAUTHENTICATED, UNAVAILABLE) on failure.
  absl::StatusOr<std::vector<std::string>> ListServices();

  // grpcurl's `describe SYMBOL`: "NAME is a service:" (message, enum,
  // method, field, ...) and its definition with the comments reflection
  // sent. NOT_FOUND when reflection does not know the symbol.
  absl::StatusOr<std::string> Describe(const std::string& symbol);

  // The service `name`, its file and imports fetched through reflection
  // (owned by this client). The failed reflection call's status, or
  // NOT_FOUND.
  absl::StatusOr<const google::protobuf::ServiceDescriptor*> FindService(
      const std::string& name);

  // Calls unary `method` ("package.Service/Method") with the request that
  // `request_json` describes ("" for an empty one) and returns the response
  // as JSON (proto field names). INVALID_ARGUMENT for JSON that does not fit
  // the request type, UNIMPLEMENTED for a streaming method, the call's
  // status when it fails.
  absl::StatusOr<std::string> Call(const std::string& method,
                                   const std::string& request_json);

 private:
  class Database;
  using Headers = std::vector<std::pair<std::string, std::string>>;
  ReflectionClient(std::shared_ptr<grpc::Channel> channel, Headers headers,
                   Headers reflect_headers, absl::Duration timeout);
  // A context with the deadline and the headers of a method call, or of a
  // reflection call.
  std::unique_ptr<grpc::ClientContext> NewContext(bool reflection) const;

  std::shared_ptr<grpc::Channel> channel_;
  Headers headers_;
  Headers reflect_headers_;
  absl::Duration timeout_;
  std::unique_ptr<Database> database_;
  std::unique_ptr<google::protobuf::DescriptorPool> pool_;
};

// Runs `command` as grpcurl would, through a ReflectionClient, and returns
// what grpcurl prints: `list` one service a line, `describe` the
// definitions, a call the response as JSON. The first failing status
// otherwise.
absl::StatusOr<std::string> RunGrpcurl(const GrpcurlCommand& command,
                                       absl::Duration timeout);

}  // namespace testing
}  // namespace muonps

#endif  // MUONPS_TESTS_HARNESS_REFLECTION_CLIENT_H_
