// The membership proof binds the secret, the proving side and every field
// of the handshake transcript; nonces are fresh; short secrets are refused
// without being quoted.
#include "transport/membership_proof.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace transport {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSecret[] = "a job's data-plane secret, 32 b.";

HandshakeTranscript Transcript() {
  HandshakeTranscript t;
  t.session = 17;
  t.connecting_rank = 2;
  t.accepting_rank = 0;
  t.world_size = 3;
  t.connecting_nonce.fill(0x11);
  t.accepting_nonce.fill(0x22);
  return t;
}

MembershipProof Prove(absl::string_view secret, ProvingSide side,
                      const HandshakeTranscript& t) {
  absl::StatusOr<MembershipProof> proof = ProveMembership(secret, side, t);
  EXPECT_TRUE(proof.ok()) << proof.status();
  return proof.ok() ? *proof : MembershipProof{};
}

TEST(MembershipProofTest, VerifiesWithTheSameSecretSideAndTranscript) {
  const MembershipProof proof =
      Prove(kSecret, ProvingSide::kConnectingRank, Transcript());
  EXPECT_TRUE(VerifyMembership(kSecret, ProvingSide::kConnectingRank,
                               Transcript(), proof));
}

TEST(MembershipProofTest, AnotherSecretOrTheOtherSideFails) {
  const MembershipProof proof =
      Prove(kSecret, ProvingSide::kAcceptingRank, Transcript());
  EXPECT_FALSE(VerifyMembership("another job's secret, 32 bytes..",
                                ProvingSide::kAcceptingRank, Transcript(),
                                proof));
  // The acceptor's proof reflected back as a confirmation.
  EXPECT_FALSE(VerifyMembership(kSecret, ProvingSide::kConnectingRank,
                                Transcript(), proof));
}

TEST(MembershipProofTest, EveryTranscriptFieldIsBound) {
  const MembershipProof proof =
      Prove(kSecret, ProvingSide::kConnectingRank, Transcript());
  const auto fails_with = [&](void (*change)(HandshakeTranscript&)) {
    HandshakeTranscript t = Transcript();
    change(t);
    return !VerifyMembership(kSecret, ProvingSide::kConnectingRank, t, proof);
  };
  EXPECT_TRUE(fails_with([](HandshakeTranscript& t) { t.version += 1; }));
  EXPECT_TRUE(fails_with([](HandshakeTranscript& t) { t.session += 1; }));
  EXPECT_TRUE(
      fails_with([](HandshakeTranscript& t) { t.connecting_rank = 1; }));
  EXPECT_TRUE(fails_with([](HandshakeTranscript& t) { t.accepting_rank = 1; }));
  EXPECT_TRUE(fails_with([](HandshakeTranscript& t) { t.world_size = 4; }));
  EXPECT_TRUE(
      fails_with([](HandshakeTranscript& t) { t.connecting_nonce[31] ^= 1; }));
  EXPECT_TRUE(
      fails_with([](HandshakeTranscript& t) { t.accepting_nonce[0] ^= 1; }));
  MembershipProof flipped = proof;
  flipped[5] ^= 0x80;
  EXPECT_FALSE(VerifyMembership(kSecret, ProvingSide::kConnectingRank,
                                Transcript(), flipped));
}

TEST(MembershipProofTest, FreshNoncesDiffer) {
  absl::StatusOr<Nonce> a = FreshNonce();
  absl::StatusOr<Nonce> b = FreshNonce();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(*a, *b);
}

TEST(MembershipProofTest, SecretsShorterThan16BytesAreRefusedUnquoted) {
  EXPECT_TRUE(CheckDataPlaneSecret(std::string(16, 'k'), "field").ok());
  const absl::Status empty = CheckDataPlaneSecret("", "options.secret");
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.message(),
              AllOf(HasSubstr("options.secret"), HasSubstr("empty")));
  const absl::Status short_one =
      CheckDataPlaneSecret("hunter2-hunter2", "options.secret");
  EXPECT_EQ(short_one.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_one.message(),
              AllOf(HasSubstr("15 bytes"), Not(HasSubstr("hunter2"))));
}

}  // namespace
}  // namespace transport
}  // namespace muonps
