#include "examples/trainer/trainer_state.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace example {
namespace {

constexpr char kMagic[8] = {'m', 'l', 'p', 's', 't', 'a', 't', '1'};

absl::Status Errno(const char* what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

// Fixed-size values and float vectors, appended and read back in order.
class Bytes {
 public:
  Bytes() = default;
  explicit Bytes(std::string data) : data_(std::move(data)) {}

  template <typename T>
  void Put(const T& value) {
    data_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void PutFloats(const std::vector<float>& values) {
    Put(static_cast<int64_t>(values.size()));
    if (values.empty()) return;  // an empty vector's data() may be null
    data_.append(reinterpret_cast<const char*>(values.data()),
                 values.size() * sizeof(float));
  }
  template <typename T>
  bool Get(T* value) {
    if (data_.size() - at_ < sizeof(T)) return false;
    std::memcpy(value, data_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool GetFloats(std::vector<float>* values) {
    int64_t n = 0;
    if (!Get(&n) || n < 0 ||
        static_cast<uint64_t>(n) > (data_.size() - at_) / sizeof(float)) {
      return false;
    }
    values->resize(n);
    if (n == 0) return true;  // an empty vector's data() may be null
    std::memcpy(values->data(), data_.data() + at_, n * sizeof(float));
    at_ += n * sizeof(float);
    return true;
  }
  bool done() const { return at_ == data_.size(); }
  const std::string& data() const { return data_; }

 private:
  std::string data_;
  size_t at_ = 0;
};

}  // namespace

absl::Status SaveTrainerState(const std::string& path,
                              const TrainerState& state) {
  Bytes out;
  out.Put(kMagic);
  out.Put(state.step);
  out.Put(state.adamw_steps);
  out.Put(state.initial_loss);
  out.Put(state.retries);
  out.Put(state.resumes);
  out.PutFloats(state.params);
  out.Put(static_cast<int64_t>(state.exp_avg.size()));
  for (size_t i = 0; i < state.exp_avg.size(); ++i) {
    out.PutFloats(state.exp_avg[i]);
    out.PutFloats(state.exp_avg_sq[i]);
  }
  const std::string tmp = path + ".tmp";
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open", tmp);
  const std::string& data = out.data();
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const absl::Status failed = Errno("write", tmp);
      close(fd);
      return failed;
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    const absl::Status failed = Errno("fsync", tmp);
    close(fd);
    return failed;
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) return Errno("rename", tmp);
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return Errno("open", dir);
  const bool synced = fsync(dir_fd) == 0;
  close(dir_fd);
  return synced ? absl::OkStatus() : Errno("fsync", dir);
}

absl::StatusOr<std::optional<TrainerState>> LoadTrainerState(
    const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    if (access(path.c_str(), F_OK) != 0 && errno == ENOENT) {
      return std::nullopt;
    }
    return Errno("open", path);
  }
  Bytes in(std::string(std::istreambuf_iterator<char>(file), {}));
  char magic[sizeof(kMagic)];
  TrainerState state;
  int64_t tensors = 0;
  bool ok = in.Get(&magic) && std::memcmp(magic, kMagic, sizeof(kMagic)) == 0 &&
            in.Get(&state.step) && in.Get(&state.adamw_steps) &&
            in.Get(&state.initial_loss) && in.Get(&state.retries) &&
            in.Get(&state.resumes) && in.GetFloats(&state.params) &&
            in.Get(&tensors) && tensors >= 0 && tensors < (1 << 20);
  if (ok) {
    state.exp_avg.resize(tensors);
    state.exp_avg_sq.resize(tensors);
  }
  for (int64_t i = 0; ok && i < tensors; ++i) {
    ok = in.GetFloats(&state.exp_avg[i]) && in.GetFloats(&state.exp_avg_sq[i]);
  }
  if (!ok || !in.done()) {
    return absl::DataLossError(
        absl::StrCat(path,
                     " is not a whole trainer state (its magic, sizes "
                     "or length are wrong)"));
  }
  return state;
}

}  // namespace example
}  // namespace muonps
