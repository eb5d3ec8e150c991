// CPU time accounting from /proc, to tell how much of a run's machine time
// went to processes outside the bench (other users of a shared host), which
// would make its timings meaningless. Linux only; thread-safe.
#ifndef MUONPS_BENCH_STEP_CPU_HOST_CPU_H_
#define MUONPS_BENCH_STEP_CPU_HOST_CPU_H_

#include <sys/types.h>

#include <vector>

namespace muonps {
namespace bench {

// Seconds all CPUs of the host spent busy (user, nice, system, irq,
// softirq, steal) since boot; 0 if /proc/stat cannot be read.
double HostBusySeconds();

// User plus system seconds process `pid` has used; 0 if it is gone.
double ProcessCpuSeconds(pid_t pid);

// A window over which the host's busy time is split into the bench's
// (this process and `children`) and everyone else's.
class ForeignCpuWindow {
 public:
  // Opens the window now.
  ForeignCpuWindow();

  // The share of the host's core-seconds since the window opened that
  // processes other than this one and `children` used, in [0, 1]. Children
  // must have started inside the window and still be running.
  double ForeignFraction(const std::vector<pid_t>& children) const;

 private:
  double start_wall_;
  double start_host_busy_;
  double start_self_;
};

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_STEP_CPU_HOST_CPU_H_
