// Net devices: the IPv4 interfaces the TCP data plane can use.
//
// SQUALL_SOCKET_IFNAME, else NCCL_SOCKET_IFNAME, selects them with NCCL's
// syntax: a comma-separated list of name prefixes, "=name" for an exact
// name, a leading "^" to exclude instead. Without a selection every up,
// non-loopback IPv4 interface but container and VM bridges (docker*,
// virbr*) is a device; those only when nothing else exists, and loopback
// only when named or when nothing else exists. Interfaces behind an RDMA NIC (found through
// libibverbs, loaded with dlopen so the plugin loads without it) are listed
// first, since they are the fast ones; the data still moves over TCP.
// The speed comes from /sys/class/net/<if>/speed; where the kernel reports
// none (loopback, some virtual NICs) the device says 10000 Mbit/s, the value
// NCCL itself assumes, and the log says it is a fallback.
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <climits>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <set>
#include <vector>

#include "plugin/nccl/devices.h"
#include "src/bootstrap/socket.h"
#include "src/common/params.h"

namespace squall::nccl_plugin {
namespace {

constexpr int kFallbackSpeedMbps = 10000;

struct Selection {
  bool exclude = false;
  bool exact = false;
  std::vector<std::string> names;
  bool empty() const { return names.empty(); }
  bool matches(const std::string& name) const {
    bool hit = false;
    for (const std::string& n : names)
      hit = hit || (exact ? name == n : name.compare(0, n.size(), n) == 0);
    return exclude ? !hit : hit;
  }
  bool namesLoopback() const {
    if (exclude) return false;
    for (const std::string& n : names)
      if (std::string("lo").compare(0, n.size(), n) == 0 && !n.empty()) return true;
    return false;
  }
};

Selection parseSelection(std::string text) {
  Selection s;
  if (!text.empty() && text[0] == '^') {
    s.exclude = true;
    text.erase(0, 1);
  }
  if (!text.empty() && text[0] == '=') {
    s.exact = true;
    text.erase(0, 1);
  }
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) s.names.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return s;
}

int readSpeed(const std::string& ifname, bool* measured) {
  std::ifstream in("/sys/class/net/" + ifname + "/speed");
  long speed = 0;
  *measured = static_cast<bool>(in >> speed) && speed > 0 && speed < INT_MAX;
  return *measured ? static_cast<int>(speed) : kFallbackSpeedMbps;
}

std::string readPciPath(const std::string& ifname) {
  std::string link = "/sys/class/net/" + ifname + "/device";
  char resolved[PATH_MAX];
  if (realpath(link.c_str(), resolved) == nullptr) return "";
  std::string path = resolved;
  // Only a PCI function places the NIC in NCCL's topology; anything else
  // (virtio on a platform bus, USB) would mislead it.
  return path.find("/pci") != std::string::npos ? path : "";
}

// Interfaces that carry an RDMA device, through libibverbs when it is present.
std::set<std::string> rdmaInterfaces(std::vector<std::string>* rdmaNames) {
  std::set<std::string> out;
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return out;
  using GetList = void** (*)(int*);
  using FreeList = void (*)(void**);
  using GetName = const char* (*)(void*);
  auto getList = reinterpret_cast<GetList>(dlsym(lib, "ibv_get_device_list"));
  auto freeList = reinterpret_cast<FreeList>(dlsym(lib, "ibv_free_device_list"));
  auto getName = reinterpret_cast<GetName>(dlsym(lib, "ibv_get_device_name"));
  if (getList != nullptr && freeList != nullptr && getName != nullptr) {
    int count = 0;
    void** list = getList(&count);
    for (int i = 0; list != nullptr && i < count; ++i) {
      const char* name = getName(list[i]);
      if (name == nullptr) continue;
      rdmaNames->push_back(name);
      std::string netDir = std::string("/sys/class/infiniband/") + name + "/device/net";
      // The netdevs of the RDMA device's PCI function.
      if (DIR* dir = opendir(netDir.c_str())) {
        while (dirent* e = readdir(dir))
          if (e->d_name[0] != '.') out.insert(e->d_name);
        closedir(dir);
      }
    }
    if (list != nullptr) freeList(list);
  }
  dlclose(lib);
  return out;
}

struct Registry {
  std::once_flag once;
  std::vector<Device> devices;
};
Registry& registry() {
  static Registry r;
  return r;
}

void discover(std::vector<Device>* out) {
  std::string text = paramString(Param::kSocketIfname);
  const char* source = "SQUALL_SOCKET_IFNAME";
  if (text.empty()) {
    const char* nccl = getenv("NCCL_SOCKET_IFNAME");
    text = nccl != nullptr ? nccl : "";
    source = "NCCL_SOCKET_IFNAME";
  }
  Selection selection = parseSelection(text);
  std::vector<std::string> rdmaNames;
  std::set<std::string> rdma = rdmaInterfaces(&rdmaNames);

  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    SQUALL_WARN(Subsys::kTransport, "NET/Squall: getifaddrs failed: %s", strerror(errno));
    return;
  }
  std::vector<Device> found;
  std::vector<Device> loopback;
  std::vector<Device> bridges;  // docker*, virbr*: only when nothing else is up
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_UP) == 0) continue;
    std::string name = a->ifa_name;
    bool isLoop = (a->ifa_flags & IFF_LOOPBACK) != 0;
    if (!selection.empty() && !selection.matches(name)) continue;
    bool duplicate = false;
    for (const Device& d : found) duplicate = duplicate || d.info.name == name;
    for (const Device& d : loopback) duplicate = duplicate || d.info.name == name;
    for (const Device& d : bridges) duplicate = duplicate || d.info.name == name;
    if (duplicate) continue;  // one device per interface: its first IPv4 address
    Device d;
    d.info.name = name;
    d.info.pciPath = readPciPath(name);
    d.info.speedMbps = readSpeed(name, &d.info.speedMeasured);
    std::memcpy(&d.address.storage, a->ifa_addr, sizeof(sockaddr_in));
    d.address.length = sizeof(sockaddr_in);
    char text4[INET_ADDRSTRLEN] = "";
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text4,
              sizeof(text4));
    d.info.address = text4;
    d.rdma = rdma.count(name) != 0;
    const bool bridge = selection.empty() && bootstrap::isLocalBridge(name.c_str());
    (isLoop ? loopback : bridge ? bridges : found).push_back(std::move(d));
  }
  freeifaddrs(list);
  // Without a selection, as NCCL's own default ("^docker,lo,virbr"): a
  // container or VM bridge has the same address on every host, so offering
  // it makes a peer connect to its own bridge. Used only when it is all
  // there is (one host), like loopback.
  if (found.empty())
    for (Device& d : bridges) found.push_back(std::move(d));
  // Loopback only when asked for by name, or when it is all there is.
  if (found.empty() || selection.namesLoopback())
    for (Device& d : loopback) found.push_back(std::move(d));
  std::stable_sort(found.begin(), found.end(),
                   [](const Device& a, const Device& b) { return a.rdma && !b.rdma; });
  if (found.empty()) {
    SQUALL_WARN(Subsys::kTransport,
                "NET/Squall: no IPv4 interface matches %s=\"%s\"; the plugin offers no device "
                "and NCCL will use another network",
                source, text.c_str());
  }
  for (const std::string& n : rdmaNames)
    SQUALL_INFO(Subsys::kTransport, "NET/Squall: RDMA device %s found (data moves over TCP)",
                n.c_str());
  *out = std::move(found);
}

}  // namespace

const std::vector<Device>& devices() {
  Registry& r = registry();
  std::call_once(r.once, [&r] { discover(&r.devices); });
  return r.devices;
}

std::string describeDevices() {
  std::string text;
  int i = 0;
  for (const Device& d : devices()) {
    char line[256];
    snprintf(line, sizeof(line), "%s[%d]%s:%s %d Mbit/s%s%s%s", text.empty() ? "" : " ", i++,
             d.info.name.c_str(), d.info.address.c_str(), d.info.speedMbps,
             d.info.speedMeasured ? "" : " (assumed)", d.info.pciPath.empty() ? "" : " pci ",
             d.info.pciPath.c_str());
    text += line;
  }
  return text;
}

}  // namespace squall::nccl_plugin
