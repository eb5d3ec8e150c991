#include "tests/harness/reflection_client.h"

#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/util/json_util.h>

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "proto/credentials.h"
#include "proto/grpc_status.h"
#include "tests/harness/raw_unary_call.h"

namespace muonps {
namespace testing {

namespace pb = google::protobuf;
namespace reflection = grpc::reflection::v1alpha;

namespace {

// One exchange on a fresh ServerReflectionInfo stream: the response, the
// stream's status when it fails, or the server's error_response.
absl::StatusOr<reflection::ServerReflectionResponse> Reflect(
    const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context,
    const reflection::ServerReflectionRequest& request) {
  auto stub = reflection::ServerReflection::NewStub(channel);
  auto stream = stub->ServerReflectionInfo(context);
  reflection::ServerReflectionResponse response;
  const bool sent = stream->Write(request) && stream->WritesDone();
  const bool received = sent && stream->Read(&response);
  const grpc::Status status = stream->Finish();
  if (!status.ok()) {
    return FromGrpc(status, "ServerReflectionInfo");
  }
  if (!received) {
    return absl::UnavailableError("ServerReflectionInfo sent no response");
  }
  if (response.has_error_response()) {
    return absl::Status(
        static_cast<absl::StatusCode>(response.error_response().error_code()),
        response.error_response().error_message());
  }
  return response;
}

}  // namespace

// The descriptors reflection sends, asked for when the pool misses a file
// or symbol. A failed call (not a symbol the server does not know) is kept
// in `failure` so the caller can say why a lookup failed.
class ReflectionClient::Database : public pb::DescriptorDatabase {
 public:
  explicit Database(const ReflectionClient* client) : client_(client) {}

  bool FindFileByName(const std::string& filename,
                      pb::FileDescriptorProto* output) override {
    if (files_.count(filename) == 0) {
      reflection::ServerReflectionRequest request;
      request.set_file_by_filename(filename);
      Fetch(request);
    }
    return CopyOut(filename, output);
  }

  bool FindFileContainingSymbol(const std::string& symbol,
                                pb::FileDescriptorProto* output) override {
    reflection::ServerReflectionRequest request;
    request.set_file_containing_symbol(symbol);
    // The server answers with the declaring file first, then its imports.
    return CopyOut(Fetch(request), output);
  }

  bool FindFileContainingExtension(const std::string&, int,
                                   pb::FileDescriptorProto*) override {
    return false;
  }

  const absl::Status& failure() const { return failure_; }

 private:
  // Fetches and keeps the files of one response; the first file's name, or
  // "" when there is none.
  std::string Fetch(const reflection::ServerReflectionRequest& request) {
    auto context = client_->NewContext(/*reflection=*/true);
    absl::StatusOr<reflection::ServerReflectionResponse> response =
        Reflect(client_->channel_, context.get(), request);
    if (!response.ok()) {
      if (response.status().code() != absl::StatusCode::kNotFound) {
        failure_ = response.status();
      }
      return "";
    }
    std::string first;
    for (const std::string& bytes :
         response->file_descriptor_response().file_descriptor_proto()) {
      pb::FileDescriptorProto file;
      if (!file.ParseFromString(bytes)) {
        failure_ = absl::DataLossError("reflection sent an unparsable file");
        return "";
      }
      if (first.empty()) first = file.name();
      files_.emplace(file.name(), std::move(file));
    }
    return first;
  }

  bool CopyOut(const std::string& filename, pb::FileDescriptorProto* output) {
    auto it = files_.find(filename);
    if (it == files_.end()) return false;
    *output = it->second;
    return true;
  }

