#include "common/metrics.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace {

using ::testing::HasSubstr;

bool IsNameChar(char c, bool first, bool colon) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' ||
         (colon && c == ':') || (!first && c >= '0' && c <= '9');
}

// [a-zA-Z_:][a-zA-Z0-9_:]* (metric names), or without ':' (label names).
bool IsName(const std::string& name, bool colon) {
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i], i == 0, colon)) return false;
  }
  return !name.empty();
}

// A Go float literal in decimal, or +Inf, -Inf, NaN as the format spells them.
bool IsValue(const std::string& value) {
  if (value == "+Inf" || value == "-Inf" || value == "NaN") return true;
  size_t i = (!value.empty() && (value[0] == '+' || value[0] == '-')) ? 1 : 0;
  size_t digits = 0;
  auto skip_digits = [&] {
    size_t n = 0;
    for (;
         i < value.size() && std::isdigit(static_cast<unsigned char>(value[i]));
         ++i)
      ++n;
    return n;
  };
  digits += skip_digits();
  if (i < value.size() && value[i] == '.') ++i, digits += skip_digits();
  if (digits == 0) return false;
  if (i < value.size() && (value[i] == 'e' || value[i] == 'E')) {
    ++i;
    if (i < value.size() && (value[i] == '+' || value[i] == '-')) ++i;
    if (skip_digits() == 0) return false;
  }
  return i == value.size();
}

// Checks `text` against the text exposition format 0.0.4: "# HELP name doc"
// and "# TYPE name kind" comments, samples `name{label="value",...} value`
// with the escapes the format allows, one contiguous group per family after
// its TYPE, families sorted, no duplicate series, and cumulative histogram
// buckets ending in le="+Inf" equal to _count. Returns "" when valid, else
// the offending line and why.
std::string ExpositionErrors(const std::string& text) {
  if (!text.empty() && text.back() != '\n') return "text must end in \\n";
  std::map<std::string, std::string> types;  // family -> kind
  std::set<std::string> helps, series;
  std::string family;  // the family whose TYPE came last
  std::map<std::string, double> bucket_so_far, le_so_far, inf_bucket;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const std::string where = absl::StrCat("line \"", line, "\": ");
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      const std::string rest = line.substr(7);
      const size_t space = rest.find(' ');
      if (space == std::string::npos) return where + "no text after name";
      const std::string name = rest.substr(0, space);
      const std::string tail = rest.substr(space + 1);
      if (!IsName(name, true)) return where + "bad metric name";
      if (line[2] == 'H') {
        if (!helps.insert(name).second) return where + "second HELP";
        for (size_t i = 0; i < tail.size(); ++i) {
          if (tail[i] != '\\') continue;
          if (++i == tail.size() || (tail[i] != '\\' && tail[i] != 'n')) {
            return where + "bad escape in help";
          }
        }
        continue;
      }
      static const std::set<std::string> kKinds = {
          "counter", "gauge", "histogram", "summary", "untyped"};
      if (kKinds.count(tail) == 0) return where + "unknown type";
      if (types.count(name) > 0) return where + "second TYPE";
      if (!family.empty() && name < family) return where + "not sorted";
      types[name] = tail;
      family = name;
      continue;
    }
    if (!line.empty() && line[0] == '#') continue;  // plain comment
    // name
    size_t i = 0;
    while (i < line.size() && IsNameChar(line[i], i == 0, true)) ++i;
    const std::string name = line.substr(0, i);
    if (name.empty()) return where + "no metric name";
    // {label="value",...}: escapes \\ \" \n only, trailing comma allowed.
    std::string key, le;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const size_t eq = line.find("=\"", i);
        if (eq == std::string::npos) return where + "bad label block";
        const std::string label = line.substr(i, eq - i);
        if (!IsName(label, false)) return where + "bad label name";
        std::string value;
        for (i = eq + 2; i < line.size() && line[i] != '"'; ++i) {
          if (line[i] != '\\') {
            value += line[i];
          } else if (++i < line.size() && line[i] == 'n') {
            value += '\n';
          } else if (i < line.size() && (line[i] == '\\' || line[i] == '"')) {
            value += line[i];
          } else {
            return where + "bad escape in label value";
          }
        }
        if (++i >= line.size()) return where + "unterminated label value";
        if (label == "le") {
          le = value;
        } else {
          absl::StrAppend(&key, label, "=", value, ";");
        }
        if (line[i] == ',') {
          ++i;
        } else if (line[i] != '}') {
          return where + "expected , or }";
        }
      }
      if (i++ >= line.size()) return where + "unterminated label block";
    }
    const std::string labels = line.substr(name.size(), i - name.size());
    // value [timestamp]
    if (i >= line.size() || line[i++] != ' ') return where + "no value";
    std::string value = line.substr(i);
    const size_t space = value.find(' ');
    if (space != std::string::npos) {
      const std::string stamp = value.substr(space + 1);
      if (stamp.empty() ||
          stamp.find_first_not_of("-0123456789") != std::string::npos) {
        return where + "bad timestamp";
      }
      value.resize(space);
    }
    if (!IsValue(value)) return where + "bad value";
    if (!series.insert(name + labels).second) return where + "duplicate";
    const std::string kind = types.count(family) > 0 ? types[family] : "";
    if (kind == "histogram") {
      const std::string id = family + "|" + key;
      const double number = std::strtod(value.c_str(), nullptr);
      if (name == family + "_bucket") {
        if (!IsValue(le)) return where + "bucket without a valid le";
        const double bound = std::strtod(le.c_str(), nullptr);
        if (inf_bucket.count(id) > 0) return where + "bucket after +Inf";
        if (le_so_far.count(id) > 0 && bound <= le_so_far[id]) {
          return where + "le not increasing";
        }
        if (bucket_so_far.count(id) > 0 && number < bucket_so_far[id]) {
          return where + "buckets not cumulative";
        }
        le_so_far[id] = bound;
        bucket_so_far[id] = number;
        if (le == "+Inf") inf_bucket[id] = number;
      } else if (name == family + "_count") {
        if (inf_bucket.count(id) == 0 || inf_bucket[id] != number) {
          return where + "_count differs from le=\"+Inf\" bucket";
        }
      } else if (name != family + "_sum") {
        return where + "sample outside its family's group";
      }
    } else if (family.empty() || name != family) {
      return where + "sample outside its family's group";
    }
  }
  return "";
}

