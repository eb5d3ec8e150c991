// Checks that LoadGoldenManifest rejects malformed manifests with a status
// naming the field path, loads the valid manifests the malformed ones are
// edits of, and answers a missing manifest with NOT_FOUND.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/golden_replay/golden_manifest.h"
#include "tools/golden_replay/scratch_dir.h"

namespace muonps {
namespace golden {
namespace {

using manifest_test::ScratchDir;
using ::testing::HasSubstr;

// A one-case manifest: `case_fields` is the JSON members of cases[0].
std::string OneCase(const std::string& case_fields) {
  return R"({"source": "test", "cases": [{)" + case_fields + "}]}";
}

constexpr char kOneMuonStep[] =
    R"("steps": [{"grad": "g0.bin", "param": "p1.bin", "momentum": "m1.bin"}])";
constexpr char kOneAdamWStep[] =
    R"("steps": [{"grad": "g0.bin", "param": "p1.bin"}])";

std::string MuonCase(const std::string& shape, const std::string& hyper,
                     const std::string& steps = kOneMuonStep) {
  return OneCase(R"("kind": "muon", "name": "m", "shape": )" + shape +
                 R"(, "p0": "p0.bin", "hyper": )" + hyper + ", " + steps);
}

std::string AdamWCase(const std::string& hyper,
                      const std::string& shape = "[4]") {
  return OneCase(R"("kind": "adamw", "name": "a", "shape": )" + shape +
                 R"(, "p0": "p0.bin", "hyper": )" + hyper + ", " +
                 kOneAdamWStep);
}

std::string NewtonSchulzCase(const std::string& extra) {
  return OneCase(R"("kind": "newton_schulz", "name": "n", "shape": [4, 8], )"
                 R"("input": "in.bin", "output": "out.bin")" +
                 extra);
}

// A manifest that LoadGoldenManifest must reject with INVALID_ARGUMENT.
struct MalformedManifest {
  std::string what;
  std::string text;
  // Each must occur in the status message.
  std::vector<std::string> message_parts;
};

std::vector<MalformedManifest> MalformedManifests() {
  const std::string lr = R"({"lr": 0.02})";
  return {
      {"not JSON", R"({"cases": [)", {"manifest.json", "is not a JSON object"}},
      {"missing cases",
       R"({"source": "test"})",
       {"cases", "must be a non-empty array"}},
      {"empty cases",
       R"({"cases": []})",
       {"cases", "must be a non-empty array"}},
      {"unknown kind",
       OneCase(R"("kind": "sgd", "name": "s", "shape": [2])"),
       {"cases[0].kind", "\"sgd\""}},
      {"unknown kind in the second case",
       R"({"cases": [{"kind": "newton_schulz", "name": "n", "shape": [2, 2], )"
       R"("input": "i.bin", "output": "o.bin"}, )"
       R"({"kind": "lion", "name": "l", "shape": [2]}]})",
       {"cases[1].kind", "\"lion\""}},
      {"missing name",
       OneCase(R"("kind": "muon", "shape": [2, 2])"),
       {"cases[0].name", "must be a string"}},
      {"zero dimension",
       MuonCase("[0, 4]", lr),
       {"cases[0].shape", "integers in [1, 1e9]"}},
      {"negative dimension",
       MuonCase("[-3, 4]", lr),
       {"cases[0].shape", "integers in [1, 1e9]"}},
      {"non-integer dimension",
       MuonCase("[2.5, 4]", lr),
       {"cases[0].shape", "integers in [1, 1e9]"}},
      {"string dimension",
       MuonCase(R"(["2", 4])", lr),
       {"cases[0].shape", "must be an array of numbers"}},
      {"empty shape", AdamWCase(lr, "[]"), {"cases[0].shape", "is empty"}},
      {"muon shape of rank 1",
       MuonCase("[300]", lr),
       {"cases[0].shape", "[rows, cols]"}},
      {"muon shape of rank 4",
       MuonCase("[2, 2, 2, 2]", lr),
       {"cases[0].shape", "[rows, cols]"}},
      {"missing hyper",
       OneCase(R"("kind": "muon", "name": "m", )"
               R"("shape": [2, 2], "p0": "p0.bin")"),
       {"cases[0].hyper", "must be an object"}},
      {"missing hyper.lr",
       MuonCase("[2, 2]", R"({"momentum": 0.9})"),
       {"cases[0].hyper.lr", "must be a number"}},
      {"momentum 1.5",
       MuonCase("[2, 2]", R"({"lr": 0.02, "momentum": 1.5})"),
       {"cases[0].hyper.momentum: 1.5 is not in [0, 1)"}},
      {"unknown muon hyper key",
       MuonCase("[2, 2]", R"({"lr": 0.02, "betas": [0.9, 0.99]})"),
       {"cases[0].hyper.betas", "is not supported"}},
      {"unknown adamw hyper key",
       AdamWCase(R"({"lr": 0.001, "fused": true})"),
       {"cases[0].hyper.fused", "is not supported"}},
      {"adjust_lr_fn bogus",
       MuonCase("[2, 2]", R"({"lr": 0.02, "adjust_lr_fn": "bogus"})"),
       {"cases[0].hyper.adjust_lr_fn: \"bogus\""}},
      {"nesterov not a bool",
       MuonCase("[2, 2]", R"({"lr": 0.02, "nesterov": 1})"),
       {"cases[0].hyper.nesterov", "must be true or false"}},
      {"amsgrad true",
       AdamWCase(R"({"lr": 0.001, "amsgrad": true})"),
       {"cases[0].hyper.amsgrad", "true is not supported"}},
      {"betas of length 3",
       AdamWCase(R"({"lr": 0.001, "betas": [0.9, 0.99, 0.5]})"),
       {"cases[0].hyper.betas", "must hold 2"}},
      {"beta2 of 1",
       AdamWCase(R"({"lr": 0.001, "betas": [0.9, 1.0]})"),
       {"cases[0].hyper", "betas[1]", "is not in [0, 1)"}},
      {"steps empty",
       MuonCase("[2, 2]", lr, R"("steps": [])"),
       {"cases[0].steps", "must be a non-empty array"}},
      {"steps missing",
       OneCase(R"("kind": "muon", "name": "m", "shape": [2, 2], )"
               R"("p0": "p0.bin", "hyper": {"lr": 0.02})"),
       {"cases[0].steps", "must be a non-empty array"}},
      {"muon step without momentum",
       MuonCase("[2, 2]", lr, R"("steps": [{"grad": "g", "param": "p"}])"),
       {"cases[0].steps[0].momentum", "must be a string"}},
      {"muon ns_steps 0",
       MuonCase("[2, 2]", R"({"lr": 0.02, "ns_steps": 0})"),
       {"cases[0].hyper.ns_steps: 0 is not an integer in [1, 100]"}},
      {"muon ns_steps 3.7",
       MuonCase("[2, 2]", R"({"lr": 0.02, "ns_steps": 3.7})"),
       {"cases[0].hyper.ns_steps: 3.7 is not an integer in [1, 100]"}},
      {"muon ns_steps 1e10",
       MuonCase("[2, 2]", R"({"lr": 0.02, "ns_steps": 1e10})"),
       {"cases[0].hyper.ns_steps", "is not an integer in [1, 100]"}},
      {"newton_schulz ns_steps 0",
       NewtonSchulzCase(R"(, "ns_steps": 0)"),
       {"cases[0].ns_steps: 0 is not an integer in [1, 100]"}},
      {"muon eps 0",
       MuonCase("[2, 2]", R"({"lr": 0.02, "eps": 0})"),
       {"cases[0].hyper.eps: 0 must be positive and finite"}},
      {"adamw eps 0",
       AdamWCase(R"({"lr": 0.001, "eps": 0})"),
       {"cases[0].hyper.eps: 0 must be finite and > 0"}},
      {"element count past 2^31",
       MuonCase("[1000000000, 1000000000, 1000000000]", lr),
       {"cases[0].shape", "more than 2^31 elements"}},
      {"unknown case-level key",
       MuonCase("[2, 2]", R"({"lr": 0.02}, "step_count": 4)"),
       {"cases[0].step_count", "is not supported"}},
      {"duplicate case names",
       R"({"cases": [{"kind": "newton_schulz", "name": "n", "shape": [2, 2], )"
       R"("input": "i.bin", "output": "o.bin"}, {"kind": "newton_schulz", )"
       R"("name": "n", "shape": [2, 2], "input": "i.bin", "output": "o.bin"}]})",
       {"cases[1].name", "\"n\" appears twice"}},
      {"newton_schulz without output",
       OneCase(R"("kind": "newton_schulz", "name": "n", "shape": [4, 8], )"
               R"("input": "in.bin")"),
       {"cases[0].output", "must be a string"}},
      {"newton_schulz coefficients of length 2",
       NewtonSchulzCase(R"(, "coefficients": [3.4, -4.7])"),
       {"cases[0].coefficients", "must hold 3 numbers"}},
  };
}

TEST(MalformedManifestTest, EachIsRejectedWithAStatusNamingTheFieldPath) {
  for (const MalformedManifest& m : MalformedManifests()) {
    SCOPED_TRACE(m.what);
    const ScratchDir dir;
    ASSERT_FALSE(dir.path().empty());
    ASSERT_TRUE(dir.Write("manifest.json", m.text));
    const absl::StatusOr<GoldenManifest> manifest =
        LoadGoldenManifest(dir.path());
    ASSERT_FALSE(manifest.ok()) << "accepted: " << m.text;
    EXPECT_EQ(manifest.status().code(), absl::StatusCode::kInvalidArgument)
        << manifest.status();
    for (const std::string& part : m.message_parts) {
      EXPECT_THAT(std::string(manifest.status().message()), HasSubstr(part));
    }
  }
}

TEST(MalformedManifestTest, TheValidBaseManifestsOfTheTableLoad) {
  // Guards the table above: each malformed manifest differs from one of
  // these in the field it names, so it fails for the reason it claims.
  const std::string lr = R"({"lr": 0.02})";
  for (const std::string& text :
       {MuonCase("[2, 2]", lr), MuonCase("[3, 2, 2]", lr),
        AdamWCase(R"({"lr": 0.001, "amsgrad": false, "maximize": false})"),
        NewtonSchulzCase(R"(, "ns_steps": 5)"),
        // torch accepts 1 and 2 steps; the default Gram restart (after step
        // 2) then never happens rather than being an error.
        MuonCase("[2, 2]", R"({"lr": 0.02, "ns_steps": 2})"),
        NewtonSchulzCase(R"(, "ns_steps": 1)")}) {
    SCOPED_TRACE(text);
    const ScratchDir dir;
    ASSERT_FALSE(dir.path().empty());
    ASSERT_TRUE(dir.Write("manifest.json", text));
    const absl::StatusOr<GoldenManifest> manifest =
        LoadGoldenManifest(dir.path());
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    ASSERT_EQ(manifest->cases.size(), 1u);
  }
}

TEST(MalformedManifestTest, MissingManifestIsNotFound) {
  const ScratchDir dir;
  ASSERT_FALSE(dir.path().empty());
  const absl::StatusOr<GoldenManifest> manifest =
      LoadGoldenManifest(dir.path());
  ASSERT_FALSE(manifest.ok());
  EXPECT_EQ(manifest.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(manifest.status().message()),
              HasSubstr(dir.path() + "/manifest.json"));
}

}  // namespace
}  // namespace golden
}  // namespace muonps
