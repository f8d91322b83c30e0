// SQUALL_SOCKET_IFNAME restricts UCX too: with SQUALL_SOCKET_IFNAME=lo and no
// UCX_NET_DEVICES, a UCX communicator listens on loopback only. And where UCX
// loads, it is what the default transport picks (ucx_missing_test.cc covers a
// host without it).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "squall/squall.h"

namespace {

// Socket inodes this process holds.
std::set<std::string> ownSocketInodes() {
  std::set<std::string> inodes;
  for (int fd = 0; fd < 4096; ++fd) {
    char link[64], target[128];
    std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    if (std::strncmp(target, "socket:[", 8) == 0)
      inodes.insert(std::string(target + 8, std::strlen(target + 8) - 1));
  }
  return inodes;
}

// Local addresses (hex, as /proc/net/tcp* writes them) of this process's listening sockets.
std::vector<std::string> listeningAddresses() {
  const std::set<std::string> mine = ownSocketInodes();
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >>
          inode;
      if (state == "0A" && mine.count(inode) != 0) out.push_back(local);  // 0A: LISTEN
    }
  }
  return out;
}

bool isLoopback(const std::string& hexAddress) {
  const std::string ip = hexAddress.substr(0, hexAddress.find(':'));
  if (ip.size() == 8) return ip.substr(6, 2) == "7F";  // 127.x.x.x, little-endian
  return ip == "00000000000000000000000001000000" ||   // ::1
         (ip.rfind("0000000000000000FFFF0000", 0) == 0 && ip.substr(30, 2) == "7F");
}

TEST(UcxIfname, ListensOnTheNamedInterfaceOnly) {
  squallUniqueId id;
  ASSERT_EQ(squallGetUniqueId(&id), squallSuccess) << squallGetLastError();
  squallComm_t comms[2] = {nullptr, nullptr};
  std::thread threads[2];
  for (int r = 0; r < 2; ++r)
    threads[r] = std::thread([&, r] {
      squallConfig_t c = SQUALL_CONFIG_INIT;
      c.transport = squallTransportUcx;
      c.timeoutSeconds = 20;
      EXPECT_EQ(squallCommInitRank(&comms[r], 2, id, r, &c), squallSuccess) << squallGetLastError();
    });
  for (auto& t : threads) t.join();
  ASSERT_TRUE(comms[0] != nullptr && comms[1] != nullptr);
  const std::vector<std::string> listening = listeningAddresses();
  for (const std::string& address : listening)
    EXPECT_TRUE(isLoopback(address)) << "a socket listens on " << address << " (/proc/net/tcp)";
  for (squallComm_t c : comms) squallCommDestroy(c);
}

TEST(UcxDefault, TheDefaultTransportIsUcxWhereItLoads) {
  squallUniqueId id;
  ASSERT_EQ(squallGetUniqueId(&id), squallSuccess) << squallGetLastError();
  squallComm_t comms[2] = {nullptr, nullptr};
  std::thread threads[2];
  for (int r = 0; r < 2; ++r)
    threads[r] = std::thread([&, r] {
      squallConfig_t c = SQUALL_CONFIG_INIT;
      c.timeoutSeconds = 20;
      EXPECT_EQ(squallCommInitRank(&comms[r], 2, id, r, &c), squallSuccess) << squallGetLastError();
    });
  for (auto& t : threads) t.join();
  ASSERT_TRUE(comms[0] != nullptr && comms[1] != nullptr);
  for (squallComm_t c : comms) {
    const char* name = nullptr;
    EXPECT_EQ(squallCommTransport(c, &name), squallSuccess);
    EXPECT_STREQ(name, "ucx");
  }
  for (squallComm_t c : comms) squallCommDestroy(c);
}

}  // namespace

int main(int argc, char** argv) {
  setenv("SQUALL_SOCKET_IFNAME", "lo", 1);
  unsetenv("UCX_NET_DEVICES");
  unsetenv("SQUALL_TRANSPORT");
  unsetenv("SQUALL_UCX_LIBRARY");
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
