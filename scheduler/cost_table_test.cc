#include "scheduler/cost_table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace scheduler {
namespace {

using ::testing::HasSubstr;

// The header's format: comments (also indented), blank lines, a device
// line, several batches of one shape in both orientations and out of order,
// and both algorithms.
constexpr char kExample[] =
    "# Measured on one H200 with torch.optim.Muon's 5 steps.\n"
    "{\"device\": \"NVIDIA H200\"}\n"
    "\n"
    "{\"rows\": 4096, \"cols\": 14336, \"algorithm\": \"gram\", \"batch\": 8, "
    "\"seconds\": 0.0123}\n"
    "{\"rows\": 4096, \"cols\": 14336, \"algorithm\": \"gram\", \"batch\": 1, "
    "\"seconds\": 0.002}\n"
    "   # an indented comment\n"
    "   \t \n"
    "{\"rows\": 14336, \"cols\": 4096, \"algorithm\": \"gram\", \"batch\": 4, "
    "\"seconds\": 0.007}\n"
    "{\"seconds\": 0.009, \"batch\": 2, \"algorithm\": \"ns5\", \"cols\": "
    "14336, \"rows\": 4096}\n"
    "{\"rows\": 1024, \"cols\": 1024, \"algorithm\": \"ns5\", \"batch\": 1, "
    "\"seconds\": 0.0001}\n";

TEST(CostTableParseTest, DocumentedExampleGivesSortedCurvesAndDevice) {
  absl::StatusOr<CostTable> table = CostTable::Parse(kExample);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->device(), "NVIDIA H200");
  EXPECT_FALSE(table->empty());

  const CostTable::Curve* gram = table->Find(4096, 14336, NsAlgorithm::kGram);
  ASSERT_NE(gram, nullptr);
  EXPECT_EQ(*gram, (CostTable::Curve{{1, 0.002}, {4, 0.007}, {8, 0.0123}}));

  const CostTable::Curve* ns5 = table->Find(4096, 14336, NsAlgorithm::kNs5);
  ASSERT_NE(ns5, nullptr);
  EXPECT_EQ(*ns5, (CostTable::Curve{{2, 0.009}}));

  const CostTable::Curve* square = table->Find(1024, 1024, NsAlgorithm::kNs5);
  ASSERT_NE(square, nullptr);
  EXPECT_EQ(*square, (CostTable::Curve{{1, 0.0001}}));

  EXPECT_EQ(table->Find(1024, 1024, NsAlgorithm::kGram), nullptr);
  EXPECT_EQ(table->Find(4096, 4096, NsAlgorithm::kNs5), nullptr);
  EXPECT_EQ(table->Find(1024, 14336, NsAlgorithm::kGram), nullptr);
}

TEST(CostTableParseTest, LookupIgnoresOrientation) {
  absl::StatusOr<CostTable> table = CostTable::Parse(kExample);
  ASSERT_TRUE(table.ok()) << table.status();
  for (const NsAlgorithm algorithm : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
    const CostTable::Curve* wide = table->Find(4096, 14336, algorithm);
    const CostTable::Curve* tall = table->Find(14336, 4096, algorithm);
    ASSERT_NE(wide, nullptr);
    EXPECT_EQ(wide, tall) << NsAlgorithmName(algorithm);
  }
}

TEST(CostTableParseTest, EmptyTextGivesAnEmptyTable) {
  absl::StatusOr<CostTable> table = CostTable::Parse("# nothing\n\n");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_TRUE(table->empty());
  EXPECT_EQ(table->device(), "");
  EXPECT_EQ(table->Serialize(), "");
}

