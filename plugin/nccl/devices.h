// The device list behind netDevices()/netDevice(): discovered once per load
// of the library (see devices.cc for the rules).
#pragma once

#include <string>
#include <vector>

#include "plugin/nccl/net.h"
#include "src/bootstrap/socket.h"

namespace squall::nccl_plugin {

struct Device {
  DeviceInfo info;
  bootstrap::SocketAddress address;  // the interface's IPv4 address, port 0
  bool rdma = false;                 // the interface belongs to an RDMA NIC
};

const std::vector<Device>& devices();
// One line for the init log: "[0]eth0:10.0.0.1 10000 Mbit/s pci /sys/...".
std::string describeDevices();

}  // namespace squall::nccl_plugin
