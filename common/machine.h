// Which machine this process runs on, as every process of the machine
// (containers included) sees it.
#ifndef MUONPS_COMMON_MACHINE_H_
#define MUONPS_COMMON_MACHINE_H_

#include <string>

namespace muonps {

// The kernel's boot id (/proc/sys/kernel/random/boot_id: one per machine
// and boot, the same in every container of the machine); the host name
// where there is none.
std::string MachineIdentity();

}  // namespace muonps

#endif  // MUONPS_COMMON_MACHINE_H_
