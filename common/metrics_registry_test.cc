// MetricsRegistry's counters, gauges and histograms: the exact text they
// render, every rendering checked against the exposition format by
// metrics_exposition_check.h (whose rejection of malformed text is tested
// first), number formats and escapes, a family asked for twice, names and
// label counts refused, and updates from eight threads.
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "common/metrics_exposition_check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace {

using metrics_test::ExpositionErrors;
using metrics_test::RenderValid;
using ::testing::HasSubstr;

TEST(MetricsTest, ValidatorRejectsMalformedExpositions) {
  const std::string ok = "# HELP a_total x\n# TYPE a_total counter\n";
  EXPECT_EQ(ExpositionErrors(ok + "a_total{k=\"v\"} 1\n"), "");
  EXPECT_NE(ExpositionErrors(ok + "a_total{k=\"v\"} 1"), "");
  EXPECT_NE(ExpositionErrors(ok + "a-total 1\n"), "");
  EXPECT_NE(ExpositionErrors(ok + "a_total{1k=\"v\"} 1\n"), "");
  EXPECT_NE(ExpositionErrors(ok + "a_total{k=\"\\x\"} 1\n"), "");
  EXPECT_NE(ExpositionErrors(ok + "a_total{k=\"v\"} inf\n"), "");
  EXPECT_NE(ExpositionErrors(ok + "a_total 1\na_total 2\n"), "");
  EXPECT_NE(ExpositionErrors(ok + "a_total{k=\"v} 1\n"), "");
  EXPECT_NE(ExpositionErrors(ok + "a_total{k=\"v\"}1\n"), "");
  EXPECT_NE(ExpositionErrors(ok + "b_total 1\n"), "");
  EXPECT_NE(ExpositionErrors("# HELP a x\\q\n"), "");
  EXPECT_NE(ExpositionErrors("# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                             "h_bucket{le=\"+Inf\"} 1\n"),
            "");
}

TEST(MetricsTest, RenderTextMatchesExpositionFormatExactly) {
  MetricsRegistry registry;
  Counter* requests = registry.AddCounter(
      "muonps_requests_total", "Requests served.", {"method", "code"});
  Counter* restarts =
      registry.AddCounter("muonps_restarts_total", "Process restarts.");
  registry.AddCounter("muonps_errors_total", "Errors by kind.", {"kind"});
  Gauge* inflight = registry.AddGauge("muonps_inflight_steps",
                                      "Steps in flight per job.", {"job"});
  Histogram* latency = registry.AddHistogram(
      "muonps_step_seconds", "Step latency.", {}, {0.5, 1, 2.5});
  ASSERT_NE(requests, nullptr);
  ASSERT_NE(restarts, nullptr);
  ASSERT_NE(inflight, nullptr);
  ASSERT_NE(latency, nullptr);

  requests->Increment({"POST", "500"}, 0.5);
  requests->Increment({"GET", "200"});
  requests->Increment({"GET", "200"}, 2);
  restarts->Increment();
  inflight->Set(3, {"b"});
  inflight->Add(-1.5, {"b"});
  inflight->Set(7, {"a"});
  inflight->Set(1, {"gone"});
  inflight->Remove({"gone"});
  // 0.5 and 1 sit exactly on bounds and count in those buckets.
  for (double seconds : {0.5, 1.0, 2.0, 3.0}) latency->Observe(seconds);

  EXPECT_EQ(RenderValid(registry),
            R"(# HELP muonps_errors_total Errors by kind.
# TYPE muonps_errors_total counter
# HELP muonps_inflight_steps Steps in flight per job.
# TYPE muonps_inflight_steps gauge
muonps_inflight_steps{job="a"} 7
muonps_inflight_steps{job="b"} 1.5
# HELP muonps_requests_total Requests served.
# TYPE muonps_requests_total counter
muonps_requests_total{method="GET",code="200"} 3
muonps_requests_total{method="POST",code="500"} 0.5
# HELP muonps_restarts_total Process restarts.
# TYPE muonps_restarts_total counter
muonps_restarts_total 1
# HELP muonps_step_seconds Step latency.
# TYPE muonps_step_seconds histogram
muonps_step_seconds_bucket{le="0.5"} 1
muonps_step_seconds_bucket{le="1"} 2
muonps_step_seconds_bucket{le="2.5"} 3
muonps_step_seconds_bucket{le="+Inf"} 4
muonps_step_seconds_sum 6.5
muonps_step_seconds_count 4
)");
  EXPECT_EQ(requests->Value({"GET", "200"}), 3);
  EXPECT_EQ(inflight->Value({"gone"}), 0);
  EXPECT_EQ(latency->Count(), 4u);
}

TEST(MetricsTest, LabeledHistogramRendersOneCumulativeGroupPerLabelSet) {
  MetricsRegistry registry;
  Histogram* bytes = registry.AddHistogram("muonps_push_bytes", "Push sizes.",
                                           {"worker"}, {10, 100});
  bytes->Observe(100, {"w1"});
  bytes->Observe(5, {"w0"});
  bytes->Observe(1000, {"w0"});
  EXPECT_EQ(RenderValid(registry), R"(# HELP muonps_push_bytes Push sizes.
# TYPE muonps_push_bytes histogram
muonps_push_bytes_bucket{worker="w0",le="10"} 1
muonps_push_bytes_bucket{worker="w0",le="100"} 1
muonps_push_bytes_bucket{worker="w0",le="+Inf"} 2
muonps_push_bytes_sum{worker="w0"} 1005
muonps_push_bytes_count{worker="w0"} 2
muonps_push_bytes_bucket{worker="w1",le="10"} 0
muonps_push_bytes_bucket{worker="w1",le="100"} 1
muonps_push_bytes_bucket{worker="w1",le="+Inf"} 1
muonps_push_bytes_sum{worker="w1"} 100
muonps_push_bytes_count{worker="w1"} 1
)");
}

TEST(MetricsTest, UnlabeledFamiliesRenderZeroBeforeFirstUse) {
  MetricsRegistry registry;
  registry.AddCounter("muonps_a_total", "A.");
  registry.AddGauge("muonps_b", "B.");
  registry.AddHistogram("muonps_c_seconds", "C.", {}, {1});
  EXPECT_EQ(RenderValid(registry),
            "# HELP muonps_a_total A.\n# TYPE muonps_a_total counter\n"
            "muonps_a_total 0\n"
            "# HELP muonps_b B.\n# TYPE muonps_b gauge\nmuonps_b 0\n"
            "# HELP muonps_c_seconds C.\n# TYPE muonps_c_seconds histogram\n"
            "muonps_c_seconds_bucket{le=\"1\"} 0\n"
            "muonps_c_seconds_bucket{le=\"+Inf\"} 0\n"
            "muonps_c_seconds_sum 0\nmuonps_c_seconds_count 0\n");
}

TEST(MetricsTest, EscapesBackslashQuoteNewlineInLabelValuesAndHelp) {
  MetricsRegistry registry;
  Counter* counter = registry.AddCounter(
      "muonps_escape_total", "Back\\slash, \"quotes\" and\nnewline.", {"path"});
  counter->Increment({"a\\b\"c\nd"});
  EXPECT_EQ(RenderValid(registry),
            R"(# HELP muonps_escape_total Back\\slash, "quotes" and\nnewline.
# TYPE muonps_escape_total counter
muonps_escape_total{path="a\\b\"c\nd"} 1
)");
}

TEST(MetricsTest, NumbersRoundTripAndIntegersPrintWithoutExponent) {
  MetricsRegistry registry;
  Gauge* gauge = registry.AddGauge("muonps_value", "Values.", {"case"});
  const std::vector<std::pair<double, std::string>> cases = {
      {0.1, "0.1"},
      {1e6, "1000000"},
      {-2.5, "-2.5"},
      {9007199254740992.0, "9007199254740992"},
      {1.0 / 3, "0.3333333333333333"},
      {1e-7, "1e-07"},
      {1e20, "1e+20"},
      {std::numeric_limits<double>::infinity(), "+Inf"},
      {-std::numeric_limits<double>::infinity(), "-Inf"},
      {std::nan(""), "NaN"}};
  for (size_t i = 0; i < cases.size(); ++i) {
    gauge->Set(cases[i].first, {absl::StrCat("c", i)});
  }
  const std::string text = RenderValid(registry);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("muonps_value{case=\"c", i, "\"} ",
                                             cases[i].second, "\n")));
    const double parsed = std::strtod(cases[i].second.c_str(), nullptr);
    if (!std::isnan(cases[i].first)) {
      EXPECT_EQ(parsed, cases[i].first);
    }
  }
}

