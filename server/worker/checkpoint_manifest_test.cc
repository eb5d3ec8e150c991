#include "server/worker/checkpoint_manifest.h"

#include <string>

#include "gtest/gtest.h"

namespace muonps {
namespace {

CheckpointManifest TwoTensorManifest() {
  CheckpointManifest m;
  m.step = 12;
  m.plan_version = 3;
  m.worker_id = "worker-0";
  m.data_bytes = 4 * (6 + 4);
  CheckpointTensor a;
  a.name = "layers.1.w";
  a.rows = 2;
  a.cols = 3;
  a.length = 24;
  a.crc32c = 0xDEADBEEF;
  CheckpointTensor b = a;
  b.name = "moe.w2";
  b.expert = 7;
  b.rows = 4;
  b.cols = 1;
  b.offset = 24;
  b.length = 16;
  m.tensors = {a, b};
  return m;
}

// Replaces the trailing CRC so that a hand-made bad field reaches the
// field checks instead of failing the checksum.
std::string Resealed(std::string bytes) {
  bytes.resize(bytes.size() - 4);
  const uint32_t crc = Crc32c(bytes);
  for (int i = 0; i < 4; ++i)
    bytes.push_back(static_cast<char>(crc >> (8 * i)));
  return bytes;
}

void ExpectRefusedNaming(const CheckpointManifest& m, absl::StatusCode code,
                         const std::string& field) {
  auto parsed = ParseCheckpointManifest(SerializeCheckpointManifest(m));
  EXPECT_EQ(parsed.status().code(), code) << parsed.status();
  EXPECT_NE(parsed.status().message().find(field), absl::string_view::npos)
      << parsed.status();
}

TEST(Crc32cTest, MatchesTheCastagnoliCheckValue) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("6789", Crc32c("12345")), 0xE3069283u);
}

TEST(CheckpointManifestTest, RoundTripsEveryField) {
  const CheckpointManifest m = TwoTensorManifest();
  auto parsed = ParseCheckpointManifest(SerializeCheckpointManifest(m));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->step, 12);
  EXPECT_EQ(parsed->plan_version, 3);
  EXPECT_EQ(parsed->worker_id, "worker-0");
  EXPECT_EQ(parsed->data_bytes, 40u);
  ASSERT_EQ(parsed->tensors.size(), 2u);
  EXPECT_EQ(parsed->tensors[1].name, "moe.w2");
  EXPECT_EQ(parsed->tensors[1].expert, 7);
  EXPECT_EQ(parsed->tensors[1].offset, 24u);
  EXPECT_EQ(parsed->tensors[1].crc32c, 0xDEADBEEFu);
}

TEST(CheckpointManifestTest, EveryTruncationAndByteFlipIsDataLoss) {
  const std::string bytes = SerializeCheckpointManifest(TwoTensorManifest());
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(ParseCheckpointManifest(bytes.substr(0, n)).status().code(),
              absl::StatusCode::kDataLoss)
        << "prefix of " << n << " bytes";
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string flipped = bytes;
    flipped[i] ^= 0x04;
    EXPECT_EQ(ParseCheckpointManifest(flipped).status().code(),
              absl::StatusCode::kDataLoss)
        << "flip at byte " << i;
  }
  EXPECT_EQ(ParseCheckpointManifest(bytes + "x").status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(CheckpointManifestTest, RefusesOutOfRangeFieldsNamingThem) {
  CheckpointManifest m = TwoTensorManifest();
  m.tensors[0].rows = 0;
  ExpectRefusedNaming(m, absl::StatusCode::kInvalidArgument,
                      "\"layers.1.w\".rows");
  m = TwoTensorManifest();
  m.tensors[1].offset = 30;
  ExpectRefusedNaming(m, absl::StatusCode::kInvalidArgument,
                      "\"moe.w2\".offset");
  m = TwoTensorManifest();
  m.tensors[1].offset = ~uint64_t{0} - 4;
  ExpectRefusedNaming(m, absl::StatusCode::kInvalidArgument,
                      "\"moe.w2\".offset");
  m = TwoTensorManifest();
  m.tensors[1].rows = int64_t{1} << 62;
  m.tensors[1].cols = 8;
  ExpectRefusedNaming(m, absl::StatusCode::kInvalidArgument, "\"moe.w2\".rows");
  m = TwoTensorManifest();
  m.tensors[0].length = 20;
  ExpectRefusedNaming(m, absl::StatusCode::kInvalidArgument,
                      "\"layers.1.w\".length");
  m = TwoTensorManifest();
  m.tensors[0].dtype = static_cast<CheckpointDtype>(9);
  ExpectRefusedNaming(m, absl::StatusCode::kInvalidArgument, ".dtype");
  m = TwoTensorManifest();
  m.tensors[0].name = "";
  ExpectRefusedNaming(m, absl::StatusCode::kInvalidArgument, "tensors[0].name");
  m = TwoTensorManifest();
  m.worker_id = std::string(kMaxCheckpointNameBytes + 1, 'w');
  ExpectRefusedNaming(m, absl::StatusCode::kInvalidArgument,
                      "manifest.worker_id");
  m = TwoTensorManifest();
  m.step = -1;
  ExpectRefusedNaming(m, absl::StatusCode::kInvalidArgument, "manifest.step");
}

TEST(CheckpointManifestTest, RefusesCountsAndMagicItCannotTrust) {
  const std::string good = SerializeCheckpointManifest(TwoTensorManifest());
  // tensor_count follows magic, version, step, plan, worker id, data_bytes.
  const size_t count_at = 8 + 4 + 8 + 8 + 4 + 8 + 8;
  std::string huge = good;
  huge[count_at + 3] = '\x7F';
  auto parsed = ParseCheckpointManifest(Resealed(huge));
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("tensor_count"),
            absl::string_view::npos);
  std::string many = good;
  many[count_at] = 100;
  EXPECT_EQ(ParseCheckpointManifest(Resealed(many)).status().code(),
            absl::StatusCode::kDataLoss);
  std::string magic = good;
  magic[0] = 'X';
  EXPECT_EQ(ParseCheckpointManifest(Resealed(magic)).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string version = good;
  version[8] = 2;
  EXPECT_EQ(ParseCheckpointManifest(Resealed(version)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace muonps