  const ReflectionClient* client_;
  std::map<std::string, pb::FileDescriptorProto> files_;
  absl::Status failure_;
};

ReflectionClient::ReflectionClient(std::shared_ptr<grpc::Channel> channel,
                                   Headers headers, Headers reflect_headers,
                                   absl::Duration timeout)
    : channel_(std::move(channel)),
      headers_(std::move(headers)),
      reflect_headers_(std::move(reflect_headers)),
      timeout_(timeout),
      database_(std::make_unique<Database>(this)),
      pool_(std::make_unique<pb::DescriptorPool>(database_.get())) {}

ReflectionClient::~ReflectionClient() = default;

absl::StatusOr<std::unique_ptr<ReflectionClient>> ReflectionClient::Connect(
    const GrpcurlCommand& command, absl::Duration timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  std::shared_ptr<grpc::Channel> channel;
  if (!command.plaintext && command.cacert.empty()) {
    // grpcurl's default: TLS verified by the system's roots.
    channel = grpc::CreateCustomChannel(
        command.address, grpc::SslCredentials(grpc::SslCredentialsOptions()),
        args);
  } else {
    // Only what the command names: no token or CA from the environment.
    SecurityConfig config;
    if (!command.plaintext) config.tls_ca_file = command.cacert;
    absl::StatusOr<std::shared_ptr<grpc::Channel>> opened =
        OpenChannel(command.address, config, args);
    if (!opened.ok()) return opened.status();
    channel = *std::move(opened);
  }
  return std::unique_ptr<ReflectionClient>(new ReflectionClient(
      std::move(channel), command.headers, command.reflect_headers, timeout));
}

std::unique_ptr<grpc::ClientContext> ReflectionClient::NewContext(
    bool reflection) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(DeadlineIn(timeout_));
  for (const auto& [name, value] : headers_) context->AddMetadata(name, value);
  if (reflection) {
    for (const auto& [name, value] : reflect_headers_) {
      context->AddMetadata(name, value);
    }
  }
  return context;
}

absl::StatusOr<std::vector<std::string>> ReflectionClient::ListServices() {
  reflection::ServerReflectionRequest request;
  request.set_list_services("");
  auto context = NewContext(/*reflection=*/true);
  absl::StatusOr<reflection::ServerReflectionResponse> response =
      Reflect(channel_, context.get(), request);
  if (!response.ok()) return response.status();
  std::vector<std::string> names;
  for (const auto& service : response->list_services_response().service()) {
    names.push_back(service.name());
  }
  return names;
}

absl::StatusOr<const pb::ServiceDescriptor*> ReflectionClient::FindService(
    const std::string& name) {
  const pb::ServiceDescriptor* service = pool_->FindServiceByName(name);
  if (service != nullptr) return service;
  if (!database_->failure().ok()) return database_->failure();
  return absl::NotFoundError(
      absl::StrCat("service \"", name, "\" is not known to reflection"));
}

absl::StatusOr<std::string> ReflectionClient::Describe(
    const std::string& symbol) {
  pb::DebugStringOptions options;
  options.include_comments = true;
  auto described = [&](const auto* descriptor, absl::string_view kind) {
    return absl::StrCat(descriptor->full_name(), " is ", kind, ":\n",
                        descriptor->DebugStringWithOptions(options));
  };
  if (const auto* d = pool_->FindServiceByName(symbol)) {
    return described(d, "a service");
  }
  if (const auto* d = pool_->FindMessageTypeByName(symbol)) {
    return described(d, "a message");
  }
  if (const auto* d = pool_->FindEnumTypeByName(symbol)) {
    return described(d, "an enum");
  }
  if (const auto* d = pool_->FindMethodByName(symbol)) {
    return described(d, "a method");
  }
  if (const auto* d = pool_->FindFieldByName(symbol)) {
    return described(d, "a field");
  }
  if (const auto* d = pool_->FindEnumValueByName(symbol)) {
    return absl::StrCat(d->full_name(), " is an enum value:\n", d->name(),
                        " = ", d->number(), ";\n");
  }
  if (!database_->failure().ok()) return database_->failure();
  return absl::NotFoundError(
      absl::StrCat("symbol \"", symbol, "\" is not known to reflection"));
}

absl::StatusOr<std::string> ReflectionClient::Call(
    const std::string& method, const std::string& request_json) {
  const size_t slash = method.rfind('/');
  absl::StatusOr<const pb::ServiceDescriptor*> service =
      FindService(method.substr(0, slash));
  if (!service.ok()) return service.status();
  const pb::MethodDescriptor* descriptor =
      (*service)->FindMethodByName(method.substr(slash + 1));
  if (descriptor == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("method \"", method, "\" is not known to reflection"));
  }
  if (descriptor->client_streaming() || descriptor->server_streaming()) {
    return absl::UnimplementedError(
        absl::StrCat(method, " streams; only unary calls are supported"));
  }
  pb::DynamicMessageFactory factory(pool_.get());
  std::unique_ptr<pb::Message> request(
      factory.GetPrototype(descriptor->input_type())->New());
  const auto parsed = pb::util::JsonStringToMessage(
      request_json.empty() ? "{}" : request_json, request.get());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("-d is not a ", descriptor->input_type()->full_name(),
                     ": ", parsed.ToString()));
  }
  auto context = NewContext(/*reflection=*/false);
  std::string bytes;
  const grpc::Status status = RawUnaryCall(
      channel_, context.get(),
      absl::StrCat("/", (*service)->full_name(), "/", descriptor->name()),
      request->SerializeAsString(), &bytes);
  if (!status.ok()) return FromGrpc(status, method);
  std::unique_ptr<pb::Message> response(
      factory.GetPrototype(descriptor->output_type())->New());
  if (!response->ParseFromString(bytes)) {
    return absl::DataLossError(
        absl::StrCat(method, ": response is not a ",
                     descriptor->output_type()->full_name()));
  }
  pb::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto printed = pb::util::MessageToJsonString(*response, &json, options);
  if (!printed.ok()) return absl::InternalError(printed.ToString());
  return json;
}

absl::StatusOr<std::string> RunGrpcurl(const GrpcurlCommand& command,
                                       absl::Duration timeout) {
  absl::StatusOr<std::unique_ptr<ReflectionClient>> client =
      ReflectionClient::Connect(command, timeout);
  if (!client.ok()) return client.status();
  switch (command.verb) {
    case GrpcurlCommand::Verb::kCall:
      return (*client)->Call(command.symbol, command.data);
    case GrpcurlCommand::Verb::kDescribe:
      if (!command.symbol.empty()) return (*client)->Describe(command.symbol);
      break;
    case GrpcurlCommand::Verb::kList:
      break;
  }
  absl::StatusOr<std::vector<std::string>> services = (*client)->ListServices();
  if (!services.ok()) return services.status();
  if (command.verb == GrpcurlCommand::Verb::kDescribe) {
    std::string out;
    for (const std::string& name : *services) {
      absl::StatusOr<std::string> one = (*client)->Describe(name);
      if (!one.ok()) return one.status();
      out += *one;
    }
    return out;
  }
  if (command.symbol.empty()) return absl::StrJoin(*services, "\n") + "\n";
  // `list SERVICE`: its methods.
  absl::StatusOr<const pb::ServiceDescriptor*> service =
      (*client)->FindService(command.symbol);
  if (!service.ok()) return service.status();
  std::string out;
  for (int i = 0; i < (*service)->method_count(); ++i) {
    absl::StrAppend(&out, (*service)->method(i)->full_name(), "\n");
  }
  return out;
}

}  // namespace testing
}  // namespace muonps
