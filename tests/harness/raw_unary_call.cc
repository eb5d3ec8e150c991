#include "tests/harness/raw_unary_call.h"

#include <grpcpp/generic/generic_stub.h>

#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"

namespace muonps {
namespace testing {

grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                          grpc::ClientContext* context,
                          const std::string& method, const std::string& request,
                          std::string* response) {
  grpc::GenericStub stub(channel);
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(context, method, grpc::StubOptions(), &request_buffer,
                 &response_buffer, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  response->clear();
  if (!status.ok()) return status;
  std::vector<grpc::Slice> slices;
  if (!response_buffer.Dump(&slices).ok()) {
    return grpc::Status(grpc::StatusCode::DATA_LOSS, "unreadable response");
  }
  for (const grpc::Slice& s : slices) {
    response->append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return status;
}

}  // namespace testing
}  // namespace muonps
