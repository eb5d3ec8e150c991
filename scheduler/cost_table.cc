#include "scheduler/cost_table.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace muonps {
namespace scheduler {
namespace {

using Json = nlohmann::json;

absl::StatusOr<int64_t> PositiveInteger(const Json& line, const char* key) {
  auto it = line.find(key);
  if (it == line.end() || !it->is_number()) {
    return InvalidField(key, "must be a number");
  }
  const double value = it->get<double>();
  if (!(value >= 1 && value <= 1e12) || value != std::floor(value)) {
    return InvalidField(key,
                        absl::StrCat(value, " is not an integer in [1, 1e12]"));
  }
  return static_cast<int64_t>(value);
}

}  // namespace

absl::Status CostTable::Add(int64_t rows, int64_t cols, NsAlgorithm algorithm,
                            int64_t batch, double seconds) {
  if (rows < 1 || cols < 1) {
    return InvalidField("rows", absl::StrCat("shape [", rows, ", ", cols,
                                             "]: dimensions must be >= 1"));
  }
  if (batch < 1) return InvalidField("batch", absl::StrCat(batch, " < 1"));
  if (!(seconds > 0) || !std::isfinite(seconds)) {
    return InvalidField("seconds",
                        absl::StrCat(seconds, " must be positive and finite"));
  }
  const Key key{std::min(rows, cols), std::max(rows, cols),
                static_cast<int>(algorithm)};
  Curve& curve = curves_[key];
  auto it = std::lower_bound(curve.begin(), curve.end(), batch,
                             [](const std::pair<int64_t, double>& p,
                                int64_t b) { return p.first < b; });
  if (it != curve.end() && it->first == batch) {
    return FieldError(absl::StatusCode::kAlreadyExists, "batch",
                      absl::StrCat("shape [", rows, ", ", cols, "] ",
                                   NsAlgorithmName(algorithm), " batch ", batch,
                                   " is measured twice"));
  }
  curve.insert(it, {batch, seconds});
  return absl::OkStatus();
}

absl::StatusOr<CostTable> CostTable::Parse(absl::string_view text) {
  CostTable table;
  int line_number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_number;
    const absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line.front() == '#') continue;
    const std::string where = absl::StrCat("line ", line_number);
    const Json json = Json::parse(line.begin(), line.end(), nullptr, false);
    if (json.is_discarded() || !json.is_object()) {
      return InvalidField(where, "is not a JSON object");
    }
    if (json.contains("device")) {
      if (json.size() != 1 || !json["device"].is_string()) {
        return InvalidField(where,
                            "a device line holds only a \"device\" string");
      }
      table.device_ = json["device"].get<std::string>();
      continue;
    }
    for (auto it = json.begin(); it != json.end(); ++it) {
      const std::string& key = it.key();
      if (key != "rows" && key != "cols" && key != "algorithm" &&
          key != "batch" && key != "seconds") {
        return InvalidField(absl::StrCat(where, ".", key), "is not supported");
      }
    }
    auto annotate = [&where](const absl::Status& s) {
      return Annotate(s, where);
    };
    absl::StatusOr<int64_t> rows = PositiveInteger(json, "rows");
    if (!rows.ok()) return annotate(rows.status());
    absl::StatusOr<int64_t> cols = PositiveInteger(json, "cols");
    if (!cols.ok()) return annotate(cols.status());
    absl::StatusOr<int64_t> batch = PositiveInteger(json, "batch");
    if (!batch.ok()) return annotate(batch.status());
    auto algorithm_it = json.find("algorithm");
    if (algorithm_it == json.end() || !algorithm_it->is_string()) {
      return annotate(InvalidField("algorithm", "must be a string"));
    }
    absl::StatusOr<NsAlgorithm> algorithm =
        ParseNsAlgorithm(algorithm_it->get<std::string>());
    if (!algorithm.ok()) {
      return annotate(InvalidField(
          "algorithm", absl::StrCat(Quoted(algorithm_it->get<std::string>()),
                                    " is not one of ns5, gram")));
    }
    auto seconds_it = json.find("seconds");
    if (seconds_it == json.end() || !seconds_it->is_number()) {
      return annotate(InvalidField("seconds", "must be a number"));
    }
    MUONPS_RETURN_IF_ERROR(annotate(table.Add(*rows, *cols, *algorithm, *batch,
                                              seconds_it->get<double>())));
  }
  return table;
}

const CostTable::Curve* CostTable::Find(int64_t rows, int64_t cols,
                                        NsAlgorithm algorithm) const {
  auto it = curves_.find(Key{std::min(rows, cols), std::max(rows, cols),
                             static_cast<int>(algorithm)});
  return it == curves_.end() ? nullptr : &it->second;
}

std::string CostTable::Serialize() const {
  std::string out;
  if (!device_.empty()) {
    nlohmann::ordered_json device;
    device["device"] = device_;
    absl::StrAppend(&out, device.dump(), "\n");
  }
  for (const auto& [key, curve] : curves_) {
    for (const auto& [batch, seconds] : curve) {
      nlohmann::ordered_json line;
      line["rows"] = std::get<0>(key);
      line["cols"] = std::get<1>(key);
      line["algorithm"] = std::string(
          NsAlgorithmName(static_cast<NsAlgorithm>(std::get<2>(key))));
      line["batch"] = batch;
      line["seconds"] = seconds;
      absl::StrAppend(&out, line.dump(), "\n");
    }
  }
  return out;
}

}  // namespace scheduler
}  // namespace muonps
