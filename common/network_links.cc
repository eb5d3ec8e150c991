#include "common/network_links.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

namespace muonps {
namespace {

namespace fs = std::filesystem;

// The first line of `path`; "" when it cannot be read.
std::string FirstLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return line;
}

// The leading number of `text` ("400 Gb/sec (4X NDR)" -> 400); 0 for none.
double LeadingNumber(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  return end == begin || !(value > 0) ? 0 : value;
}

// The entries of directory `dir`; none when it cannot be read.
std::vector<fs::path> Entries(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end;
       it.increment(error)) {
    out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

double HostNetworkGbs(const std::string& sysfs) {
  const fs::path root(sysfs);
  double rdma_gbits = 0;
  for (const fs::path& device : Entries(root / "class" / "infiniband")) {
    for (const fs::path& port : Entries(device / "ports")) {
      if (FirstLine(port / "state").find("ACTIVE") == std::string::npos) {
        continue;
      }
      rdma_gbits += LeadingNumber(FirstLine(port / "rate"));
    }
  }
  if (rdma_gbits > 0) return rdma_gbits / 8;
  double ethernet_mbits = 0;
  for (const fs::path& interface : Entries(root / "class" / "net")) {
    std::error_code error;
    if (!fs::exists(interface / "device", error)) continue;  // virtual
    if (FirstLine(interface / "operstate") != "up") continue;
    ethernet_mbits =
        std::max(ethernet_mbits, LeadingNumber(FirstLine(interface / "speed")));
  }
  return ethernet_mbits / 8000;
}

}  // namespace muonps
