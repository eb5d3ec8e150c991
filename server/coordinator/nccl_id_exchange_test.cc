// NcclIdExchange: the NCCL ids rank 0 of the current plan version puts and
// its peers get, per communicator generation, with each worker's own token.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator_fixture.h"

namespace muonps {
namespace coordinator {
namespace {

using coordinator_test::CoordinatorTest;
using coordinator_test::Create;
using coordinator_test::Spec;
using coordinator_test::StatusIs;
using ::testing::HasSubstr;

class NcclIdTest : public CoordinatorTest {
 protected:
  NcclIdTest() {
    EXPECT_TRUE(state_->CreateJob(Create(Spec("x", 4))).ok());
    JoinOk("x", "w1");
    JoinOk("x", "w2");
    const v1::Plan plan = CurrentPlan("x");
    rank0_ = plan.workers_size() > 0 ? plan.workers(0) : "";
    other_ = rank0_ == "w1" ? "w2" : "w1";
  }
  static std::string Id(char seed) {
    std::string id(128, '\0');  // binary, NULs included
    for (size_t i = 0; i < id.size(); i += 3)
      id[i] = static_cast<char>(seed + i);
    return id;
  }
  absl::Status Put(int64_t version, const std::string& worker,
                   const std::string& id, int64_t generation = 0) {
    v1::PutNcclIdRequest r;
    r.set_job("x");
    r.set_plan_version(version);
    r.set_worker_id(worker);
    r.set_nccl_id(id);
    r.set_generation(generation);
    return state_->PutNcclId(r);
  }
  absl::StatusOr<v1::GetNcclIdResponse> Get(int64_t version,
                                            int64_t min_generation = 0) {
    v1::GetNcclIdRequest r;
    r.set_job("x");
    r.set_worker_id(other_);
    r.set_plan_version(version);
    r.set_min_generation(min_generation);
    return state_->GetNcclId(r);
  }