TEST(MetricsTest, SameNameTwiceReturnsSameFamilyAndMismatchReturnsNull) {
  MetricsRegistry registry;
  Counter* counter = registry.AddCounter("muonps_x_total", "X.", {"job"});
  ASSERT_NE(counter, nullptr);
  EXPECT_EQ(registry.AddCounter("muonps_x_total", "Other help.", {"job"}),
            counter);
  EXPECT_EQ(registry.AddCounter("muonps_x_total", "X.", {"worker"}), nullptr);
  EXPECT_EQ(registry.AddCounter("muonps_x_total", "X."), nullptr);
  EXPECT_EQ(registry.AddGauge("muonps_x_total", "X.", {"job"}), nullptr);
  EXPECT_EQ(registry.AddHistogram("muonps_x_total", "X.", {"job"}), nullptr);

  Histogram* histogram = registry.AddHistogram("muonps_h_seconds", "H.");
  ASSERT_NE(histogram, nullptr);
  // Only kind and labels decide a match; the first bounds stay.
  EXPECT_EQ(registry.AddHistogram("muonps_h_seconds", "H.", {}, {1}),
            histogram);
  EXPECT_EQ(registry.AddCounter("muonps_h_seconds", "H."), nullptr);
  Gauge* gauge = registry.AddGauge("muonps_g", "G.");
  EXPECT_EQ(registry.AddGauge("muonps_g", "G."), gauge);
  EXPECT_EQ(registry.AddHistogram("muonps_g", "G."), nullptr);
  RenderValid(registry);
}

