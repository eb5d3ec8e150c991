// How fast this host reaches other hosts: its network ports' bandwidth, as
// the kernel describes them in sysfs. A worker reports its share at join
// (v1::Device.network_gbs), and plans across nodes weigh it.
#ifndef MUONPS_COMMON_NETWORK_LINKS_H_
#define MUONPS_COMMON_NETWORK_LINKS_H_

#include <string>

namespace muonps {

// GB/s per direction of this host's ports to other hosts, read under
// `sysfs` ("/sys" on a live system): the sum of the rates of the
// InfiniBand and RoCE ports whose state is ACTIVE
// (class/infiniband/<device>/ports/<n>/{state,rate}, "4: ACTIVE" and "400
// Gb/sec (4X NDR)"); where there is none, the fastest physical Ethernet
// interface that is up (class/net/<interface>/{operstate,speed} of those
// with a `device` link, speed in Mb/s). 0 when neither is found or
// readable. Gb/s count as 1/8 GB/s.
double HostNetworkGbs(const std::string& sysfs);

}  // namespace muonps

#endif  // MUONPS_COMMON_NETWORK_LINKS_H_
