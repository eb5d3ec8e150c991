// ExpositionErrors and RenderValid: the metrics tests' check of a
// rendering against the Prometheus text exposition format 0.0.4.
// Tests only (testonly in BUILD).
#ifndef MUONPS_COMMON_METRICS_EXPOSITION_CHECK_H_
#define MUONPS_COMMON_METRICS_EXPOSITION_CHECK_H_

#include <string>

#include "common/metrics.h"

namespace muonps {
namespace metrics_test {

// Checks `text` against the text exposition format 0.0.4: "# HELP name doc"
// and "# TYPE name kind" comments, samples `name{label="value",...} value`
// with the escapes the format allows, one contiguous group per family after
// its TYPE, families sorted, no duplicate series, and cumulative histogram
// buckets ending in le="+Inf" equal to _count. Returns "" when valid, else
// the offending line and why.
std::string ExpositionErrors(const std::string& text);

// Renders and checks the text against the grammar, so every rendering the
// tests look at is also a valid exposition.
std::string RenderValid(const MetricsRegistry& registry);

}  // namespace metrics_test
}  // namespace muonps

#endif  // MUONPS_COMMON_METRICS_EXPOSITION_CHECK_H_
