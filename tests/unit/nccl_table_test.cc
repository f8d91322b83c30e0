// The NCCL room (src/transport/nccl) without NCCL: a recording table stands
// in for the library, so the test runs in every build. It pins down that
// DeviceComm calls exactly the entry it names with NCCL's type and op codes,
// that an NCCL failure becomes the Status the table promises (described
// once, naming the call), and that a library that cannot be loaded is
// kUnsupported with a message instead of a crash.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <link.h>

#include <cstdio>
#include <cstdlib>

#include <string>
#include <vector>

#include "src/common/status.h"
#include "src/transport/nccl/device_comm.h"
#include "src/transport/nccl/nccl_table.h"

namespace squall::transport::nccl {
namespace {

struct Call {
  std::string name;
  size_t count = 0;
  int type = -1;
  int op = -1;
  int peer = -1;
  void* stream = nullptr;
};

std::vector<Call> gCalls;
int gNextResult = nccl_abi::kSuccess;
int gRank = 1;
int gSize = 3;

int record(const Call& c) {
  gCalls.push_back(c);
  const int r = gNextResult;
  gNextResult = nccl_abi::kSuccess;
  return r;
}

constexpr Table kFake = {
    [](int result) { return result == nccl_abi::kRemoteError ? "remote process exited" : "fake"; },
    [](void*, int* count) -> int {
      *count = gSize;
      return nccl_abi::kSuccess;
    },
    [](void*, int* rank) -> int {
      *rank = gRank;
      return nccl_abi::kSuccess;
    },
    [](void*) { return record({"abort"}); },
    [] { return record({"groupStart"}); },
    [] { return record({"groupEnd"}); },
    [](const void*, size_t n, int t, int peer, void*, void* s) {
      return record({"send", n, t, -1, peer, s});
    },
    [](void*, size_t n, int t, int peer, void*, void* s) {
      return record({"recv", n, t, -1, peer, s});
    },
    [](const void*, void*, size_t n, int t, void*, void* s) {
      return record({"allGather", n, t, -1, -1, s});
    },
    [](const void*, void*, size_t n, int t, int op, void*, void* s) {
      return record({"allReduce", n, t, op, -1, s});
    },
    [](const void*, void*, size_t n, int t, int root, void*, void* s) {
      return record({"broadcast", n, t, -1, root, s});
    },
    "fake NCCL",
    nullptr,  // getVersion
    nullptr,  // no ncclCommGetAsyncError: an in-progress call is a failure
};

// A non-blocking communicator: ncclCommGetAsyncError says ncclInProgress
// gPolls more times, then gAsyncResult.
int gPolls = 0;
int gAsyncQueries = 0;
int gAsyncResult = nccl_abi::kSuccess;
constexpr Table kNonBlocking = [] {
  Table t = kFake;
  t.commGetAsyncError = [](void*, int* state) {
    ++gAsyncQueries;
    *state = gPolls-- > 0 ? nccl_abi::kInProgress : gAsyncResult;
    return static_cast<int>(nccl_abi::kSuccess);
  };
  return t;
}();

int gDummyComm;
void* const kComm = &gDummyComm;
void* const kStream = reinterpret_cast<void*>(0x5);

class NcclTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    gCalls.clear();
    gNextResult = nccl_abi::kSuccess;
    gRank = 1;
    gSize = 3;
    gPolls = 0;
    gAsyncQueries = 0;
    gAsyncResult = nccl_abi::kSuccess;
  }
};

TEST_F(NcclTableTest, WrapQueriesRankAndSize) {
  DeviceComm comm;
  ASSERT_EQ(DeviceComm::wrap(kFake, kComm, &comm), Status::kOk) << lastError();
  EXPECT_EQ(comm.rank(), 1);
  EXPECT_EQ(comm.size(), 3);
  EXPECT_EQ(comm.handle(), kComm);
  EXPECT_EQ(&comm.table(), &kFake);
}

TEST_F(NcclTableTest, WrapRefusesNullAndImpossibleRanks) {
  DeviceComm comm;
  EXPECT_EQ(DeviceComm::wrap(kFake, nullptr, &comm), Status::kInvalidArgument);
  gRank = 3;  // of 3
  EXPECT_EQ(DeviceComm::wrap(kFake, kComm, &comm), Status::kInvalidArgument);
  EXPECT_NE(lastError().find("rank 3 of 3"), std::string::npos) << lastError();
}

