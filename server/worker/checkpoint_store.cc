#include "server/worker/checkpoint_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace {

constexpr absl::string_view kTmpPrefix = ".tmp-";
constexpr absl::string_view kDataExt = ".data";
constexpr absl::string_view kManifestExt = ".manifest";
// A manifest of kMaxCheckpointTensors short names fits many times over; a
// larger file is not one of ours and is not read into memory.
constexpr off_t kMaxManifestBytes = off_t{256} << 20;

std::string CheckpointFileName(int64_t step, absl::string_view ext) {
  return absl::StrFormat("ckpt-%020d%s", step, ext);
}

std::string JoinPath(const std::string& dir, absl::string_view name) {
  return absl::StrCat(dir, "/", name);
}

// The step of "ckpt-<20 digits><ext>", or nothing for any other name.
std::optional<int64_t> StepOfFileName(absl::string_view name,
                                      absl::string_view ext) {
  if (!absl::ConsumePrefix(&name, "ckpt-") ||
      !absl::ConsumeSuffix(&name, ext) || name.size() != 20) {
    return std::nullopt;
  }
  int64_t step = 0;
  if (!std::all_of(name.begin(), name.end(),
                   [](char c) { return c >= '0' && c <= '9'; }) ||
      !absl::SimpleAtoi(name, &step)) {
    return std::nullopt;
  }
  return step;
}

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  const int err = errno;
  return absl::InternalError(absl::StrCat(
      "checkpoint file ", Quoted(path), ": ", what, ": ", std::strerror(err)));
}

// Closes a descriptor on every return path.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::StatusOr<std::vector<std::string>> ListNames(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return ErrnoError("opendir", dir);
  std::vector<std::string> names;
  while (const dirent* e = readdir(d)) names.emplace_back(e->d_name);
  closedir(d);
  return names;
}

absl::Status WriteAll(int fd, const std::string& path,
                      absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("write", path);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  Fd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError("open directory", dir);
  if (fsync(fd.get()) != 0) return ErrnoError("fsync directory", dir);
  return absl::OkStatus();
}

absl::Status RemoveFile(const std::string& path) {
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError("unlink", path);
  }
  return absl::OkStatus();
}

absl::Status CheckTensors(const std::vector<CheckpointTensorValues>& tensors) {
  std::set<std::pair<std::string, int32_t>> seen;
  for (const CheckpointTensorValues& t : tensors) {
    const std::string field =
        absl::StrCat("tensor ", Quoted(t.name), " expert ", t.expert);
    if (t.name.empty() || t.name.size() > kMaxCheckpointNameBytes) {
      return InvalidField(
          field, absl::StrCat("name must have 1 to ", kMaxCheckpointNameBytes,
                              " bytes"));
    }
    if (t.expert < 0) return InvalidField(field, "expert must be >= 0");
    if (t.rows <= 0 || t.cols <= 0) {
      return InvalidField(field, absl::StrCat("shape [", t.rows, ", ", t.cols,
                                              "]: rows and cols must be > 0"));
    }
    if (static_cast<uint64_t>(t.values.size()) /
                static_cast<uint64_t>(t.rows) !=
            static_cast<uint64_t>(t.cols) ||
        t.values.size() % static_cast<uint64_t>(t.rows) != 0) {
      return InvalidField(
          field, absl::StrCat(t.values.size(), " values for shape [", t.rows,
                              ", ", t.cols, "]"));
    }
    if (!seen.emplace(t.name, t.expert).second) {
      return InvalidField(field, "appears twice");
    }
  }
  if (tensors.size() > kMaxCheckpointTensors) {
    return InvalidField("tensors", absl::StrCat(tensors.size(), " exceed ",
                                                kMaxCheckpointTensors));
  }
  return absl::OkStatus();
}

// Removes what a completed write leaves behind: data files whose manifest
// never landed, and the checkpoints beyond keep_last (the new one is always
// kept, then the newest others). Manifests go first so no manifest outlives
// its data.
absl::Status Prune(const std::string& dir, int64_t new_step, int keep_last) {
  MUONPS_ASSIGN_OR_RETURN(std::vector<std::string> names, ListNames(dir));
  std::vector<int64_t> manifests;
  std::vector<int64_t> datas;
  for (const std::string& name : names) {
    if (auto s = StepOfFileName(name, kManifestExt)) manifests.push_back(*s);
    if (auto s = StepOfFileName(name, kDataExt)) datas.push_back(*s);
  }
  std::sort(manifests.rbegin(), manifests.rend());
  std::set<int64_t> keep = {new_step};
  for (int64_t s : manifests) {
    if (static_cast<int>(keep.size()) >= keep_last) break;
    keep.insert(s);
  }
  for (int64_t s : manifests) {
    if (keep.count(s) == 0) {
      MUONPS_RETURN_IF_ERROR(
          RemoveFile(JoinPath(dir, CheckpointFileName(s, kManifestExt))));
    }
  }
  for (int64_t s : datas) {
    if (keep.count(s) == 0) {
      MUONPS_RETURN_IF_ERROR(
          RemoveFile(JoinPath(dir, CheckpointFileName(s, kDataExt))));
    }
  }
  return SyncDir(dir);
}

}  // namespace

