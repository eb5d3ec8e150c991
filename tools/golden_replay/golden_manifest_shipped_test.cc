// Checks that LoadGoldenManifest reads the shipped PyTorch golden manifest
// field by field, and that every tensor it names has its case's size.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/golden_replay/golden_manifest.h"
#include "tools/golden_replay/shipped_golden_dir.h"

namespace muonps {
namespace golden {
namespace {

using ::testing::HasSubstr;

const GoldenCase* FindCase(const GoldenManifest& manifest,
                           const std::string& name) {
  for (const GoldenCase& c : manifest.cases) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

TEST(ShippedManifestTest, Holds13CasesWithTheirKindsShapesAndHyperparameters) {
  const std::string dir = ShippedGoldenDir();
  ASSERT_FALSE(dir.empty()) << "golden folder not found under TEST_SRCDIR";
  const absl::StatusOr<GoldenManifest> manifest = LoadGoldenManifest(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->dir, dir);
  EXPECT_THAT(manifest->source, HasSubstr("torch"));
  ASSERT_EQ(manifest->cases.size(), 13u);

  int muon = 0, adamw = 0, newton_schulz = 0;
  for (const GoldenCase& c : manifest->cases) {
    SCOPED_TRACE(c.name);
    switch (c.kind) {
      case CaseKind::kMuon:
        ++muon;
        EXPECT_EQ(c.steps.size(), 4u);
        for (const GoldenStep& step : c.steps)
          EXPECT_FALSE(step.momentum.empty());
        break;
      case CaseKind::kAdamW:
        ++adamw;
        EXPECT_EQ(c.steps.size(), 4u);
        for (const GoldenStep& step : c.steps)
          EXPECT_TRUE(step.momentum.empty());
        break;
      case CaseKind::kNewtonSchulz:
        ++newton_schulz;
        EXPECT_FALSE(c.input.empty());
        EXPECT_FALSE(c.output.empty());
        EXPECT_TRUE(c.steps.empty());
        break;
    }
  }
  EXPECT_EQ(muon, 8);
  EXPECT_EQ(adamw, 2);
  EXPECT_EQ(newton_schulz, 3);

  const GoldenCase* muon3 = FindCase(*manifest, "muon3");
  ASSERT_NE(muon3, nullptr);
  EXPECT_EQ(muon3->kind, CaseKind::kMuon);
  EXPECT_EQ(muon3->shape, (std::vector<int64_t>{257, 96}));
  EXPECT_EQ(muon3->batch(), 1);
  EXPECT_EQ(muon3->rows(), 257);
  EXPECT_EQ(muon3->cols(), 96);
  EXPECT_EQ(muon3->elements(), 257 * 96);
  EXPECT_EQ(muon3->muon.lr_adjustment, kernels::LrAdjustment::kMatchRmsAdamW);
  EXPECT_EQ(muon3->p0, "muon3_p0.bin");
  EXPECT_EQ(muon3->steps[2].param, "muon3_p3.bin");

  const GoldenCase* muon4 = FindCase(*manifest, "muon4");
  ASSERT_NE(muon4, nullptr);
  EXPECT_EQ(muon4->muon.ns.steps, 3);
  EXPECT_EQ(muon4->muon.lr_adjustment, kernels::LrAdjustment::kOriginal);

  const GoldenCase* adamw1 = FindCase(*manifest, "adamw1");
  ASSERT_NE(adamw1, nullptr);
  EXPECT_EQ(adamw1->kind, CaseKind::kAdamW);
  EXPECT_DOUBLE_EQ(adamw1->adamw.beta1, 0.9);
  EXPECT_DOUBLE_EQ(adamw1->adamw.beta2, 0.95);
}

TEST(ShippedManifestTest, EveryNamedTensorHasTheCaseSize) {
  const std::string dir = ShippedGoldenDir();
  ASSERT_FALSE(dir.empty()) << "golden folder not found under TEST_SRCDIR";
  const absl::StatusOr<GoldenManifest> manifest = LoadGoldenManifest(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  for (const GoldenCase& c : manifest->cases) {
    SCOPED_TRACE(c.name);
    std::vector<std::string> files;
    if (c.kind == CaseKind::kNewtonSchulz) {
      files = {c.input, c.output};
    } else {
      files = {c.p0};
      for (const GoldenStep& step : c.steps) {
        files.push_back(step.grad);
        files.push_back(step.param);
        if (c.kind == CaseKind::kMuon) files.push_back(step.momentum);
      }
    }
    for (const std::string& file : files) {
      const absl::StatusOr<std::vector<float>> tensor =
          ReadTensor(dir, file, c.elements());
      ASSERT_TRUE(tensor.ok()) << tensor.status();
      EXPECT_EQ(static_cast<int64_t>(tensor->size()), c.elements()) << file;
    }
  }
}

}  // namespace
}  // namespace golden
}  // namespace muonps
