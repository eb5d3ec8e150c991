#include "bench/ns_gpu/peer_results.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace muonps {
namespace bench {

absl::StatusOr<PeerResults> PeerResults::Parse(absl::string_view text) {
  PeerResults results;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    nlohmann::json json =
        nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
    if (json.is_discarded() || !json.is_object() || !json.contains("what") ||
        !json["what"].is_string()) {
      return InvalidField(absl::StrCat("line ", line_number),
                          "is not a JSON object with a string \"what\"");
    }
    results.lines_.push_back(std::move(json));
  }
  return results;
}

absl::StatusOr<PeerResults> PeerResults::Load(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return FieldError(absl::StatusCode::kNotFound, "torch_results",
                      absl::StrCat("cannot read ", Quoted(path)));
  }
  std::stringstream text;
  text << file.rdbuf();
  absl::StatusOr<PeerResults> results = Parse(text.str());
  if (!results.ok()) return Annotate(results.status(), Quoted(path));
  return results;
}

const nlohmann::json* PeerResults::Find(absl::string_view what, int64_t rows,
                                        int64_t cols, int64_t batch) const {
  auto equals = [](const nlohmann::json& line, const char* key, int64_t value) {
    auto it = line.find(key);
    return it != line.end() && it->is_number_integer() &&
           it->get<int64_t>() == value;
  };
  for (const nlohmann::json& line : lines_) {
    if (line["what"].get<std::string>() != what) continue;
    if (rows > 0 &&
        !(equals(line, "rows", rows) && equals(line, "cols", cols) &&
          equals(line, "batch", batch))) {
      continue;
    }
    return &line;
  }
  return nullptr;
}

std::optional<double> PeerResults::Number(absl::string_view what,
                                          absl::string_view key, int64_t rows,
                                          int64_t cols, int64_t batch) const {
  const nlohmann::json* line = Find(what, rows, cols, batch);
  if (line == nullptr) return std::nullopt;
  auto it = line->find(std::string(key));
  if (it == line->end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

nlohmann::json Ratio(std::optional<double> numerator,
                     std::optional<double> denominator) {
  if (!numerator || !denominator || !(*denominator > 0)) return nullptr;
  return *numerator / *denominator;
}

}  // namespace bench
}  // namespace muonps
