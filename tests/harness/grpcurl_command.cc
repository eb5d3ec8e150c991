#include "tests/harness/grpcurl_command.h"

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace muonps {
namespace testing {
namespace {

// What `$(COMMAND)` prints, for the one command documents use here:
// `cat FILE` (its first line; the shell drops the trailing newline).
absl::StatusOr<std::string> Substitute(absl::string_view command,
                                       const PathMap& path_of) {
  std::vector<std::string> words =
      absl::StrSplit(command, ' ', absl::SkipWhitespace());
  if (words.size() != 2 || words[0] != "cat") {
    return absl::InvalidArgumentError(
        absl::StrCat("$(", command, "): only $(cat FILE) is supported"));
  }
  const std::string path = path_of(words[1]);
  std::ifstream in(path);
  std::string first;
  if (!in || !std::getline(in, first)) {
    return absl::NotFoundError(
        absl::StrCat("$(", command, "): cannot read ", path));
  }
  return first;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ShellWords(absl::string_view line,
                                                    const PathMap& path_of) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote == '\'') {
      if (c == '\'') {
        quote = 0;
      } else {
        word += c;
      }
      continue;
    }
    if (c == '$') {
      if (i + 1 >= line.size() || line[i + 1] != '(') {
        return absl::InvalidArgumentError(
            absl::StrCat("column ", i, ": only $(cat FILE) is supported"));
      }
      const size_t close = line.find(')', i + 2);
      if (close == absl::string_view::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("column ", i, ": unclosed $("));
      }
      absl::StatusOr<std::string> output =
          Substitute(line.substr(i + 2, close - i - 2), path_of);
      if (!output.ok()) return output.status();
      word += *output;
      in_word = true;
      i = close;
      continue;
    }
    if (quote == '"') {
      if (c == '"') {
        quote = 0;
      } else if (c == '\\' || c == '`') {
        return absl::InvalidArgumentError(
            absl::StrCat("column ", i, ": escapes in \"...\" unsupported"));
      } else {
        word += c;
      }
      continue;
    }
    if (c == ' ' || c == '\t') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    if (c == '#' && !in_word) break;
    if (absl::StrContains("|&;<>`\\", c)) {
      return absl::InvalidArgumentError(
          absl::StrCat("column ", i, ": '", std::string(1, c),
                       "' is not a plain command's"));
    }
    in_word = true;
    if (c == '\'' || c == '"') {
      quote = c;
    } else {
      word += c;
    }
  }
  if (quote != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unbalanced ", std::string(1, quote)));
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

absl::StatusOr<GrpcurlCommand> ParseGrpcurlLine(absl::string_view line,
                                                const PathMap& path_of) {
  absl::StatusOr<std::vector<std::string>> words = ShellWords(line, path_of);
  if (!words.ok()) return words.status();
  if (words->empty() || (*words)[0] != "grpcurl") {
    return absl::InvalidArgumentError("not a grpcurl command");
  }
  GrpcurlCommand command;
  size_t i = 1;
  // Go's flag package: -name, --name, -name=value or -name value; flags
  // end at the first word that does not start with '-'.
  for (; i < words->size() && absl::StartsWith((*words)[i], "-"); ++i) {
    absl::string_view flag = (*words)[i];
    flag = absl::StripPrefix(absl::StripPrefix(flag, "-"), "-");
    std::string name(flag);
    std::string value;
    bool has_value = false;
    if (const size_t eq = flag.find('='); eq != absl::string_view::npos) {
      name = std::string(flag.substr(0, eq));
      value = std::string(flag.substr(eq + 1));
      has_value = true;
    }
    if (name == "plaintext") {
      command.plaintext = !has_value || value == "true";
      continue;
    }
    if (name != "cacert" && name != "H" && name != "reflect-header" &&
        name != "d") {
      return absl::InvalidArgumentError(
          absl::StrCat("flag -", name, " is not supported"));
    }
    if (!has_value) {
      if (++i >= words->size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag -", name, " needs a value"));
      }
      value = (*words)[i];
    }
    if (name == "cacert") {
      command.cacert = path_of(value);
    } else if (name == "d") {
      command.data = value;
    } else {
      const size_t colon = value.find(':');
      if (colon == std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("-", name, " \"", value, "\" is not 'name: value'"));
      }
      auto& headers = name == "H" ? command.headers : command.reflect_headers;
      headers.emplace_back(
          absl::AsciiStrToLower(
              absl::StripAsciiWhitespace(value.substr(0, colon))),
          std::string(absl::StripAsciiWhitespace(value.substr(colon + 1))));
    }
  }
  std::vector<std::string> rest(words->begin() + i, words->end());
  if (rest.empty()) return absl::InvalidArgumentError("no address");
  command.address = rest[0];
  if (rest.size() < 2) return absl::InvalidArgumentError("no verb or method");
  if (rest[1] == "list" || rest[1] == "describe") {
    command.verb = rest[1] == "list" ? GrpcurlCommand::Verb::kList
                                     : GrpcurlCommand::Verb::kDescribe;
    if (rest.size() > 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(rest[1], " takes one symbol, not \"", rest[3], "\""));
    }
    if (rest.size() == 3) command.symbol = rest[2];
    return command;
  }
  if (rest.size() != 2 || rest[1].find('/') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", rest[1], "\" is neither list, describe nor SERVICE/METHOD"));
  }
  command.verb = GrpcurlCommand::Verb::kCall;
  command.symbol = rest[1];
  return command;
}

}  // namespace testing
}  // namespace muonps
