#include "proto/credentials.h"

#include <arpa/inet.h>
#include <grpcpp/support/client_interceptor.h>
#include <openssl/crypto.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/secret.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace {

constexpr size_t kMinTokenLength = 16;

// OpenSSL's own exit handler (OPENSSL_cleanup) deletes its per-thread keys
// while gRPC's threads still run; a thread that ends after it never frees
// its error state (LeakSanitizer saw 904 bytes a thread in about one run of
// 30 of a TLS client test). Every process that speaks gRPC links this file,
// and initializes OpenSSL here, before gRPC first does, without that
// handler: the process is ending, and its memory goes with it.
[[maybe_unused]] const bool kOpenSslWithoutExitHandler =
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cannot read \"", path, "\""));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  if (contents.str().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": \"", path, "\" is empty"));
  }
  return contents.str();
}

// Adds "authorization: Bearer TOKEN" to every call of a channel.
class BearerInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* header) : header_(header) {}
  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;  // owned by the factory, which the channel keeps
};

class BearerInterceptorFactory
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(std::string token)
      : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(&header_);
  }

 private:
  const std::string header_;
};

}  // namespace

SecurityConfig WithEnvironmentDefaults(SecurityConfig config) {
  const auto fill = [](std::string* field, const char* variable) {
    const char* value = std::getenv(variable);
    if (field->empty() && value != nullptr) *field = value;
  };
  fill(&config.token_file, "MUONPS_TOKEN_FILE");
  fill(&config.tls_cert_file, "MUONPS_TLS_CERT_FILE");
  fill(&config.tls_key_file, "MUONPS_TLS_KEY_FILE");
  fill(&config.tls_ca_file, "MUONPS_TLS_CA_FILE");
  fill(&config.tls_client_ca_file, "MUONPS_TLS_CLIENT_CA_FILE");
  return config;
}

absl::StatusOr<std::string> ReadToken(const std::string& path,
                                      absl::string_view what) {
  absl::StatusOr<std::string> contents = ReadFile(path, what);
  if (!contents.ok()) return contents.status();
  absl::string_view line = *contents;
  line = line.substr(0, line.find('\n'));
  line = absl::StripAsciiWhitespace(line);
  if (line.size() < kMinTokenLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the token in \"", path, "\" has ", line.size(),
                     " characters; at least ", kMinTokenLength, " needed"));
  }
  for (char c : line) {
    if (c <= ' ' || c == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the token in \"", path,
                       "\" holds a space or control character"));
    }
  }
  return std::string(line);
}

absl::StatusOr<ServerSecurity> LoadServerSecurity(const SecurityConfig& config,
                                                  absl::string_view host) {
  ServerSecurity out;
  if (!config.token_file.empty()) {
    absl::StatusOr<std::string> token =
        ReadToken(config.token_file, "--token_file");
    if (!token.ok()) return token.status();
    out.token = *std::move(token);
  }
  const bool has_cert = !config.tls_cert_file.empty();
  const bool has_key = !config.tls_key_file.empty();
  if (has_cert != has_key) {
    return absl::InvalidArgumentError(
        "--tls_cert_file and --tls_key_file: give both or neither");
  }
  const bool loopback = IsLoopbackHost(host);
  if (has_cert) {
    grpc::SslServerCredentialsOptions ssl;
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    absl::StatusOr<std::string> cert =
        ReadFile(config.tls_cert_file, "--tls_cert_file");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key =
        ReadFile(config.tls_key_file, "--tls_key_file");
    if (!key.ok()) return key.status();
    pair.cert_chain = *std::move(cert);
    pair.private_key = *std::move(key);
    ssl.pem_key_cert_pairs.push_back(std::move(pair));
    if (!config.tls_client_ca_file.empty()) {
      absl::StatusOr<std::string> ca =
          ReadFile(config.tls_client_ca_file, "--tls_client_ca_file");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *std::move(ca);
      ssl.client_certificate_request =
          GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    out.credentials = grpc::SslServerCredentials(ssl);
    out.tls = true;
    if (!loopback && out.token.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "listening on ", host,
          " (not loopback) needs a bearer token as well as TLS: set "
          "--token_file or MUONPS_TOKEN_FILE"));
    }
    if (out.token.empty()) {
      spdlog::warn("TLS without a bearer token on {}: any client may call",
                   std::string(host));
    }
    return out;
  }
  if (!loopback) {
    return absl::FailedPreconditionError(absl::StrCat(
        "listening on ", host,
        " (not loopback) needs TLS and a bearer token: set --tls_cert_file, "
        "--tls_key_file and --token_file (or MUONPS_TLS_CERT_FILE, "
        "MUONPS_TLS_KEY_FILE, MUONPS_TOKEN_FILE)"));
  }
  if (!config.insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no TLS certificate: set --tls_cert_file and --tls_key_file, or "
        "pass --insecure to serve plaintext on ",
        host, " (loopback only)"));
  }
  spdlog::warn(
      "--insecure: serving plaintext gRPC on {} ({})", std::string(host),
      out.token.empty() ? "no bearer token checked" : "bearer token checked");
  out.credentials = grpc::InsecureServerCredentials();
  return out;
}

absl::Status CheckBearerToken(const grpc::ServerContext& context,
                              absl::string_view expected) {
  if (expected.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "missing \"authorization: Bearer TOKEN\" metadata (the client has "
        "no --token_file or MUONPS_TOKEN_FILE)");
  }
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::ConsumePrefix(&value, "Bearer ")) {
    return absl::UnauthenticatedError(
        "the authorization metadata is not \"Bearer TOKEN\"");
  }
  if (!SecretsEqual(value, expected)) {
    return absl::UnauthenticatedError("the bearer token is not this server's");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(
    const std::string& target, const SecurityConfig& config,
    const grpc::ChannelArguments& caller_args) {
  grpc::ChannelArguments args = caller_args;
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC also takes it as the time
  // one connection attempt may take, which a TLS handshake on a loaded
  // machine exceeds.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  const bool unix_socket = absl::StartsWith(target, "unix:");
  if (!unix_socket && !config.tls_ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> ca =
        ReadFile(config.tls_ca_file, "tls_ca_file");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
    if (!config.tls_cert_file.empty() || !config.tls_key_file.empty()) {
      absl::StatusOr<std::string> cert =
          ReadFile(config.tls_cert_file, "tls_cert_file");
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key =
          ReadFile(config.tls_key_file, "tls_key_file");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  if (!config.token_file.empty()) {
    absl::StatusOr<std::string> token =
        ReadToken(config.token_file, "token_file");
    if (!token.ok()) return token.status();
    interceptors.push_back(
        std::make_unique<BearerInterceptorFactory>(*std::move(token)));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, credentials, args, std::move(interceptors));
}

}  // namespace muonps
