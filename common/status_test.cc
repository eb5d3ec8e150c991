#include "common/status.h"

#include <string>

#include "gtest/gtest.h"

namespace muonps {
namespace {

TEST(FieldErrorTest, MessageNamesTheField) {
  const absl::Status status = InvalidField("shape[0]", "-3 is negative");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "shape[0]: -3 is negative");
  EXPECT_EQ(
      FieldError(absl::StatusCode::kNotFound, "job", "\"a\" not found").code(),
      absl::StatusCode::kNotFound);
}

TEST(AnnotateTest, PrependsContextAndKeepsCodeAndPayload) {
  absl::Status inner = absl::DataLossError("truncated");
  inner.SetPayload("muonps/test", absl::Cord("x"));
  const absl::Status outer = Annotate(inner, "checkpoint \"c1\"");
  EXPECT_EQ(outer.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(outer.message(), "checkpoint \"c1\": truncated");
  EXPECT_EQ(outer.GetPayload("muonps/test").value_or(absl::Cord("")), "x");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "ignored").ok());
}

TEST(QuotedTest, ShortensHostileNames) {
  EXPECT_EQ(Quoted("w"), "\"w\"");
  const std::string long_name(5000, 'x');
  const std::string quoted = Quoted(long_name);
  EXPECT_EQ(quoted.size(), 200u + 5u);
  EXPECT_EQ(quoted.substr(quoted.size() - 4), "...\"");
}

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidField("x", "is odd");
  return x / 2;
}

absl::Status QuarterInto(int x, int* out) {
  MUONPS_ASSIGN_OR_RETURN(const int half, Half(x));
  MUONPS_ASSIGN_OR_RETURN(*out, Half(half));
  MUONPS_RETURN_IF_ERROR(absl::OkStatus());
  return absl::OkStatus();
}

TEST(MacrosTest, PropagateTheFirstError) {
  int out = 0;
  EXPECT_TRUE(QuarterInto(8, &out).ok());
  EXPECT_EQ(out, 2);
  const absl::Status odd = QuarterInto(6, &out);
  EXPECT_EQ(odd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(odd.message(), "x: is odd");
  EXPECT_EQ(out, 2);
}

}  // namespace
}  // namespace muonps
