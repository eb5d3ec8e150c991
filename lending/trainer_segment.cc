#include "lending/trainer_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace muonps {
namespace {

constexpr absl::string_view kPrefix = "muonps-";

bool AllDigits(absl::string_view text, size_t max_digits) {
  if (text.empty() || text.size() > max_digits) return false;
  for (const char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// The pid of "...-PID-TOKEN" (the end of every trainer segment's name), or
// 0 when `name` does not end so.
int64_t CreatorPid(absl::string_view name) {
  const size_t token_dash = name.rfind('-');
  if (token_dash == absl::string_view::npos || token_dash == 0) return 0;
  const size_t pid_dash = name.rfind('-', token_dash - 1);
  if (pid_dash == absl::string_view::npos) return 0;
  const absl::string_view pid =
      name.substr(pid_dash + 1, token_dash - pid_dash - 1);
  int64_t value = 0;
  if (!AllDigits(name.substr(token_dash + 1), 10) || !AllDigits(pid, 10) ||
      !absl::SimpleAtoi(pid, &value)) {
    return 0;
  }
  return value;
}

}  // namespace

std::string TrainerSegmentName(const std::string& job, int rank, int64_t pid,
                               uint32_t token) {
  return absl::StrCat("/", kPrefix, job, "-r", rank, "-", pid, "-", token);
}

absl::Status CheckTrainerSegmentName(const std::string& name,
                                     const std::string& job, int rank,
                                     int64_t pid) {
  const std::string prefix = absl::StrCat("/", kPrefix, job, "-r", rank, "-");
  const std::string form =
      absl::StrCat(prefix, pid != 0 ? absl::StrCat(pid) : "PID", "-TOKEN");
  absl::string_view rest = name;
  if (!absl::ConsumePrefix(&rest, prefix)) {
    return InvalidField("segment",
                        absl::StrCat(Quoted(name), " is not named for job ",
                                     Quoted(job), " and trainer rank ", rank,
                                     " (expected ", Quoted(form), ")"));
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(rest, '-');
  if (parts.size() != 2 || !AllDigits(parts[0], 10) ||
      !AllDigits(parts[1], 10) || (pid != 0 && parts[0] != absl::StrCat(pid))) {
    return InvalidField(
        "segment",
        absl::StrCat(Quoted(name), " is not of the form ", Quoted(form),
                     " (the trainer's pid and "
                     "a random number)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> RemoveStaleTrainerSegments(const std::string& shm_dir,
                                               const std::string& job,
                                               uid_t uid) {
  // The job's names: "muonps-JOB-r..." (kPrefix is "muonps-").
  const std::string job_prefix = absl::StrCat(kPrefix, job, "-r");
  DIR* dir = opendir(shm_dir.c_str());
  if (dir == nullptr) {
    return absl::InternalError(
        absl::StrCat("opendir(", Quoted(shm_dir), "): ", std::strerror(errno)));
  }
  std::vector<std::string> stale;
  while (const dirent* entry = readdir(dir)) {
    const absl::string_view name = entry->d_name;
    if (!absl::StartsWith(name, job_prefix)) continue;
    struct stat info;
    if (fstatat(dirfd(dir), entry->d_name, &info, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(info.st_mode) || info.st_uid != uid) {
      continue;
    }
    const int64_t pid = CreatorPid(name);
    // ESRCH only: EPERM means a live process of another user.
    if (pid > 0 && pid <= INT32_MAX && kill(static_cast<pid_t>(pid), 0) != 0 &&
        errno == ESRCH) {
      stale.emplace_back(name);
    }
  }
  const int dir_fd = dirfd(dir);
  int removed = 0;
  for (const std::string& name : stale) {
    if (unlinkat(dir_fd, name.c_str(), 0) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

}  // namespace muonps