TEST(MetricsTest, InvalidMetricOrLabelNamesReturnNull) {
  MetricsRegistry registry;
  EXPECT_EQ(registry.AddCounter("muonps-bad_total", "."), nullptr);
  EXPECT_EQ(registry.AddCounter("0muonps_total", "."), nullptr);
  EXPECT_EQ(registry.AddGauge("", "."), nullptr);
  EXPECT_EQ(registry.AddGauge("muonps_g", ".", {"__reserved"}), nullptr);
  EXPECT_EQ(registry.AddGauge("muonps_g", ".", {"job", "job"}), nullptr);
  EXPECT_EQ(registry.AddGauge("muonps_g", ".", {"bad-label"}), nullptr);
  EXPECT_EQ(registry.AddHistogram("muonps_h", ".", {"le"}), nullptr);
  EXPECT_NE(registry.AddGauge("muonps:recorded_g", ".", {"_ok1"}), nullptr);
  RenderValid(registry);
}

TEST(MetricsTest, LabelCountMismatchIsIgnored) {
  MetricsRegistry registry;
  Counter* counter = registry.AddCounter("muonps_c_total", "C.", {"job"});
  Counter* plain = registry.AddCounter("muonps_p_total", "P.");
  Gauge* gauge = registry.AddGauge("muonps_g", "G.", {"job"});
  Histogram* histogram =
      registry.AddHistogram("muonps_h_seconds", "H.", {"job"}, {1});
  counter->Increment();
  counter->Increment({"a", "b"});
  plain->Increment({"x"});
  gauge->Set(5);
  gauge->Add(1, {"a", "b"});
  gauge->Remove({});
  histogram->Observe(0.5);
  histogram->Observe(0.5, {"a", "b"});
  EXPECT_EQ(counter->Value({"a", "b"}), 0);
  EXPECT_EQ(plain->Value(), 0);
  EXPECT_EQ(gauge->Value(), 0);
  EXPECT_EQ(histogram->Count(), 0u);
  EXPECT_EQ(RenderValid(registry),
            "# HELP muonps_c_total C.\n# TYPE muonps_c_total counter\n"
            "# HELP muonps_g G.\n# TYPE muonps_g gauge\n"
            "# HELP muonps_h_seconds H.\n# TYPE muonps_h_seconds histogram\n"
            "# HELP muonps_p_total P.\n# TYPE muonps_p_total counter\n"
            "muonps_p_total 0\n");
}

TEST(MetricsTest, NegativeOrNanCounterIncrementIsIgnored) {
  MetricsRegistry registry;
  Counter* counter = registry.AddCounter("muonps_c_total", "C.");
  counter->Increment({}, 2);
  counter->Increment({}, -1);
  counter->Increment({}, std::nan(""));
  EXPECT_EQ(counter->Value(), 2);
  EXPECT_THAT(RenderValid(registry), HasSubstr("\nmuonps_c_total 2\n"));
}

TEST(MetricsTest, ConcurrentIncrementsFromEightThreadsSumExactly) {
  MetricsRegistry registry;
  Counter* counter = registry.AddCounter("muonps_c_total", "C.", {"job"});
  Gauge* gauge = registry.AddGauge("muonps_g", "G.");
  Histogram* histogram =
      registry.AddHistogram("muonps_h_seconds", "H.", {}, {0.5});
  constexpr int kThreads = 8, kPerThread = 10000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        counter->Increment({"j"});
        gauge->Add(1);
        histogram->Observe(t % 2 == 0 ? 0.25 : 1.0);
        // Renders race with the writers too.
        if (i % 2500 == 0) {
          EXPECT_EQ(ExpositionErrors(registry.RenderText()), "");
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(counter->Value({"j"}), kThreads * kPerThread);
  EXPECT_EQ(gauge->Value(), kThreads * kPerThread);
  EXPECT_EQ(histogram->Count(), uint64_t{kThreads * kPerThread});
  const std::string text = RenderValid(registry);
  EXPECT_THAT(text, HasSubstr("muonps_c_total{job=\"j\"} 80000\n"));
  EXPECT_THAT(text, HasSubstr("muonps_h_seconds_bucket{le=\"0.5\"} 40000\n"));
  EXPECT_THAT(text, HasSubstr("muonps_h_seconds_sum 50000\n"));
}

}  // namespace
}  // namespace muonps