  std::string rank0_;
  std::string other_;
};

TEST_F(NcclIdTest, RankZeroPutsOnceForCurrentVersionAndOthersGetIt) {
  ASSERT_EQ(rank0_, "w1");  // rank order is join order
  EXPECT_THAT(Get(2).status(),
              StatusIs(absl::StatusCode::kNotFound, "not put it"));
  EXPECT_THAT(Put(2, rank0_, Id('a').substr(0, 127)),
              StatusIs(absl::StatusCode::kInvalidArgument, "nccl_id"));
  EXPECT_THAT(Put(2, rank0_, Id('a') + "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "129 bytes"));
  EXPECT_THAT(Put(1, rank0_, Id('a')),
              StatusIs(absl::StatusCode::kFailedPrecondition, "plan_version"));
  const absl::Status not_rank0 = Put(2, other_, Id('a'));
  EXPECT_THAT(not_rank0,
              StatusIs(absl::StatusCode::kFailedPrecondition, "rank 0"));
  EXPECT_THAT(std::string(not_rank0.message()),
              HasSubstr(absl::StrCat("\"", rank0_, "\"")));
  EXPECT_THAT(Get(2).status(),
              StatusIs(absl::StatusCode::kNotFound, "nccl_id"));

  ASSERT_TRUE(Put(2, rank0_, Id('a')).ok());
  EXPECT_TRUE(Put(2, rank0_, Id('a')).ok());  // same id again: a no-op
  EXPECT_THAT(Put(2, rank0_, Id('b')),
              StatusIs(absl::StatusCode::kAlreadyExists, "nccl_id"));
  absl::StatusOr<v1::GetNcclIdResponse> got = Get(2);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->nccl_id(), Id('a'));
  EXPECT_THAT(Get(1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "plan_version"));
}

TEST_F(NcclIdTest, ACommunicatorRebuiltWithinAVersionGetsTheNextGeneration) {
  ASSERT_TRUE(Put(2, rank0_, Id('a')).ok());
  // The others ask for a newer one than the broken communicator's.
  EXPECT_THAT(Get(2, 1).status(),
              StatusIs(absl::StatusCode::kNotFound, "generation >= 1"));
  ASSERT_TRUE(Put(2, rank0_, Id('b'), 1).ok());
  absl::StatusOr<v1::GetNcclIdResponse> got = Get(2, 1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->nccl_id(), Id('b'));
  EXPECT_EQ(got->generation(), 1);
  // A late rank asking for any generation gets the newest.
  EXPECT_EQ(Get(2, 0)->nccl_id(), Id('b'));
  // Going back is refused; the same generation keeps its id.
  EXPECT_THAT(Put(2, rank0_, Id('c'), 0),
              StatusIs(absl::StatusCode::kFailedPrecondition, "generation"));
  EXPECT_THAT(Put(2, rank0_, Id('c'), 1),
              StatusIs(absl::StatusCode::kAlreadyExists, "nccl_id"));
  EXPECT_THAT(Put(2, rank0_, Id('c'), -1),
              StatusIs(absl::StatusCode::kInvalidArgument, "generation"));
}

// Each answer says how long ago rank 0 put the id: a peer that would start
// on an id rank 0 is about to give up waits for the next one instead.
TEST_F(NcclIdTest, AnIdComesWithItsAge) {
  ASSERT_TRUE(Put(2, rank0_, Id('a')).ok());
  absl::StatusOr<v1::GetNcclIdResponse> fresh = Get(2);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_GE(fresh->age_ms(), 0);
  EXPECT_LT(fresh->age_ms(), 5000);
  absl::SleepFor(absl::Milliseconds(60));
  absl::StatusOr<v1::GetNcclIdResponse> later = Get(2);
  ASSERT_TRUE(later.ok()) << later.status();
  EXPECT_GE(later->age_ms(), fresh->age_ms() + 50);
  // A new generation starts its age again.
  ASSERT_TRUE(Put(2, rank0_, Id('b'), /*generation=*/1).ok());
  absl::StatusOr<v1::GetNcclIdResponse> next = Get(2);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->generation(), 1);
  EXPECT_LT(next->age_ms(), later->age_ms());
}

TEST_F(NcclIdTest, OldVersionsIdIsNotReturnedForNewVersion) {
  ASSERT_TRUE(Put(2, rank0_, Id('a')).ok());
  EXPECT_EQ(JoinOk("x", "w3"), 3);
  EXPECT_THAT(Get(3).status(),
              StatusIs(absl::StatusCode::kNotFound, "nccl_id"));
  EXPECT_THAT(Get(2).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "plan_version"));
  EXPECT_THAT(Put(2, rank0_, Id('a')),
              StatusIs(absl::StatusCode::kFailedPrecondition, "plan_version"));
  const std::string rank0_v3 = CurrentPlan("x").workers(0);
  ASSERT_TRUE(Put(3, rank0_v3, Id('c')).ok());
  absl::StatusOr<v1::GetNcclIdResponse> got = Get(3);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->nccl_id(), Id('c'));
}

TEST_F(NcclIdTest, OnlyRankZeroWithItsOwnTokenPutsAndOnlyMembersGet) {
  v1::PutNcclIdRequest put;
  put.set_job("x");
  put.set_plan_version(2);
  put.set_worker_id(rank0_);
  put.set_nccl_id(Id('a'));
  // Naming rank 0 with another worker's token does not make one rank 0.
  put.set_worker_token(state_->worker_token("x", other_));
  EXPECT_THAT(state_->PutNcclId(put),
              StatusIs(absl::StatusCode::kUnauthenticated, "worker_token"));
  put.set_worker_token(state_->worker_token("x", rank0_));
  ASSERT_TRUE(state_->PutNcclId(put).ok());

  v1::GetNcclIdRequest get;
  get.set_job("x");
  get.set_plan_version(2);
  get.set_worker_id(other_);
  get.set_worker_token("ffffffffffffffffffffffffffffffff");
  EXPECT_THAT(state_->GetNcclId(get).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "worker_token"));
  get.set_worker_id("stranger");
  get.clear_worker_token();
  EXPECT_THAT(state_->GetNcclId(get).status(),
              StatusIs(absl::StatusCode::kNotFound, "worker_id"));
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
