// grpc.reflection.v1alpha.ServerReflection served from muonps.v1's own
// descriptors with their comments (proto/v1_descriptors.h), so that
// grpcurl's `describe` shows the API documentation; files it does not
// hold (grpc.health.v1, the reflection service's own) come from the
// generated descriptor pool. Every file is sent with its imports (each
// once per stream), as grpcurl expects.
//
// Replaces gRPC's reflection plugin: a binary that registers this must not
// link Debian's libgrpc++_reflection too. Thread-safe (immutable after
// construction).
#ifndef MUONPS_SERVER_REFLECTION_REFLECTION_SERVICE_H_
#define MUONPS_SERVER_REFLECTION_REFLECTION_SERVICE_H_

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor_database.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"

namespace muonps {
namespace server {

class ReflectionService final
    : public grpc::reflection::v1alpha::ServerReflection::Service {
 public:
  // `services`: the full names ListServices reports (the server's).
  // Streams must carry `token` as "authorization: Bearer TOKEN"
  // (UNAUTHENTICATED otherwise; empty: no check), as the server's own
  // methods do: the API's shape is not given to strangers.
  ReflectionService(std::vector<std::string> services, std::string token);

  grpc::Status ServerReflectionInfo(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<
          grpc::reflection::v1alpha::ServerReflectionResponse,
          grpc::reflection::v1alpha::ServerReflectionRequest>* stream) override;

 private:
  // The serialized file `name` (with comments where held); "" if unknown.
  std::string FileBytes(const std::string& name) const;
  // The file defining `symbol` (held files first), or "".
  std::string FileOfSymbol(const std::string& symbol) const;
  // Adds `name` and its imports not yet in `sent` to `out`; false if
  // `name` is a file it does not know.
  bool AddWithImports(
      const std::string& name, std::set<std::string>* sent,
      grpc::reflection::v1alpha::FileDescriptorResponse* out) const;

  const std::vector<std::string> services_;
  const std::string token_;
  std::map<std::string, std::string> held_;  // file name -> serialized
  google::protobuf::SimpleDescriptorDatabase database_;
  std::unique_ptr<google::protobuf::DescriptorPool> pool_;
};

}  // namespace server
}  // namespace muonps

#endif  // MUONPS_SERVER_REFLECTION_REFLECTION_SERVICE_H_
