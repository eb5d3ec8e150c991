#include "server/reflection/reflection_service.h"

#include <google/protobuf/descriptor.pb.h>

#include "proto/credentials.h"
#include "proto/grpc_status.h"
#include "proto/v1_descriptors.h"

namespace muonps {
namespace server {

namespace pb = google::protobuf;
namespace rv = grpc::reflection::v1alpha;

ReflectionService::ReflectionService(std::vector<std::string> services,
                                     std::string token)
    : services_(std::move(services)), token_(std::move(token)) {
  pb::FileDescriptorSet set;
  if (set.ParseFromArray(proto::kV1Descriptors,
                         static_cast<int>(proto::kV1DescriptorsSize))) {
    for (const pb::FileDescriptorProto& file : set.file()) {
      held_[file.name()] = file.SerializeAsString();
      database_.Add(file);
    }
  }
  pool_ = std::make_unique<pb::DescriptorPool>(&database_);
}

std::string ReflectionService::FileBytes(const std::string& name) const {
  auto it = held_.find(name);
  if (it != held_.end()) return it->second;
  const pb::FileDescriptor* file =
      pb::DescriptorPool::generated_pool()->FindFileByName(name);
  if (file == nullptr) return "";
  pb::FileDescriptorProto proto;
  file->CopyTo(&proto);
  return proto.SerializeAsString();
}

std::string ReflectionService::FileOfSymbol(const std::string& symbol) const {
  const pb::DescriptorPool* pools[] = {pool_.get(),
                                       pb::DescriptorPool::generated_pool()};
  for (const pb::DescriptorPool* pool : pools) {
    const pb::FileDescriptor* file = pool->FindFileContainingSymbol(symbol);
    if (file != nullptr) return file->name();
  }
  return "";
}

bool ReflectionService::AddWithImports(const std::string& name,
                                       std::set<std::string>* sent,
                                       rv::FileDescriptorResponse* out) const {
  if (!sent->insert(name).second) return true;
  const std::string bytes = FileBytes(name);
  if (bytes.empty()) return false;
  out->add_file_descriptor_proto(bytes);
  pb::FileDescriptorProto proto;
  if (!proto.ParseFromString(bytes)) return true;
  for (const std::string& dependency : proto.dependency()) {
    AddWithImports(dependency, sent, out);
  }
  return true;
}

grpc::Status ReflectionService::ServerReflectionInfo(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<rv::ServerReflectionResponse,
                             rv::ServerReflectionRequest>* stream) {
  const absl::Status allowed = CheckBearerToken(*context, token_);
  if (!allowed.ok()) return ToGrpc(allowed);
  std::set<std::string> sent;  // files this stream has had
  rv::ServerReflectionRequest request;
  while (stream->Read(&request)) {
    rv::ServerReflectionResponse response;
    response.set_valid_host(request.host());
    *response.mutable_original_request() = request;
    auto not_found = [&response](const std::string& what) {
      response.mutable_error_response()->set_error_code(
          static_cast<int>(grpc::StatusCode::NOT_FOUND));
      response.mutable_error_response()->set_error_message(what);
    };
    switch (request.message_request_case()) {
      case rv::ServerReflectionRequest::kListServices:
        for (const std::string& name : services_) {
          response.mutable_list_services_response()->add_service()->set_name(
              name);
        }
        break;
      case rv::ServerReflectionRequest::kFileByFilename:
      case rv::ServerReflectionRequest::kFileContainingSymbol: {
        const bool by_name = request.message_request_case() ==
                             rv::ServerReflectionRequest::kFileByFilename;
        const std::string name =
            by_name ? request.file_by_filename()
                    : FileOfSymbol(request.file_containing_symbol());
        // The asked-for file always comes back, even if sent before.
        sent.erase(name);
        if (name.empty() ||
            !AddWithImports(name, &sent,
                            response.mutable_file_descriptor_response())) {
          not_found(by_name ? "file not found" : "symbol not found");
        }
        break;
      }
      case rv::ServerReflectionRequest::kFileContainingExtension: {
        const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
        const pb::Descriptor* type = pool->FindMessageTypeByName(
            request.file_containing_extension().containing_type());
        const pb::FieldDescriptor* extension =
            type == nullptr
                ? nullptr
                : pool->FindExtensionByNumber(
                      type,
                      request.file_containing_extension().extension_number());
        if (extension == nullptr) {
          not_found("extension not found");
          break;
        }
        AddWithImports(extension->file()->name(), &sent,
                       response.mutable_file_descriptor_response());
        break;
      }
      case rv::ServerReflectionRequest::kAllExtensionNumbersOfType: {
        const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
        const pb::Descriptor* type = pool->FindMessageTypeByName(
            request.all_extension_numbers_of_type());
        if (type == nullptr) {
          not_found("type not found");
          break;
        }
        std::vector<const pb::FieldDescriptor*> extensions;
        pool->FindAllExtensions(type, &extensions);
        auto* out = response.mutable_all_extension_numbers_response();
        out->set_base_type_name(type->full_name());
        for (const pb::FieldDescriptor* e : extensions) {
          out->add_extension_number(e->number());
        }
        break;
      }
      default:
        response.mutable_error_response()->set_error_code(
            static_cast<int>(grpc::StatusCode::UNIMPLEMENTED));
        response.mutable_error_response()->set_error_message(
            "unknown reflection request");
    }
    if (!stream->Write(response)) break;
    if (context->IsCancelled()) break;
  }
  return grpc::Status::OK;
}

}  // namespace server
}  // namespace muonps
