// What the cost table's {"device": ...} line says for the CPU backend: the
// processor's model name, with the OpenBLAS thread count the measurements
// ran with. Linux (/proc/cpuinfo); thread-safe.
#ifndef MUONPS_TOOLS_AUTOTUNE_CPU_DESCRIPTION_H_
#define MUONPS_TOOLS_AUTOTUNE_CPU_DESCRIPTION_H_

#include <string>

namespace muonps {
namespace autotune {

// The first "model name" of /proc/cpuinfo ("cpu" when there is none), with
// " (N threads)" appended when `threads` > 0.
std::string CpuDescription(int threads);

}  // namespace autotune
}  // namespace muonps

#endif  // MUONPS_TOOLS_AUTOTUNE_CPU_DESCRIPTION_H_