absl::StatusOr<CheckpointManifest> WriteCheckpoint(
    const std::string& dir, int64_t step, int64_t plan_version,
    const std::string& worker_id,
    const std::vector<CheckpointTensorValues>& tensors,
    const CheckpointWriteOptions& options) {
  if (step < 0) return InvalidField("step", "must be >= 0");
  if (options.keep_last < 1) return InvalidField("keep_last", "must be >= 1");
  if (worker_id.size() > kMaxCheckpointNameBytes) {
    return InvalidField("worker_id", "too long");
  }
  MUONPS_RETURN_IF_ERROR(CheckTensors(tensors));
  const auto hook = [&](absl::string_view protocol_step) {
    if (options.crash_hook) options.crash_hook(protocol_step);
  };
  const std::string data_name = CheckpointFileName(step, kDataExt);
  const std::string manifest_name = CheckpointFileName(step, kManifestExt);
  const std::string manifest_path = JoinPath(dir, manifest_name);
  if (access(manifest_path.c_str(), F_OK) == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("checkpoint ", Quoted(manifest_path), " exists already"));
  }

  // Temporaries of a crashed earlier write may be large; drop them first.
  MUONPS_ASSIGN_OR_RETURN(std::vector<std::string> names, ListNames(dir));
  for (const std::string& name : names) {
    if (absl::StartsWith(name, kTmpPrefix)) {
      MUONPS_RETURN_IF_ERROR(RemoveFile(JoinPath(dir, name)));
    }
  }
  hook("temporaries_removed");

  CheckpointManifest manifest;
  manifest.step = step;
  manifest.plan_version = plan_version;
  manifest.worker_id = worker_id;
  const std::string tmp_data =
      JoinPath(dir, absl::StrCat(kTmpPrefix, data_name));
  {
    Fd fd(
        open(tmp_data.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return ErrnoError("create", tmp_data);
    for (const CheckpointTensorValues& t : tensors) {
      const absl::string_view bytes(
          reinterpret_cast<const char*>(t.values.data()),
          t.values.size() * sizeof(float));
      MUONPS_RETURN_IF_ERROR(WriteAll(fd.get(), tmp_data, bytes));
      CheckpointTensor entry;
      entry.name = t.name;
      entry.expert = t.expert;
      entry.rows = t.rows;
      entry.cols = t.cols;
      entry.offset = manifest.data_bytes;
      entry.length = bytes.size();
      entry.crc32c = Crc32c(bytes);
      manifest.data_bytes += bytes.size();
      manifest.tensors.push_back(std::move(entry));
      hook("data_tensor_written");
    }
    hook("data_written");
    if (fsync(fd.get()) != 0) return ErrnoError("fsync", tmp_data);
  }
  hook("data_synced");
  const std::string data_path = JoinPath(dir, data_name);
  if (rename(tmp_data.c_str(), data_path.c_str()) != 0) {
    return ErrnoError("rename", tmp_data);
  }
  hook("data_renamed");

  const std::string tmp_manifest =
      JoinPath(dir, absl::StrCat(kTmpPrefix, manifest_name));
  {
    Fd fd(open(tmp_manifest.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
               0644));
    if (fd.get() < 0) return ErrnoError("create", tmp_manifest);
    MUONPS_RETURN_IF_ERROR(WriteAll(fd.get(), tmp_manifest,
                                    SerializeCheckpointManifest(manifest)));
    hook("manifest_written");
    if (fsync(fd.get()) != 0) return ErrnoError("fsync", tmp_manifest);
  }
  hook("manifest_synced");
  if (rename(tmp_manifest.c_str(), manifest_path.c_str()) != 0) {
    return ErrnoError("rename", tmp_manifest);
  }
  hook("manifest_renamed");
  // Both renames become durable together; only then may older checkpoints go.
  MUONPS_RETURN_IF_ERROR(SyncDir(dir));
  hook("directory_synced");
  MUONPS_RETURN_IF_ERROR(Prune(dir, step, options.keep_last));
  hook("pruned");
  return manifest;
}

absl::Status RemoveCheckpoint(const std::string& dir, int64_t step) {
  const std::string manifest =
      JoinPath(dir, CheckpointFileName(step, kManifestExt));
  if (access(manifest.c_str(), F_OK) == 0) {
    MUONPS_RETURN_IF_ERROR(RemoveFile(manifest));
    MUONPS_RETURN_IF_ERROR(SyncDir(dir));
  }
  const std::string data = JoinPath(dir, CheckpointFileName(step, kDataExt));
  if (access(data.c_str(), F_OK) == 0) MUONPS_RETURN_IF_ERROR(RemoveFile(data));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ListCheckpointSteps(
    const std::string& dir) {
  MUONPS_ASSIGN_OR_RETURN(std::vector<std::string> names, ListNames(dir));
  std::vector<int64_t> steps;
  for (const std::string& name : names) {
    if (auto s = StepOfFileName(name, kManifestExt)) steps.push_back(*s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir,
                                                int64_t step) {
  const std::string manifest_path =
      JoinPath(dir, CheckpointFileName(step, kManifestExt));
  const auto data_loss = [](const std::string& path, absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat("checkpoint file ", Quoted(path), ": ", what));
  };
  std::string manifest_bytes;
  {
    Fd fd(open(manifest_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0 && errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat(
          "checkpoint ", Quoted(manifest_path), " does not exist"));
    }
    if (fd.get() < 0) return ErrnoError("open", manifest_path);
    struct stat st;
    if (fstat(fd.get(), &st) != 0) return ErrnoError("fstat", manifest_path);
    if (st.st_size > kMaxManifestBytes) {
      return data_loss(manifest_path,
                       absl::StrCat(st.st_size, " bytes is too large"));
    }
    manifest_bytes.resize(static_cast<size_t>(st.st_size));
    const ssize_t n =
        pread(fd.get(), manifest_bytes.data(), manifest_bytes.size(), 0);
    if (n < 0) return ErrnoError("read", manifest_path);
    manifest_bytes.resize(static_cast<size_t>(n));
  }
  absl::StatusOr<CheckpointManifest> manifest =
      ParseCheckpointManifest(manifest_bytes);
  if (!manifest.ok()) {
    return data_loss(manifest_path, manifest.status().message());
  }
  if (manifest->step != step) {
    return data_loss(
        manifest_path,
        absl::StrCat("manifest.step is ", manifest->step, ", not ", step));
  }

  const std::string data_path =
      JoinPath(dir, CheckpointFileName(step, kDataExt));
  Fd fd(open(data_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0 && errno == ENOENT) {
    return data_loss(data_path, "is missing");
  }
  if (fd.get() < 0) return ErrnoError("open", data_path);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoError("fstat", data_path);
  if (static_cast<uint64_t>(st.st_size) != manifest->data_bytes) {
    return data_loss(data_path,
                     absl::StrCat(st.st_size, " bytes, but the manifest says ",
                                  manifest->data_bytes));
  }
  LoadedCheckpoint loaded;
  loaded.tensors.reserve(manifest->tensors.size());
  for (const CheckpointTensor& t : manifest->tensors) {
    std::vector<float> values(t.length / sizeof(float));
    char* out = reinterpret_cast<char*>(values.data());
    uint64_t done = 0;
    while (done < t.length) {
      const ssize_t n = pread(fd.get(), out + done, t.length - done,
                              static_cast<off_t>(t.offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError("read", data_path);
      if (n == 0) return data_loss(data_path, "ends early");
      done += static_cast<uint64_t>(n);
    }
    if (Crc32c(absl::string_view(out, t.length)) != t.crc32c) {
      return data_loss(data_path,
                       absl::StrCat("tensor ", Quoted(t.name), " expert ",
                                    t.expert, " fails its CRC32C"));
    }
    loaded.tensors.push_back(std::move(values));
  }
  loaded.manifest = *std::move(manifest);
  return loaded;
}

absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& dir) {
  MUONPS_ASSIGN_OR_RETURN(std::vector<int64_t> steps, ListCheckpointSteps(dir));
  int skipped = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(dir, *it);
    if (loaded.ok()) return loaded;
    // Pruned by a concurrent writer between listing and opening: not a fault.
    if (absl::IsNotFound(loaded.status())) continue;
    ++skipped;
    spdlog::warn("checkpoint skipped: dir={} step={} reason: {}", dir, *it,
                 loaded.status().ToString());
  }
  return absl::NotFoundError(absl::StrCat("checkpoint directory ", Quoted(dir),
                                          " holds no complete checkpoint (",
                                          skipped, " corrupt ones skipped)"));
}

}  // namespace muonps
