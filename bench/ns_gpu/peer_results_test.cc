#include "bench/ns_gpu/peer_results.h"

#include "gtest/gtest.h"

namespace muonps {
namespace bench {
namespace {

constexpr char kLines[] = R"(
{"what": "gemm_bf16", "m": 8192, "tflops": 700.5}
{"what": "torch_ns5", "rows": 4096, "cols": 4096, "batch": 16, "ms": 40.0}
{"what": "torch_ns5", "rows": 1024, "cols": 4096, "batch": 16, "ms": 4.0}
{"what": "torch_muon_step_1gpu", "skipped": "no torch.optim.Muon"}
)";

TEST(PeerResultsTest, FindsFiguresByNameAndShape) {
  absl::StatusOr<PeerResults> peers = PeerResults::Parse(kLines);
  ASSERT_TRUE(peers.ok()) << peers.status();
  EXPECT_EQ(peers->Number("gemm_bf16", "tflops"), 700.5);
  EXPECT_EQ(peers->Number("torch_ns5", "ms", 1024, 4096, 16), 4.0);
  EXPECT_EQ(peers->Number("torch_ns5", "ms", 4096, 4096, 16), 40.0);
  EXPECT_FALSE(peers->Number("torch_ns5", "ms", 4096, 4096, 8));
  EXPECT_FALSE(peers->Number("torch_muon_step_1gpu", "ms"));
  EXPECT_EQ(peers->Find("adamw_fused_step"), nullptr);
}

TEST(PeerResultsTest, RatiosAgainstMissingPeersAreNull) {
  EXPECT_DOUBLE_EQ(Ratio(3.0, 2.0).get<double>(), 1.5);
  EXPECT_TRUE(Ratio(3.0, std::nullopt).is_null());
  EXPECT_TRUE(Ratio(std::nullopt, 2.0).is_null());
  EXPECT_TRUE(Ratio(3.0, 0.0).is_null());
}

TEST(PeerResultsTest, BadLinesAreNamed) {
  absl::StatusOr<PeerResults> peers =
      PeerResults::Parse("{\"what\": \"a\"}\nnot json\n");
  ASSERT_FALSE(peers.ok());
  EXPECT_NE(peers.status().message().find("line 2"), absl::string_view::npos);
  EXPECT_FALSE(PeerResults::Parse("{\"ms\": 1}").ok());
  EXPECT_EQ(PeerResults::Load("/nonexistent/torch.jsonl").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace bench
}  // namespace muonps