TEST_F(NcclTableTest, CallsCarryNcclCodes) {
  DeviceComm comm;
  ASSERT_EQ(DeviceComm::wrap(kFake, kComm, &comm), Status::kOk);
  int buf[4] = {};
  ASSERT_EQ(comm.groupStart(), Status::kOk);
  ASSERT_EQ(comm.send(buf, 16, 2, kStream), Status::kOk);
  ASSERT_EQ(comm.recv(buf, 12, 0, kStream), Status::kOk);
  ASSERT_EQ(comm.groupEnd(), Status::kOk);
  ASSERT_EQ(comm.allGather(buf, buf, 4, kStream), Status::kOk);
  ASSERT_EQ(comm.allReduceSum(buf, buf, 4, DataType::kF32, kStream), Status::kOk);
  ASSERT_EQ(comm.allReduceSum(buf, buf, 2, DataType::kBf16, kStream), Status::kOk);
  ASSERT_EQ(comm.broadcast(buf, buf, 1, DataType::kI64, 2, kStream), Status::kOk);
  ASSERT_EQ(comm.abort(), Status::kOk);
  ASSERT_EQ(gCalls.size(), 9u);
  EXPECT_EQ(gCalls[0].name, "groupStart");
  EXPECT_EQ(gCalls[1].name, "send");
  EXPECT_EQ(gCalls[1].count, 16u);
  EXPECT_EQ(gCalls[1].type, 1);  // ncclUint8: bytes
  EXPECT_EQ(gCalls[1].peer, 2);
  EXPECT_EQ(gCalls[1].stream, kStream);
  EXPECT_EQ(gCalls[2].name, "recv");
  EXPECT_EQ(gCalls[2].peer, 0);
  EXPECT_EQ(gCalls[3].name, "groupEnd");
  EXPECT_EQ(gCalls[4].name, "allGather");
  EXPECT_EQ(gCalls[4].type, 1);
  EXPECT_EQ(gCalls[5].type, 7);  // ncclFloat32
  EXPECT_EQ(gCalls[5].op, 0);    // ncclSum
  EXPECT_EQ(gCalls[6].type, 9);  // ncclBfloat16
  EXPECT_EQ(gCalls[7].name, "broadcast");
  EXPECT_EQ(gCalls[7].type, 4);  // ncclInt64
  EXPECT_EQ(gCalls[7].peer, 2);  // root
  EXPECT_EQ(gCalls[8].name, "abort");
}

TEST_F(NcclTableTest, BroadcastRefusesARootOutsideTheCommunicator) {
  DeviceComm comm;
  ASSERT_EQ(DeviceComm::wrap(kFake, kComm, &comm), Status::kOk);
  float x = 0;
  EXPECT_EQ(comm.broadcast(&x, &x, 1, DataType::kF32, 3, kStream), Status::kInvalidArgument);
  EXPECT_TRUE(gCalls.empty());
}

TEST_F(NcclTableTest, FailuresBecomeStatusesNamingTheCall) {
  DeviceComm comm;
  ASSERT_EQ(DeviceComm::wrap(kFake, kComm, &comm), Status::kOk);
  char b[8];
  const struct {
    int nccl;
    Status status;
  } cases[] = {{nccl_abi::kUnhandledCudaError, Status::kSystemError},
               {nccl_abi::kSystemError, Status::kSystemError},
               {nccl_abi::kInternalError, Status::kInternal},
               {nccl_abi::kInvalidArgument, Status::kInvalidArgument},
               {nccl_abi::kInvalidUsage, Status::kInvalidUsage},
               {nccl_abi::kRemoteError, Status::kRemoteError},
               {nccl_abi::kInProgress, Status::kInProgress},
               {42, Status::kInternal}};
  for (const auto& c : cases) {
    gNextResult = c.nccl;
    clearLastError();
    EXPECT_EQ(comm.send(b, 8, 0, kStream), c.status) << c.nccl;
    EXPECT_NE(lastError().find("ncclSend"), std::string::npos) << lastError();
    EXPECT_NE(lastError().find("fake NCCL"), std::string::npos) << lastError();
  }
  gNextResult = nccl_abi::kRemoteError;
  EXPECT_EQ(comm.allGather(b, b, 1, kStream), Status::kRemoteError);
  EXPECT_NE(lastError().find("remote process exited"), std::string::npos) << lastError();
}

// NCCL finishes a non-blocking communicator's call in the background and
// wants the next call to wait for it: the call returns what NCCL finally
// says, never "in progress".
TEST_F(NcclTableTest, AnInProgressCallWaitsUntilNcclHasFinishedIt) {
  DeviceComm comm;
  ASSERT_EQ(DeviceComm::wrap(kNonBlocking, kComm, &comm), Status::kOk);
  gNextResult = nccl_abi::kInProgress;
  gPolls = 3;
  EXPECT_EQ(comm.groupEnd(), Status::kOk) << lastError();
  EXPECT_EQ(gAsyncQueries, 4);
  // A call that fails in the background fails, naming the call.
  char b[8];
  gNextResult = nccl_abi::kInProgress;
  gPolls = 1;
  gAsyncResult = nccl_abi::kRemoteError;
  clearLastError();
  EXPECT_EQ(comm.send(b, 8, 0, kStream), Status::kRemoteError);
  EXPECT_NE(lastError().find("ncclSend"), std::string::npos) << lastError();
  // A call that did not say "in progress" asks nothing.
  gAsyncQueries = 0;
  EXPECT_EQ(comm.allGather(b, b, 1, kStream), Status::kOk);
  EXPECT_EQ(gAsyncQueries, 0);
}

