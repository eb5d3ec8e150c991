// One grpcurl command line, as a shell and grpcurl would read it: shell
// words (quotes, `$(cat FILE)`), then grpcurl's flags, address and verb.
// Lets a test run the command lines a document prints. Pure functions;
// thread-safe.
#ifndef MUONPS_TESTS_HARNESS_GRPCURL_COMMAND_H_
#define MUONPS_TESTS_HARNESS_GRPCURL_COMMAND_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonps {
namespace testing {

struct GrpcurlCommand {
  enum class Verb { kList, kDescribe, kCall };
  // -cacert FILE: the CA that verifies the server ("" for none).
  std::string cacert;
  // -plaintext: no TLS at all.
  bool plaintext = false;
  // Every -H 'name: value', the name lowercased, both trimmed: sent on
  // every call, reflection's included.
  std::vector<std::pair<std::string, std::string>> headers;
  // Every -reflect-header 'name: value': sent on reflection calls only.
  std::vector<std::pair<std::string, std::string>> reflect_headers;
  // -d JSON: the request ("" when absent: an empty message).
  std::string data;
  // HOST:PORT.
  std::string address;
  Verb verb = Verb::kList;
  // list: a service or ""; describe: a symbol or ""; call:
  // "package.Service/Method".
  std::string symbol;
};

// Where a path the line names is on this machine (e.g. a document's
// /tmp/muonps-creds/token -> the test's credential); applied to every file
// that `$(cat FILE)` and -cacert read.
using PathMap = std::function<std::string(const std::string&)>;

// The words a POSIX shell makes of `line`: blanks separate words; '...'
// is literal; "..." keeps blanks; `$(cat FILE)` becomes FILE's first line;
// an unquoted '#' starting a word begins a comment. INVALID_ARGUMENT for
// what this subset does not cover (other $ expansions, pipes, unbalanced
// quotes) and NOT_FOUND for a file `cat` cannot read.
absl::StatusOr<std::vector<std::string>> ShellWords(absl::string_view line,
                                                    const PathMap& path_of);

// `line` ("grpcurl [flags] ADDRESS list|describe [SYMBOL]|SERVICE/METHOD")
// parsed as grpcurl does, for the flags -cacert, -H, -reflect-header, -d and
// -plaintext (also written -flag=value or --flag). INVALID_ARGUMENT naming the
// word for anything else.
absl::StatusOr<GrpcurlCommand> ParseGrpcurlLine(absl::string_view line,
                                                const PathMap& path_of);

}  // namespace testing
}  // namespace muonps

#endif  // MUONPS_TESTS_HARNESS_GRPCURL_COMMAND_H_