// Renders and checks the text against the grammar, so every rendering the
// tests look at is also a valid exposition.
std::string RenderValid(const MetricsRegistry& registry) {
  std::string text = registry.RenderText();
  EXPECT_EQ(ExpositionErrors(text), "") << text;
  return text;
}

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

TEST(MetricsServerTest, ServesMetricsHealthzAnd404OnLoopback) {
  MetricsRegistry registry;
  registry.AddCounter("muonps_scrapes_total", "Scrapes.", {"job"})
      ->Increment({"j\"1"}, 3);
  registry.AddHistogram("muonps_step_seconds", "Steps.")->Observe(0.003);
  auto server = MetricsServer::Start(&registry, "127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);

  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_connection_timeout(5);
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->get_header_value("Content-Type"),
            "text/plain; version=0.0.4");
  EXPECT_EQ(metrics->body, RenderValid(registry));
  EXPECT_EQ(ExpositionErrors(metrics->body), "");

  httplib::Result health = client.Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok");

  httplib::Result missing = client.Get("/nope");
  ASSERT_TRUE(missing) << httplib::to_string(missing.error());
  EXPECT_EQ(missing->status, 404);
}

TEST(MetricsServerTest, DestroyingServerClosesPort) {
  MetricsRegistry registry;
  auto server = MetricsServer::Start(&registry, "127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  ASSERT_TRUE(client.Get("/healthz"));
  server->reset();
  httplib::Result after = client.Get("/healthz");
  EXPECT_FALSE(after);
  EXPECT_EQ(after.error(), httplib::Error::Connection);
}

TEST(MetricsServerTest, BusyPortIsUnavailableNamingHostAndPort) {
  // A plain listening socket without SO_REUSEPORT keeps the port busy.
  const int busy = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(busy, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(busy, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(listen(busy, 1), 0);
  ASSERT_EQ(getsockname(busy, reinterpret_cast<sockaddr*>(&address), &length),
            0);
  const int port = ntohs(address.sin_port);

  MetricsRegistry registry;
  auto server = MetricsServer::Start(&registry, "127.0.0.1", port);
  close(busy);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(server.status().message()),
              HasSubstr(absl::StrCat("127.0.0.1:", port)));
}

TEST(MetricsServerTest, PortOutOfRangeIsInvalidArgument) {
  MetricsRegistry registry;
  auto server = MetricsServer::Start(&registry, "127.0.0.1", 70000);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace muonps
