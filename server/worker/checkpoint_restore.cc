#include "server/worker/checkpoint_restore.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

namespace fs = std::filesystem;

absl::StatusOr<CheckpointCatalog> CheckpointCatalog::Load(
    const std::string& dir, int64_t step) {
  CheckpointCatalog catalog;
  std::error_code error;
  if (!fs::exists(dir, error)) return catalog;
  std::vector<std::string> worker_dirs;
  for (fs::directory_iterator it(dir, error), end; !error && it != end;
       it.increment(error)) {
    if (it->is_directory(error)) worker_dirs.push_back(it->path().string());
  }
  if (error) {
    return absl::InternalError(absl::StrCat(
        "cannot list checkpoint_dir ", Quoted(dir), ": ", error.message()));
  }
  std::sort(worker_dirs.begin(), worker_dirs.end());
  for (const std::string& worker_dir : worker_dirs) {
    absl::StatusOr<LoadedCheckpoint> loaded =
        step >= 0 ? LoadCheckpoint(worker_dir, step)
                  : LoadLatestCheckpoint(worker_dir);
    if (!loaded.ok()) {
      if (!absl::IsNotFound(loaded.status())) {
        spdlog::warn("checkpoints in {} skipped: {}", worker_dir,
                     loaded.status().ToString());
      }
      continue;
    }
    catalog.checkpoints_.push_back(*std::move(loaded));
  }
  for (size_t c = 0; c < catalog.checkpoints_.size(); ++c) {
    const CheckpointManifest& m = catalog.checkpoints_[c].manifest;
    catalog.newest_step_ = std::max(catalog.newest_step_, m.step);
    for (size_t t = 0; t < m.tensors.size(); ++t) {
      auto [it, added] = catalog.where_.try_emplace(
          std::make_pair(m.tensors[t].name, int64_t{m.tensors[t].expert}), c,
          t);
      if (!added &&
          catalog.checkpoints_[it->second.first].manifest.step < m.step) {
        it->second = {c, t};
      }
    }
  }
  return catalog;
}

absl::StatusOr<int64_t> CheckpointCatalog::Restore(const std::string& matrix,
                                                   int64_t expert, int64_t rows,
                                                   int64_t cols,
                                                   float* dst) const {
  const auto it = where_.find({matrix, expert});
  if (it == where_.end()) {
    return FieldError(absl::StatusCode::kNotFound, "matrix",
                      absl::StrCat(Quoted(matrix), " expert ", expert,
                                   " is in no checkpoint"));
  }
  const LoadedCheckpoint& c = checkpoints_[it->second.first];
  const CheckpointTensor& t = c.manifest.tensors[it->second.second];
  if (t.rows != rows || t.cols != cols) {
    return InvalidField(
        "matrix",
        absl::StrCat(Quoted(matrix), " expert ", expert, " is ", t.rows, "x",
                     t.cols, " in the checkpoint of step ", c.manifest.step,
                     " by worker ", Quoted(c.manifest.worker_id),
                     ", but the job has it ", rows, "x", cols));
  }
  const std::vector<float>& values = c.tensors[it->second.second];
  std::copy(values.begin(), values.end(), dst);
  return c.manifest.step;
}

absl::StatusOr<int64_t> RestoreMomentumFromCheckpoint(
    const std::string& dir, const std::string& matrix, int64_t expert,
    int64_t rows, int64_t cols, float* dst) {
  MUONPS_ASSIGN_OR_RETURN(const CheckpointCatalog catalog,
                          CheckpointCatalog::Load(dir));
  absl::StatusOr<int64_t> step =
      catalog.Restore(matrix, expert, rows, cols, dst);
  if (absl::IsNotFound(step.status())) return -1;
  return step;
}

}  // namespace worker
}  // namespace muonps