TEST_F(NcclTableTest, InstalledTableIsTheActiveOne) {
  installTable(&kFake);
  const Table* t = nullptr;
  ASSERT_EQ(ncclTable(&t), Status::kOk);
  EXPECT_EQ(t, &kFake);
  DeviceComm comm;
  ASSERT_EQ(DeviceComm::wrap(kComm, &comm), Status::kOk);
  EXPECT_EQ(&comm.table(), &kFake);
  installTable(nullptr);
}

TEST_F(NcclTableTest, AMissingLibraryIsUnsupported) {
  Table t{};
  EXPECT_EQ(loadTable("libsquall-no-such-nccl.so.2", &t), Status::kUnsupported);
  EXPECT_NE(lastError().find("SQUALL_NCCL_LIBRARY"), std::string::npos) << lastError();
  // A library that loads but is not NCCL names the first entry it lacks.
  EXPECT_EQ(loadTable("libm.so.6", &t), Status::kUnsupported);
  EXPECT_NE(lastError().find("ncclGetErrorString"), std::string::npos) << lastError();
}

// The NCCL to check against: SQUALL_TEST_NCCL_LIBRARY (meson sets the
// toolkit's; scripts/pypi_torch.sh the nvidia-nccl-cu13 wheel's), else the
// soname. SQUALL_TEST_NCCL_VERSION, when set, is the version it must report.
std::string realLibrary() {
  const char* path = std::getenv("SQUALL_TEST_NCCL_LIBRARY");
  return path != nullptr && *path != '\0' ? path : "libnccl.so.2";
}

void expectVersion(const Table& t) {
  ASSERT_NE(t.getVersion, nullptr) << "ncclGetVersion is not resolved";
  int version = 0;
  ASSERT_EQ(t.getVersion(&version), nccl_abi::kSuccess);
  const char* want = std::getenv("SQUALL_TEST_NCCL_VERSION");
  const std::string got = std::to_string(version / 10000) + "." +
                          std::to_string(version / 100 % 100) + "." + std::to_string(version % 100);
  if (want != nullptr && *want != '\0') {
    EXPECT_EQ(got, want);
  }
  std::printf("NCCL %s from %s\n", got.c_str(), t.origin);
}

TEST_F(NcclTableTest, TheRealLibraryResolvesEveryEntry) {
  Table t{};
  const std::string path = realLibrary();
  if (loadTable(path.c_str(), &t) != Status::kOk) {
    GTEST_SKIP() << "no NCCL on this machine: " << lastError();
  }
  for (const void* entry :
       {reinterpret_cast<const void*>(t.getErrorString), reinterpret_cast<const void*>(t.commCount),
        reinterpret_cast<const void*>(t.commUserRank), reinterpret_cast<const void*>(t.commAbort),
        reinterpret_cast<const void*>(t.groupStart), reinterpret_cast<const void*>(t.groupEnd),
        reinterpret_cast<const void*>(t.send), reinterpret_cast<const void*>(t.recv),
        reinterpret_cast<const void*>(t.allGather), reinterpret_cast<const void*>(t.allReduce),
        reinterpret_cast<const void*>(t.broadcast)}) {
    EXPECT_NE(entry, nullptr);
  }
  EXPECT_NE(t.commGetAsyncError, nullptr);  // optional, but NCCL has had it since 2.4
  EXPECT_STREQ(t.getErrorString(nccl_abi::kSuccess), "no error");
  expectVersion(t);
}

// Run alone (its own meson test): the process-wide table is resolved once.
// A process that has an NCCL already (torch's) gets that copy, even where
// SQUALL_NCCL_LIBRARY names a library that does not exist.
TEST(NcclTableResolution, TheLoadedCopyComesFirst) {
  const std::string path = realLibrary();
  void* loaded = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (loaded == nullptr) GTEST_SKIP() << "no NCCL on this machine: " << dlerror();
  ASSERT_EQ(setenv("SQUALL_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1), 0);
  const Table* t = nullptr;
  ASSERT_EQ(ncclTable(&t), Status::kOk) << lastError();
  // The file the test loaded (a soname names none itself).
  struct link_map* map = nullptr;
  ASSERT_EQ(dlinfo(loaded, RTLD_DI_LINKMAP, &map), 0);
  char resolved[PATH_MAX];
  ASSERT_NE(realpath(map->l_name, resolved), nullptr) << map->l_name;
  char origin[PATH_MAX];
  ASSERT_NE(realpath(t->origin, origin), nullptr) << t->origin;
  EXPECT_STREQ(origin, resolved);
  expectVersion(*t);
}

}  // namespace
}  // namespace squall::transport::nccl
