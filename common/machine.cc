#include "common/machine.h"

#include <unistd.h>

#include <fstream>
#include <string>

namespace muonps {

std::string MachineIdentity() {
  std::string id;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  if (std::getline(boot, id) && !id.empty()) return id;
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace muonps