TEST(CostTableSerializeTest, ParseOfSerializeRoundTripsExactly) {
  absl::StatusOr<CostTable> parsed = CostTable::Parse(kExample);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  CostTable original = *parsed;
  // Values with no short decimal form must survive the text exactly.
  ASSERT_TRUE(original.Add(777, 333, NsAlgorithm::kGram, 3, 1.0 / 3.0).ok());
  ASSERT_TRUE(
      original.Add(777, 333, NsAlgorithm::kGram, 5, std::nextafter(0.1, 1.0))
          .ok());
  ASSERT_TRUE(
      original.Add(2, 3, NsAlgorithm::kNs5, 1000000000000, 5e-300).ok());

  const std::string text = original.Serialize();
  absl::StatusOr<CostTable> reparsed = CostTable::Parse(text);
  ASSERT_TRUE(reparsed.ok()) << reparsed.status() << "\n" << text;
  EXPECT_EQ(reparsed->Serialize(), text);
  EXPECT_EQ(reparsed->device(), original.device());

  const struct {
    int64_t rows, cols;
    NsAlgorithm algorithm;
  } shapes[] = {{4096, 14336, NsAlgorithm::kGram},
                {4096, 14336, NsAlgorithm::kNs5},
                {1024, 1024, NsAlgorithm::kNs5},
                {333, 777, NsAlgorithm::kGram},
                {3, 2, NsAlgorithm::kNs5}};
  for (const auto& s : shapes) {
    const CostTable::Curve* want = original.Find(s.rows, s.cols, s.algorithm);
    const CostTable::Curve* got = reparsed->Find(s.rows, s.cols, s.algorithm);
    ASSERT_NE(want, nullptr);
    ASSERT_NE(got, nullptr);
    EXPECT_EQ(*got, *want) << s.rows << "x" << s.cols;
  }
  // One line per measurement plus the device line.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1 + 5 + 2 + 1);
}

struct MalformedLine {
  const char* what;
  std::string line;
  std::vector<std::string> message_parts;  // besides "line 3"
};

TEST(CostTableParseTest, EachMalformedLineIsInvalidArgumentNamingLineAndField) {
  const std::vector<MalformedLine> cases = {
      {"not JSON", "rows=4 cols=4", {"JSON"}},
      {"truncated JSON", "{\"rows\": 4,", {"JSON"}},
      {"array instead of object", "[4, 4, \"ns5\", 1, 0.1]", {"JSON object"}},
      {"missing rows",
       R"({"cols": 4, "algorithm": "ns5", "batch": 1, "seconds": 0.1})",
       {"rows"}},
      {"rows 0",
       R"({"rows": 0, "cols": 4, "algorithm": "ns5", "batch": 1, "seconds": 0.1})",
       {"rows"}},
      {"rows 2.5",
       R"({"rows": 2.5, "cols": 4, "algorithm": "ns5", "batch": 1, "seconds": 0.1})",
       {"rows", "2.5"}},
      {"rows a string",
       R"({"rows": "4", "cols": 4, "algorithm": "ns5", "batch": 1, "seconds": 0.1})",
       {"rows"}},
      {"cols missing",
       R"({"rows": 4, "algorithm": "ns5", "batch": 1, "seconds": 0.1})",
       {"cols"}},
      {"batch -1",
       R"({"rows": 4, "cols": 4, "algorithm": "ns5", "batch": -1, "seconds": 0.1})",
       {"batch", "-1"}},
      {"seconds 0",
       R"({"rows": 4, "cols": 4, "algorithm": "ns5", "batch": 1, "seconds": 0})",
       {"seconds"}},
      {"seconds negative",
       R"({"rows": 4, "cols": 4, "algorithm": "ns5", "batch": 1, "seconds": -0.5})",
       {"seconds"}},
      {"seconds a string",
       R"({"rows": 4, "cols": 4, "algorithm": "ns5", "batch": 1, "seconds": "x"})",
       {"seconds"}},
      {"seconds missing",
       R"({"rows": 4, "cols": 4, "algorithm": "ns5", "batch": 1})",
       {"seconds"}},
      {"algorithm svd",
       R"({"rows": 4, "cols": 4, "algorithm": "svd", "batch": 1, "seconds": 0.1})",
       {"algorithm", "svd"}},
      {"algorithm missing",
       R"({"rows": 4, "cols": 4, "batch": 1, "seconds": 0.1})",
       {"algorithm"}},
      {"unknown key",
       R"({"rows": 4, "cols": 4, "algorithm": "ns5", "batch": 1, "seconds": 0.1, "steps": 5})",
       {"steps", "is not supported"}},
      {"device line with extra key",
       R"({"device": "NVIDIA H200", "rows": 4})",
       {"device"}},
      {"device not a string", R"({"device": 7})", {"device"}},
  };
  const std::string good =
      R"({"rows": 4, "cols": 8, "algorithm": "ns5", "batch": 1, "seconds": 0.1})";
  for (const MalformedLine& c : cases) {
    SCOPED_TRACE(c.what);
    // Line 1 a comment, line 2 valid, line 3 the bad one, line 4 valid.
    const std::string text =
        "# header\n" + good + "\n" + c.line + "\n" + good + "\n";
    absl::StatusOr<CostTable> table = CostTable::Parse(text);
    ASSERT_FALSE(table.ok());
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument)
        << table.status();
    const std::string message(table.status().message());
    EXPECT_THAT(message, HasSubstr("line 3")) << message;
    EXPECT_THAT(message, ::testing::Not(HasSubstr("line 2"))) << message;
    for (const std::string& part : c.message_parts) {
      EXPECT_THAT(message, HasSubstr(part));
    }
  }
}

