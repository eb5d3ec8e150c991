#include "bench/scale_sim/measured_steps.h"

#include <fstream>
#include <sstream>

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

}  // namespace

absl::StatusOr<std::vector<MeasuredStep>> ParseMeasuredSteps(
    absl::string_view text) {
  std::vector<MeasuredStep> out;
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
    if (!j.contains("what") || !j["what"].is_string()) continue;
    const std::string what = j["what"].get<std::string>();
    if (!absl::StartsWith(what, kPrefix)) continue;
    MeasuredStep step;
    step.line = number;
    step.gpus = GpusOf(what);
    if (step.gpus == 0 && absl::EndsWith(what, kSuffix)) {
      return InvalidField(field, absl::StrCat("what ", Quoted(what),
                                              ": the GPU count must be >= 1"));
    }
    if (step.gpus == 0) continue;
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
  }
  return out;
}

absl::StatusOr<std::vector<MeasuredStep>> LoadMeasuredSteps(
    const std::string& path) {
  std::ifstream file(path);
  if (!file) {
    return InvalidField("--measured",
                        absl::StrCat("cannot read ", Quoted(path)));
  }
  std::stringstream text;
  text << file.rdbuf();
  return ParseMeasuredSteps(text.str());
}

}  // namespace bench
}  // namespace muonps
