#include "bench/scale_sim/measured_steps.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/scale_sim/scale_sim.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace muonps {
namespace bench {
namespace {

constexpr absl::string_view kPrefix = "muonps_step_";
constexpr absl::string_view kSuffix = "gpu";

// N of "muonps_step_<N>gpu", or 0 for any other name.
int GpusOf(absl::string_view what) {
  if (!absl::ConsumePrefix(&what, kPrefix) ||
      !absl::ConsumeSuffix(&what, kSuffix)) {
    return 0;
  }
  int gpus = 0;
  if (what.empty() || !absl::SimpleAtoi(what, &gpus)) return 0;
  return gpus;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    return InvalidField("--measured",
                        absl::StrCat("cannot read ", Quoted(path)));
  }
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

absl::StatusOr<MeasuredTimeline> ParseTimeline(const nlohmann::json& j,
                                               const std::string& field) {
  MeasuredTimeline t;
  if (!j.contains("gpus") || !j["gpus"].is_number_integer() ||
      j["gpus"].get<int>() < 1) {
    return InvalidField(field, "gpus must be an integer >= 1");
  }
  t.gpus = j["gpus"].get<int>();
  if (!j.contains("rank") || !j["rank"].is_number_integer() ||
      j["rank"].get<int>() < 0) {
    return InvalidField(field, "rank must be an integer >= 0");
  }
  t.rank = j["rank"].get<int>();
  if (j.contains("workers")) {
    if (!j["workers"].is_number_integer() || j["workers"].get<int>() < 1) {
      return InvalidField(field, "workers must be an integer >= 1");
    }
    t.workers = j["workers"].get<int>();
  }
  if (j.contains("layout")) {
    if (!j["layout"].is_string()) {
      return InvalidField(field, "layout must be a string");
    }
    MUONPS_ASSIGN_OR_RETURN(t.layout,
                            ParseLayout(j["layout"].get<std::string>(),
                                        absl::StrCat(field, " layout")));
  }
  if (!j.contains("host_ms") || !j["host_ms"].is_object()) {
    return InvalidField(field, "host_ms must be an object");
  }
  for (const auto& [name, value] :
       {std::pair<const char*, double*>{"agreed", &t.agreed_ms},
        {"staged", &t.staged_ms},
        {"committed", &t.committed_ms}}) {
    const nlohmann::json& h = j["host_ms"];
    if (!h.contains(name) || !h[name].is_number()) {
      return InvalidField(field,
                          absl::StrCat("host_ms.", name, " must be a number"));
    }
    *value = h[name].get<double>();
  }
  if (!j.contains("marks") || !j["marks"].is_array()) {
    return InvalidField(field, "marks must be an array");
  }
  for (const nlohmann::json& m : j["marks"]) {
    if (!m.is_array() || m.size() != 3 || !m[0].is_string() ||
        !m[1].is_number_integer() || !m[2].is_number()) {
      return InvalidField(field, "each mark must be [what, index, ms]");
    }
    const std::string what = m[0].get<std::string>();
    const double ms = m[2].get<double>();
    if (what == "to_owners") {
      t.gradients_landed_ms = std::max(t.gradients_landed_ms, ms);
    } else if (what == "compute") {
      t.compute_end_ms = std::max(t.compute_end_ms, ms);
      t.stacks.push_back(m[1].get<int>());
    } else if (what == "from_owners") {
      t.updates_landed_ms = std::max(t.updates_landed_ms, ms);
    }
  }
  return t;
}

// Calls `each(number, field, line)` for every JSON-object line of `text`
// (blank and "#" lines skipped); `field` names the line in errors.
// INVALID_ARGUMENT naming the line for one that is not a JSON object, or
// the first error of `each`.
template <typename Each>
absl::Status ForEachJsonLine(absl::string_view text, const Each& each) {
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    const std::string field = absl::StrCat("--measured line ", number);
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return InvalidField(field, "not a JSON object");
    }
    MUONPS_RETURN_IF_ERROR(each(number, field, j));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<MeasuredStep>> ParseMeasuredSteps(
    absl::string_view text) {
  std::vector<MeasuredStep> out;
  MUONPS_RETURN_IF_ERROR(ForEachJsonLine(
      text,
      [&](int number, const std::string& field,
          const nlohmann::json& j) -> absl::Status {
        if (!j.contains("what") || !j["what"].is_string())
          return absl::OkStatus();
        const std::string what = j["what"].get<std::string>();
        if (!absl::StartsWith(what, kPrefix)) return absl::OkStatus();
        MeasuredStep step;
        step.line = number;
        step.gpus = GpusOf(what);
        if (step.gpus == 0 && absl::EndsWith(what, kSuffix)) {
          return InvalidField(field,
                              absl::StrCat("what ", Quoted(what),
                                           ": the GPU count must be >= 1"));
        }
        if (step.gpus == 0) return absl::OkStatus();
        if (!j.contains("ms") || !j["ms"].is_number() ||
            !(j["ms"].get<double>() > 0)) {
          return InvalidField(field, "ms must be a number > 0");
        }
        step.ms = j["ms"].get<double>();
        if (j.contains("layout")) {
          if (!j["layout"].is_string()) {
            return InvalidField(field, "layout must be a string");
          }
          MUONPS_ASSIGN_OR_RETURN(step.layout,
                                  ParseLayout(j["layout"].get<std::string>(),
                                              absl::StrCat(field, " layout")));
        }
        if (j.contains("predicted_ms") && j["predicted_ms"].is_number()) {
          step.predicted_ms = j["predicted_ms"].get<double>();
        }
        out.push_back(step);
        return absl::OkStatus();
      }));
  return out;
}

absl::StatusOr<std::vector<MeasuredStep>> LoadMeasuredSteps(
    const std::string& path) {
  MUONPS_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  return ParseMeasuredSteps(text);
}

absl::StatusOr<std::vector<MeasuredTimeline>> ParseMeasuredTimelines(
    absl::string_view text) {
  std::vector<MeasuredTimeline> out;
  MUONPS_RETURN_IF_ERROR(ForEachJsonLine(
      text,
      [&](int number, const std::string& field,
          const nlohmann::json& j) -> absl::Status {
        if (!j.contains("what") || !j["what"].is_string() ||
            j["what"].get<std::string>() != "muonps_step_timeline") {
          return absl::OkStatus();
        }
        MUONPS_ASSIGN_OR_RETURN(MeasuredTimeline t, ParseTimeline(j, field));
        t.line = number;
        out.push_back(std::move(t));
        return absl::OkStatus();
      }));
  return out;
}

absl::StatusOr<std::vector<MeasuredTimeline>> LoadMeasuredTimelines(
    const std::string& path) {
  MUONPS_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  return ParseMeasuredTimelines(text);
}

}  // namespace bench
}  // namespace muonps
