#include "bench/step_cpu/host_cpu.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace bench {
namespace {

double WallSeconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double TicksPerSecond() { return static_cast<double>(sysconf(_SC_CLK_TCK)); }

}  // namespace

double HostBusySeconds() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  // user nice system idle iowait irq softirq steal
  double v[8] = {};
  if (!(in >> cpu) || cpu != "cpu") return 0;
  for (double& x : v) in >> x;
  return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / TicksPerSecond();
}

double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(in, line)) return 0;
  // The command name (field 2) may hold spaces: fields resume after ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(line.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  // Fields 3..13 precede utime (14) and stime (15).
  for (int i = 3; i <= 13; ++i) fields >> field;
  fields >> utime >> stime;
  return (utime + stime) / TicksPerSecond();
}

ForeignCpuWindow::ForeignCpuWindow()
    : start_wall_(WallSeconds()),
      start_host_busy_(HostBusySeconds()),
      start_self_(ProcessCpuSeconds(getpid())) {}

double ForeignCpuWindow::ForeignFraction(
    const std::vector<pid_t>& children) const {
  const double host = HostBusySeconds() - start_host_busy_;
  double ours = ProcessCpuSeconds(getpid()) - start_self_;
  for (pid_t pid : children) ours += ProcessCpuSeconds(pid);
  const double capacity = (WallSeconds() - start_wall_) *
                          std::max(1u, std::thread::hardware_concurrency());
  if (capacity <= 0) return 0;
  return std::clamp((host - ours) / capacity, 0.0, 1.0);
}

}  // namespace bench
}  // namespace muonps
