// The undo area a host client lends (lending/undo_area.h): UndoAreaLayout
// of its job matrices' parameters, in the job's matrix order, zero-filled
// in the shared segment after the step record and inside it. Part of
// client_test (client/fake_service.h records the attach).
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/client.h"
#include "client/fake_service.h"
#include "gtest/gtest.h"
#include "lending/shared_memory.h"
#include "lending/step_record.h"
#include "lending/undo_area.h"

namespace muonps {
namespace {

// Rank 1 of 3 with every kind of job matrix and an AdamW tensor between
// them: the area has a slot for each matrix's lent parameter (a row-sharded
// matrix's own rows, or the whole parameter where the trainer keeps it;
// experts included) and none for the AdamW tensor.
TEST(ClientUndoAreaTest, TheAttachLendsTheLayoutsBytesAfterTheStepRecord) {
  testing::FakeService service;
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Create({.coordinator = service.coordinator_target(),
                      .job = "undo",
                      .worker_socket = service.worker_socket(),
                      .trainer_rank = 1,
                      .trainer_count = 3,
                      .timeout = absl::Seconds(5)});
  ASSERT_TRUE(client.ok()) << client.status();
  Client& c = **client;
  ASSERT_TRUE(
      c.AddMatrix("rows", 31, 5, {.layout = TensorLayout::kRowSharded}).ok());
  ASSERT_TRUE(c.AddTensor("bias", 7, TensorLayout::kReplicated).ok());
  ASSERT_TRUE(c.AddMatrix("experts", 6, 4, {.experts = 3}).ok());
  ASSERT_TRUE(
      c.AddMatrix("whole", 10, 3,
                  {.layout = TensorLayout::kRowSharded, .shard_params = false})
          .ok());
  ASSERT_TRUE(c.Start(MuonOptions(), AdamWOptions()).ok());

  const std::vector<v1::AttachRequest> attaches = service.attaches();
  ASSERT_EQ(attaches.size(), 1u);
  const v1::AttachRequest& attach = attaches[0];
  ASSERT_TRUE(attach.has_undo_area());
  // Rank 1 of 3 holds rows [11, 22) of 31 (torch.chunk), rows [4, 8) of
  // 10 with the whole parameter kept.
  const UndoLayout want = UndoAreaLayout({11 * 5, 3 * 6 * 4, 10 * 3});
  EXPECT_EQ(want.bytes, 256 + 512 + 256);
  EXPECT_EQ(attach.undo_area().bytes(), want.bytes);

  // The same counts as the job's matrices, in their order, as lent.
  const std::vector<v1::JobSpec> jobs = service.jobs();
  ASSERT_EQ(jobs.size(), 1u);
  std::map<std::string, int64_t> lent;
  int64_t tensors_end = 0;
  for (const v1::TensorBinding& b : attach.tensors()) {
    if (b.muon()) lent[b.name()] = b.param_elements();
    tensors_end =
        std::max(tensors_end, b.param_offset() + 4 * b.param_elements());
  }
  std::vector<int64_t> in_job_order;
  for (const v1::Matrix& m : jobs[0].matrices()) {
    in_job_order.push_back(lent.at(m.name()));
  }
  EXPECT_EQ(in_job_order, (std::vector<int64_t>{11 * 5, 3 * 6 * 4, 10 * 3}));
  EXPECT_EQ(UndoAreaLayout(in_job_order).bytes, attach.undo_area().bytes());

  // After the tensors and the step record, 256-byte aligned, inside the
  // segment.
  const int64_t offset = attach.undo_area().segment_offset();
  EXPECT_EQ(offset % kUndoSlotAlignment, 0);
  EXPECT_GE(attach.step_record().segment_offset(), tensors_end);
  EXPECT_GE(offset, attach.step_record().segment_offset() +
                        static_cast<int64_t>(kStepRecordBytes));
  EXPECT_LE(offset + attach.undo_area().bytes(), attach.segment_bytes());
  EXPECT_FALSE(attach.undo_area().has_cuda());

  // Zero-filled: no worker wrote it yet.
  absl::StatusOr<SharedMemorySegment> segment = SharedMemorySegment::Open(
      attach.segment(), static_cast<size_t>(attach.segment_bytes()));
  ASSERT_TRUE(segment.ok()) << segment.status();
  const char* area = static_cast<const char*>(segment->data()) + offset;
  for (int64_t i = 0; i < attach.undo_area().bytes(); ++i) {
    ASSERT_EQ(area[i], 0) << "byte " << i;
  }
}

}  // namespace
}  // namespace muonps