TEST(CostTableParseTest, DuplicateMeasurementIsAlreadyExistsNamingLine) {
  // The same shape (other orientation), algorithm and batch on line 4.
  const std::string text =
      "{\"device\": \"d\"}\n"
      R"({"rows": 64, "cols": 256, "algorithm": "gram", "batch": 2, "seconds": 0.1})"
      "\n"
      R"({"rows": 64, "cols": 256, "algorithm": "ns5", "batch": 2, "seconds": 0.2})"
      "\n"
      R"({"rows": 256, "cols": 64, "algorithm": "gram", "batch": 2, "seconds": 0.3})"
      "\n";
  absl::StatusOr<CostTable> table = CostTable::Parse(text);
  ASSERT_FALSE(table.ok());
  EXPECT_EQ(table.status().code(), absl::StatusCode::kAlreadyExists)
      << table.status();
  EXPECT_THAT(std::string(table.status().message()), HasSubstr("line 4"));
  EXPECT_THAT(std::string(table.status().message()), HasSubstr("batch"));
}

TEST(CostTableAddTest, RejectsWhatParseRejectsAndLeavesTheTableUnchanged) {
  CostTable table;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const struct {
    int64_t rows, cols, batch;
    double seconds;
    const char* field;
  } bad[] = {
      {0, 4, 1, 0.1, "rows"},     {4, 0, 1, 0.1, "rows"},
      {-4, 4, 1, 0.1, "rows"},    {4, 4, 0, 0.1, "batch"},
      {4, 4, -1, 0.1, "batch"},   {4, 4, 1, 0.0, "seconds"},
      {4, 4, 1, -0.5, "seconds"}, {4, 4, 1, nan, "seconds"},
      {4, 4, 1, inf, "seconds"},
  };
  for (const auto& b : bad) {
    SCOPED_TRACE(::testing::Message() << b.rows << "x" << b.cols << " batch "
                                      << b.batch << " seconds " << b.seconds);
    const absl::Status status =
        table.Add(b.rows, b.cols, NsAlgorithm::kNs5, b.batch, b.seconds);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(b.field));
  }
  EXPECT_TRUE(table.empty());
  EXPECT_EQ(table.Find(4, 4, NsAlgorithm::kNs5), nullptr);

  ASSERT_TRUE(table.Add(4, 16, NsAlgorithm::kNs5, 2, 0.5).ok());
  const absl::Status duplicate = table.Add(16, 4, NsAlgorithm::kNs5, 2, 0.7);
  EXPECT_EQ(duplicate.code(), absl::StatusCode::kAlreadyExists) << duplicate;
  EXPECT_THAT(std::string(duplicate.message()), HasSubstr("batch"));
  // The first measurement stays; the other algorithm is a separate curve.
  EXPECT_EQ(*table.Find(4, 16, NsAlgorithm::kNs5),
            (CostTable::Curve{{2, 0.5}}));
  EXPECT_TRUE(table.Add(4, 16, NsAlgorithm::kGram, 2, 0.7).ok());
}

TEST(CostTableAddTest, KeepsCurvesSortedByBatch) {
  CostTable table;
  for (const int64_t batch : {16, 1, 8, 2, 4}) {
    ASSERT_TRUE(table
                    .Add(32, 64, NsAlgorithm::kGram, batch,
                         0.001 * static_cast<double>(batch))
                    .ok());
  }
  const CostTable::Curve* curve = table.Find(64, 32, NsAlgorithm::kGram);
  ASSERT_NE(curve, nullptr);
  EXPECT_EQ(*curve,
            (CostTable::Curve{
                {1, 0.001}, {2, 0.002}, {4, 0.004}, {8, 0.008}, {16, 0.016}}));
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
