// RawUnaryCall: one unary gRPC call of serialized bytes, by method path,
// with no generated stub (grpc::GenericStub), as grpcurl and a hostile
// client send them. Tests only (testonly in BUILD).
#ifndef MUONPS_TESTS_HARNESS_RAW_UNARY_CALL_H_
#define MUONPS_TESTS_HARNESS_RAW_UNARY_CALL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace muonps {
namespace testing {

// Sends `request` to `method` ("/package.Service/Method") on `channel`
// under `context` (its deadline, metadata) and waits for the answer. On OK,
// *response holds the reply's bytes (DATA_LOSS if they cannot be read);
// otherwise it is empty and the server's status is returned.
grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                          grpc::ClientContext* context,
                          const std::string& method, const std::string& request,
                          std::string* response);

}  // namespace testing
}  // namespace muonps

#endif  // MUONPS_TESTS_HARNESS_RAW_UNARY_CALL_H_
