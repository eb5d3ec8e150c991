// The worker's checkpoint writer (background thread, per-worker directory,
// counted results) and the catalog a restore reads (newest verified
// checkpoint of every worker directory; the newest step wins per tensor).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "server/worker/checkpoint_restore.h"
#include "server/worker/checkpoint_store.h"
#include "server/worker/checkpoint_writer.h"

namespace muonps {
namespace worker {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/checkpoint_io_", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

CheckpointSnapshot Snapshot(const std::string& dir, int64_t step,
                            const std::string& name, float value) {
  CheckpointSnapshot s;
  s.checkpoint_dir = dir;
  s.step = step;
  s.plan_version = 3;
  s.tensors.push_back({name, 0, 2, 3, std::vector<float>(6, value)});
  return s;
}

TEST(CheckpointWriterTest, WritesIntoItsWorkerDirectoryAndCountsResults) {
  const std::string dir = TempDir("writer") + "/job";  // created on demand
  MetricsRegistry metrics;
  CheckpointWriter writer("w0", &metrics);
  EXPECT_EQ(writer.last_written(), -1);
  writer.Submit(Snapshot(dir, 4, "a", 1.5f));
  ASSERT_TRUE(writer.WaitIdle().ok());
  EXPECT_EQ(writer.last_written(), 4);
  absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(dir + "/w0", 4);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->manifest.plan_version, 3);
  EXPECT_EQ(loaded->manifest.worker_id, "w0");
  EXPECT_EQ(loaded->tensors[0], std::vector<float>(6, 1.5f));
  // The same step again (a redo of a step that did not commit, maybe with
  // other matrices) replaces it.
  CheckpointSnapshot redo = Snapshot(dir, 4, "b", 2.0f);
  redo.plan_version = 4;
  writer.Submit(std::move(redo));
  ASSERT_TRUE(writer.WaitIdle().ok());
  EXPECT_EQ(writer.last_written(), 4);
  loaded = LoadCheckpoint(dir + "/w0", 4);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->manifest.plan_version, 4);
  EXPECT_EQ(loaded->manifest.tensors[0].name, "b");
  EXPECT_EQ(loaded->tensors[0], std::vector<float>(6, 2.0f));
  // A directory that cannot be made fails, counted.
  const std::string file = dir + "/w0/" + "ckpt-00000000000000000004.data";
  writer.Submit(Snapshot(file, 5, "a", 1.0f));
  EXPECT_FALSE(writer.WaitIdle().ok());
  const std::string text = metrics.RenderText();
  EXPECT_NE(text.find("muonps_worker_checkpoints_total{result=\"written\"} 2"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("muonps_worker_checkpoints_total{result=\"failed\"} 1"),
            std::string::npos)
      << text;
}

TEST(CheckpointWriterTest, BackToBackSnapshotsAreAllWrittenInOrder) {
  const std::string dir = TempDir("back_to_back");
  CheckpointWriter writer("w0", nullptr);
  for (int64_t step = 1; step <= 5; ++step) {
    CheckpointSnapshot s = Snapshot(dir, step, "a", static_cast<float>(step));
    s.tensors[0].rows = 512;
    s.tensors[0].cols = 512;
    s.tensors[0].values.assign(512 * 512, static_cast<float>(step));
    writer.Submit(std::move(s));
  }
  ASSERT_TRUE(writer.WaitIdle().ok());
  EXPECT_EQ(writer.last_written(), 5);
  absl::StatusOr<std::vector<int64_t>> steps = ListCheckpointSteps(dir + "/w0");
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{4, 5}));  // keep_last 2
}

TEST(CheckpointWriterTest, AWorkerIdThatNamesNoDirectoryOfItsOwnFails) {
  const std::string dir = TempDir("dotdot");
  CheckpointWriter writer("..", nullptr);
  writer.Submit(Snapshot(dir + "/job", 1, "a", 1.0f));
  EXPECT_EQ(writer.WaitIdle().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(dir + "/ckpt-00000000000000000001.manifest"));
}

TEST(CheckpointWriterTest, AnUnwritableDirectoryFailsNamingIt) {
  const std::string file = TempDir("unwritable") + "/not-a-dir";
  std::ofstream(file) << "x";
  CheckpointWriter writer("w0", nullptr);
  writer.Submit(Snapshot(file, 1, "a", 1.0f));
  const absl::Status failed = writer.WaitIdle();
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("not-a-dir"), std::string::npos) << failed;
}

TEST(CheckpointCatalogTest, TakesEachTensorFromTheNewestCheckpointHoldingIt) {
  const std::string dir = TempDir("catalog");
  fs::create_directories(dir + "/w0");
  fs::create_directories(dir + "/w1");
  const std::vector<float> old_a(6, 1.0f), new_a(6, 2.0f), b(6, 3.0f);
  // w0 owned "a" at step 2; after a re-plan w1 owns "a" and "b" at step 4.
  ASSERT_TRUE(
      WriteCheckpoint(dir + "/w0", 2, 1, "w0", {{"a", 0, 2, 3, old_a}}).ok());
  ASSERT_TRUE(WriteCheckpoint(dir + "/w1", 4, 2, "w1",
                              {{"a", 0, 2, 3, new_a}, {"b", 0, 2, 3, b}})
                  .ok());
  absl::StatusOr<CheckpointCatalog> catalog = CheckpointCatalog::Load(dir);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  EXPECT_EQ(catalog->newest_step(), 4);
  std::vector<float> out(6);
  absl::StatusOr<int64_t> step = catalog->Restore("a", 0, 2, 3, out.data());
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 4);
  EXPECT_EQ(out, new_a);
  EXPECT_EQ(catalog->Restore("c", 0, 2, 3, out.data()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(catalog->Restore("b", 0, 3, 2, out.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The one-shot form answers -1 for a tensor no checkpoint holds.
  absl::StatusOr<int64_t> none =
      RestoreMomentumFromCheckpoint(dir, "c", 0, 2, 3, out.data());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, -1);
}

TEST(CheckpointCatalogTest, SkipsACorruptNewestCheckpointForTheOneBefore) {
  const std::string dir = TempDir("corrupt");
  fs::create_directories(dir + "/w0");
  ASSERT_TRUE(WriteCheckpoint(dir + "/w0", 2, 1, "w0",
                              {{"a", 0, 2, 3, std::vector<float>(6, 1.0f)}})
                  .ok());
  ASSERT_TRUE(WriteCheckpoint(dir + "/w0", 4, 1, "w0",
                              {{"a", 0, 2, 3, std::vector<float>(6, 2.0f)}})
                  .ok());
  // Flip one byte of step 4's data: its CRC32C no longer matches.
  const std::string data = dir + "/w0/ckpt-00000000000000000004.data";
  ASSERT_TRUE(fs::exists(data));
  {
    std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('\x7f');
  }
  absl::StatusOr<CheckpointCatalog> catalog = CheckpointCatalog::Load(dir);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  std::vector<float> out(6);
  absl::StatusOr<int64_t> step = catalog->Restore("a", 0, 2, 3, out.data());
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 2);
  EXPECT_EQ(out, std::vector<float>(6, 1.0f));
}

TEST(CheckpointCatalogTest, AMissingDirectoryIsAnEmptyCatalog) {
  absl::StatusOr<CheckpointCatalog> catalog =
      CheckpointCatalog::Load(TempDir("missing") + "/nothing");
  ASSERT_TRUE(catalog.ok());
  EXPECT_TRUE(catalog->empty());
  EXPECT_EQ(catalog->newest_step(), -1);
}

}  // namespace
}  // namespace worker
}  // namespace muonps
