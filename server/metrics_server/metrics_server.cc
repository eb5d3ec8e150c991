// MetricsServer (metrics_server.h): the /metrics HTTP(S) endpoint, its
// address and bearer-token rules.
#include "server/metrics_server/metrics_server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/secret.h"
#include "common/status.h"

namespace muonps {
namespace {

constexpr char kContentType[] = "text/plain; version=0.0.4";

// The token in the file at `path`, without surrounding whitespace.
absl::StatusOr<std::string> ReadToken(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return FieldError(absl::StatusCode::kFailedPrecondition,
                      absl::StrCat("metrics token file ", Quoted(path)),
                      "cannot be read");
  }
  std::string token((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  absl::StripAsciiWhitespace(&token);
  if (token.empty()) {
    return FieldError(absl::StatusCode::kFailedPrecondition,
                      absl::StrCat("metrics token file ", Quoted(path)),
                      "is empty");
  }
  return token;
}

}  // namespace

absl::StatusOr<std::optional<MetricsServerOptions>>
MetricsServerOptionsFromFlags(const std::string& address, int port,
                              const std::string& token_file,
                              const std::string& tls_cert_file,
                              const std::string& tls_key_file) {
  if (port == -1) return std::nullopt;
  MetricsServerOptions options;
  // HOST:PORT, or [V6]:PORT.
  const size_t colon = address.rfind(':');
  absl::string_view host = colon == std::string::npos
                               ? ""
                               : absl::string_view(address).substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() ||
      !absl::SimpleAtoi(address.substr(colon + 1), &options.port) ||
      options.port < 0 || options.port > 65535) {
    return InvalidField("--metrics_address",
                        absl::StrCat(Quoted(address),
                                     " is not HOST:PORT with PORT in "
                                     "[0, 65535]"));
  }
  options.host = std::string(host);
  if (port < -1 || port > 65535) {
    return InvalidField("--metrics_port",
                        absl::StrCat(port, " is not -1 or in [0, 65535]"));
  }
  if (port > 0) options.port = port;
  std::string token_path = token_file;
  if (token_path.empty()) {
    const char* env = std::getenv("MUONPS_METRICS_TOKEN_FILE");
    if (env != nullptr) token_path = env;
  }
  if (!token_path.empty()) {
    MUONPS_ASSIGN_OR_RETURN(options.bearer_token, ReadToken(token_path));
  } else if (!IsLoopbackHost(options.host)) {
    return InvalidField(
        "--metrics_address",
        absl::StrCat(Quoted(address),
                     " is not a loopback address: give a bearer token with "
                     "--metrics_token_file or $MUONPS_METRICS_TOKEN_FILE"));
  }
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return InvalidField("--metrics_tls_cert",
                        "and --metrics_tls_key go together");
  }
  options.tls_cert_file = tls_cert_file;
  options.tls_key_file = tls_key_file;
  return options;
}

struct MetricsServer::Impl {
  std::unique_ptr<httplib::Server> http;
  std::thread listener;
  std::atomic<bool> listen_returned{false};
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsRegistry* registry, const std::string& host, int port) {
  MetricsServerOptions options;
  options.host = host;
  options.port = port;
  return Start(registry, options);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsRegistry* registry, const MetricsServerOptions& options) {
  const std::string& host = options.host;
  const int port = options.port;
  if (port < 0 || port > 65535) {
    return InvalidField("metrics port",
                        absl::StrCat(port, " is not in [0, 65535]"));
  }
  if (options.bearer_token.empty() && !IsLoopbackHost(host)) {
    return InvalidField(absl::StrCat("metrics endpoint ", host, ":", port),
                        "is not on a loopback address and has no bearer token");
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->impl_ = std::make_unique<Impl>();
  Impl* impl = server->impl_.get();
  const bool tls = !options.tls_cert_file.empty();
  if (tls) {
    auto https = std::make_unique<httplib::SSLServer>(
        options.tls_cert_file.c_str(), options.tls_key_file.c_str());
    if (!https->is_valid()) {
      return FieldError(
          absl::StatusCode::kFailedPrecondition,
          absl::StrCat("metrics TLS certificate ",
                       Quoted(options.tls_cert_file), " and key ",
                       Quoted(options.tls_key_file)),
          "cannot be loaded (missing, unreadable, or not a matching PEM "
          "pair)");
    }
    impl->http = std::move(https);
  } else {
    impl->http = std::make_unique<httplib::Server>();
  }
  httplib::Server& http = *impl->http;
  // Scrapes are rare and cheap; two workers are plenty.
  http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  if (!options.bearer_token.empty()) {
    http.set_pre_routing_handler(
        [token = options.bearer_token](const httplib::Request& request,
                                       httplib::Response& response) {
          const std::string header = request.get_header_value("Authorization");
          absl::string_view given = header;
          if (absl::ConsumePrefix(&given, "Bearer ") &&
              SecretsEqual(token, given)) {
            return httplib::Server::HandlerResponse::Unhandled;
          }
          response.status = 401;
          response.set_header("WWW-Authenticate", "Bearer");
          response.set_content("unauthorized\n", "text/plain");
          return httplib::Server::HandlerResponse::Handled;
        });
  }
  http.Get("/metrics",
           [registry](const httplib::Request&, httplib::Response& response) {
             response.set_content(registry->RenderText(), kContentType);
           });
  http.Get("/healthz",
           [](const httplib::Request&, httplib::Response& response) {
             response.set_content("ok", "text/plain");
           });

  const std::string endpoint = absl::StrCat(host, ":", port);
  const int bound = port == 0 ? http.bind_to_any_port(host)
                              : (http.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    return FieldError(absl::StatusCode::kUnavailable,
                      absl::StrCat("metrics endpoint ", endpoint),
                      "cannot bind (address in use, not local, or host "
                      "not resolvable)");
  }
  server->port_ = bound;
  const bool v6 = absl::StrContains(host, ':');
  server->url_ = absl::StrCat(tls ? "https://" : "http://", v6 ? "[" : "", host,
                              v6 ? "]" : "", ":", bound, "/metrics");

  impl->listener = std::thread([impl] {
    impl->http->listen_after_bind();
    impl->listen_returned = true;
  });
  // stop() is a no-op until the listener thread marks the server running, so
  // a server destroyed right after Start would otherwise never stop. Wait
  // until it runs (or has already given up).
  while (!impl->http->is_running() && !impl->listen_returned) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!impl->http->is_running()) {
    return FieldError(absl::StatusCode::kUnavailable,
                      absl::StrCat("metrics endpoint ", host, ":", bound),
                      "stopped listening right after binding");
  }
  return server;
}

MetricsServer::~MetricsServer() {
  if (impl_ == nullptr || impl_->http == nullptr) return;
  impl_->http->stop();
  if (impl_->listener.joinable()) impl_->listener.join();
}

}  // namespace muonps
