// What NCCL sees: the exported net and CollNet tables, v8 to v12, each a set
// of thin adapters over the one implementation in net.cc / collnet.cc.
// Adapters only convert argument shapes (int and size_t sizes, a context
// argument or not, SGE lists); the Status of the implementation becomes an
// ncclResult_t in exactly one place, toNccl(), and no C++ exception crosses
// into NCCL. Squall's log lines go to NCCL's logger once NCCL hands us one.
#include <cstdarg>
#include <cstdio>
#include <iterator>
#include <mutex>
#include <new>

#include "plugin/nccl/abi/net_abi.h"
#include "plugin/nccl/devices.h"
#include "plugin/nccl/net.h"
#include "src/common/log.h"
#include "src/transport/nccl/nccl_table.h"

namespace squall::nccl_plugin {
namespace {

using namespace nccl_abi;

// Squall's status as NCCL's result: the one conversion, shared with the
// interposer (src/transport/nccl/nccl_table.h).
Result toNccl(Status status) { return static_cast<Result>(transport::nccl::ncclResultOf(status)); }

template <typename F>
Result guarded(F&& body) {
  try {
    return toNccl(body());
  } catch (const std::bad_alloc&) {
    return toNccl(
        SQUALL_FAIL(Status::kOutOfMemory, Subsys::kTransport, "NET/Squall: out of host memory"));
  } catch (...) {
    return toNccl(SQUALL_FAIL(Status::kInternal, Subsys::kTransport,
                              "NET/Squall: unexpected exception (a bug in the plugin)"));
  }
}

// ---- logging through NCCL ----------------------------------------------------

std::atomic<Logger> gLogger{nullptr};

void sinkToNccl(squall::LogLevel level, Subsys subsys, const char* file, int line,
                const char* message) {
  Logger logger = gLogger.load(std::memory_order_acquire);
  if (logger == nullptr) return;
  nccl_abi::LogLevel to = level == squall::LogLevel::kWarn   ? kLogWarn
                          : level == squall::LogLevel::kInfo ? kLogInfo
                                                             : kLogTrace;
  unsigned long flags = subsys == Subsys::kColl        ? kLogColl
                        : subsys == Subsys::kTransport ? kLogNet
                                                       : kLogInit;
  logger(to, flags, file, line, "%s", message);
}

void installLogger(Logger logger) {
  if (logger == nullptr) return;
  gLogger.store(logger, std::memory_order_release);
  setLogSink(sinkToNccl);
}

// The plugin's own INFO lines (which device, which version) always reach
// NCCL's log, whatever SQUALL_DEBUG says; NCCL_DEBUG filters them.
[[gnu::format(printf, 1, 2)]] void infoToNccl(const char* format, ...) {
  Logger logger = gLogger.load(std::memory_order_acquire);
  char text[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  if (logger != nullptr)
    logger(kLogInfo, kLogInit | kLogNet, __FILE__, __LINE__, "%s", text);
  else
    SQUALL_INFO(Subsys::kTransport, "%s", text);
}

Status initCommon(const char* which, int version, Logger logger) {
  installLogger(logger);
  int n = 0;
  SQUALL_TRY(netDevices(&n));
  static std::once_flag once;
  std::call_once(once, [&] {
    uint32_t plane = kPlaneTcp;
    Status chosen = netPlane(&plane);
    infoToNccl("%s/Squall : v%d table, %s data plane, %d device(s): %s", which, version,
               chosen == Status::kOk ? planeName(plane) : "no", n, describeDevices().c_str());
  });
  return Status::kOk;
}

// ---- properties ---------------------------------------------------------------

template <typename P>
Status fillCommon(int dev, P* props) {
  SQUALL_REQUIRE(props != nullptr, Status::kInvalidArgument, Subsys::kTransport,
                 "NET/Squall: getProperties() was given a null struct");
  const DeviceInfo* info = nullptr;
  SQUALL_TRY(netDevice(dev, &info));
  props->name = const_cast<char*>(info->name.c_str());
  props->pciPath = info->pciPath.empty() ? nullptr : const_cast<char*>(info->pciPath.c_str());
  props->guid = static_cast<uint64_t>(dev);
  props->ptrSupport = kPtrHost;
  props->regIsGlobal = 0;
  props->speed = info->speedMbps;
  props->port = 0;
  props->latency = 0;
  props->maxComms = 65536;
  props->maxRecvs = kMaxRecvs;
  props->netDeviceType = kDeviceHost;
  props->netDeviceVersion = 0;
  return Status::kOk;
}

template <typename P>
Status fillV9(int dev, P* props) {
  SQUALL_TRY(fillCommon(dev, props));
  props->forceFlush = 0;
  // Every device is a physical NIC of its own (makeVDevice is NULL), and
  // the unused slots are zero whatever the version's width (4 or 8).
  props->vProps.ndevs = 1;
  props->vProps.devs[0] = dev;
  for (size_t i = 1; i < std::size(props->vProps.devs); ++i) props->vProps.devs[i] = 0;
  props->maxP2pBytes = kMaxNetBytes;
  props->maxCollBytes = kMaxNetBytes;
  return Status::kOk;
}

template <typename P>
Status fillV11(int dev, P* props) {
  SQUALL_TRY(fillV9(dev, props));
  props->maxMultiRequestSize = 1;
  return Status::kOk;
}

Result getPropertiesV8(int dev, PropertiesV8* p) {
  return guarded([&] { return fillCommon(dev, p); });
}
Result getPropertiesV9(int dev, PropertiesV9* p) {
  return guarded([&] { return fillV9(dev, p); });
}
Result getPropertiesV11(int dev, PropertiesV11* p) {
  return guarded([&] { return fillV11(dev, p); });
}
// From v12 on NCCL uses this struct as it is (for older tables its adapter
// sets the rail and the plane, for the net though not for CollNet), so both
// are written: an interface has neither, and "undefined" leaves the NIC's
// placement to NCCL's own topology.
Result getPropertiesV12(int dev, PropertiesV12* p) {
  return guarded([&] {
    SQUALL_TRY(fillV11(dev, p));
    p->railId = kNetIdUndef;
    p->planeId = kNetIdUndef;
    return Status::kOk;
  });
}

// ---- net adapters ---------------------------------------------------------------

Result netInitV8(Logger logger) {
  return guarded([&] { return initCommon("NET", 8, logger); });
}
Result netInitV9(Logger logger) {
  return guarded([&] { return initCommon("NET", 9, logger); });
}
Result netInitV10(Logger logger, ProfilerCallback) {
  return guarded([&] { return initCommon("NET", 10, logger); });
}
// v11 and v12: a context per communicator.
template <int V>
Result netInitWithContext(void** ctx, uint64_t, CommConfig*, Logger logger, ProfilerCallback) {
  return guarded([&] {
    SQUALL_REQUIRE(ctx != nullptr, Status::kInvalidArgument, Subsys::kTransport,
                   "NET/Squall: init() was given a null context pointer");
    SQUALL_TRY(initCommon("NET", V, logger));
    NetContext* c = nullptr;
    SQUALL_TRY(netInit(&c));
    *ctx = c;
    return Status::kOk;
  });
}
Result netFinalizeWithContext(void* ctx) {
  return guarded([&] { return netFinalize(static_cast<NetContext*>(ctx)); });
}
Result devicesAny(int* n) {
  return guarded([&] {
    SQUALL_REQUIRE(n != nullptr, Status::kInvalidArgument, Subsys::kTransport,
                   "NET/Squall: devices() was given a null count");
    return netDevices(n);
  });
}
Result listenOld(int dev, void* handle, void** listenComm) {
  return guarded([&] { return netListen(sharedContext(), dev, handle, listenComm); });
}
Result listenWithContext(void* ctx, int dev, void* handle, void** listenComm) {
  return guarded([&] { return netListen(static_cast<NetContext*>(ctx), dev, handle, listenComm); });
}
// No device offload: *devComm stays NULL.
Result connectOld(int dev, void* handle, void** sendComm, NetDeviceHandle** devComm) {
  if (devComm != nullptr) *devComm = nullptr;
  return guarded([&] { return netConnect(sharedContext(), dev, handle, sendComm); });
}
Result connectV10(int dev, CommConfig*, void* handle, void** sendComm, NetDeviceHandle** devComm) {
  return connectOld(dev, handle, sendComm, devComm);
}
Result connectWithContext(void* ctx, int dev, void* handle, void** sendComm,
                          NetDeviceHandle** devComm) {
  if (devComm != nullptr) *devComm = nullptr;
  return guarded([&] { return netConnect(static_cast<NetContext*>(ctx), dev, handle, sendComm); });
}
Result acceptAny(void* listenComm, void** recvComm, NetDeviceHandle** devComm) {
  if (devComm != nullptr) *devComm = nullptr;
  return guarded([&] { return netAccept(listenComm, recvComm); });
}
Result regMrAny(void* comm, void* data, size_t size, int type, void** mhandle) {
  return guarded([&] { return netRegMr(comm, data, size, type, mhandle); });
}
Result regMrDmaBufAny(void*, void*, size_t, int, uint64_t, int, void**) {
  return guarded([&] {
    return SQUALL_FAIL(Status::kInvalidArgument, Subsys::kTransport,
                       "NET/Squall: regMrDmaBuf() called, but the plugin reports no DMA-BUF "
                       "support (ptrSupport=HOST)");
  });
}
Result deregMrAny(void* comm, void* mhandle) {
  return guarded([&] { return netDeregMr(comm, mhandle); });
}
Result isendV8(void* comm, void* data, int size, int tag, void*, void** request) {
  return guarded([&] {
    SQUALL_REQUIRE(size >= 0, Status::kInvalidArgument, Subsys::kTransport,
                   "NET/Squall: isend() of %d bytes", size);
    return netIsend(comm, data, static_cast<size_t>(size), tag, request);
  });
}
Result isendV9(void* comm, void* data, size_t size, int tag, void*, void** request) {
  return guarded([&] { return netIsend(comm, data, size, tag, request); });
}
Result isendV10(void* comm, void* data, size_t size, int tag, void* mh, void*, void** request) {
  return isendV9(comm, data, size, tag, mh, request);
}
Result irecvV8(void* comm, int n, void** data, int* sizes, int* tags, void**, void** request) {
  return guarded([&] {
    SQUALL_REQUIRE(n >= 1 && n <= kMaxRecvs && sizes != nullptr, Status::kInvalidArgument,
                   Subsys::kTransport, "NET/Squall: irecv() of %d buffers (1 to %d allowed)", n,
                   kMaxRecvs);
    size_t wide[kMaxRecvs];
    for (int i = 0; i < n; ++i) {
      SQUALL_REQUIRE(sizes[i] >= 0, Status::kInvalidArgument, Subsys::kTransport,
                     "NET/Squall: irecv() buffer %d has size %d", i, sizes[i]);
      wide[i] = static_cast<size_t>(sizes[i]);
    }
    return netIrecv(comm, n, data, wide, tags, request);
  });
}
Result irecvV9(void* comm, int n, void** data, size_t* sizes, int* tags, void**, void** request) {
  return guarded([&] { return netIrecv(comm, n, data, sizes, tags, request); });
}
Result irecvV10(void* comm, int n, void** data, size_t* sizes, int* tags, void** mh, void**,
                void** request) {
  return irecvV9(comm, n, data, sizes, tags, mh, request);
}
// Host memory needs no flush: nothing to wait for.
Result iflushAny(void*, int, void**, int*, void**, void** request) {
  if (request != nullptr) *request = nullptr;
  return kSuccess;
}
Result testAny(void* request, int* done, int* sizes) {
  return guarded([&] {
    size_t wide[kMaxRecvs];
    int count = 0;
    SQUALL_TRY(netTest(request, done, wide, &count));
    if (*done && sizes != nullptr)
      for (int i = 0; i < count; ++i)
        sizes[i] = wide[i] > static_cast<size_t>(INT32_MAX) ? INT32_MAX : static_cast<int>(wide[i]);
    return Status::kOk;
  });
}
Result closeSendAny(void* comm) {
  return guarded([&] { return netCloseSend(comm); });
}
Result closeRecvAny(void* comm) {
  return guarded([&] { return netCloseRecv(comm); });
}
Result closeListenAny(void* comm) {
  return guarded([&] { return netCloseListen(comm); });
}

// ---- CollNet adapters -------------------------------------------------------------

// v8 to v10 share one process-wide context; the codec is checked all the same.
template <int V>
Result collInitOld(Logger logger) {
  return guarded([&] {
    SQUALL_TRY(initCommon("CollNet", V, logger));
    CollContext* c = nullptr;
    SQUALL_TRY(collInit(&c));
    return collFinalize(c);
  });
}
template <int V>
Result collInitWithContext(void** ctx, uint64_t, Logger logger) {
  return guarded([&] {
    SQUALL_REQUIRE(ctx != nullptr, Status::kInvalidArgument, Subsys::kColl,
                   "CollNet/Squall: init() was given a null context pointer");
    SQUALL_TRY(initCommon("CollNet", V, logger));
    CollContext* c = nullptr;
    SQUALL_TRY(collInit(&c));
    *ctx = c;
    return Status::kOk;
  });
}
Result collFinalizeWithContext(void* ctx) {
  return guarded([&] { return collFinalize(static_cast<CollContext*>(ctx)); });
}
Result collListenOld(int dev, void* handle, void** listenComm) {
  return guarded([&] { return collListen(sharedCollContext(), dev, handle, listenComm); });
}
Result collListenWithContext(void* ctx, int dev, void* handle, void** listenComm) {
  return guarded(
      [&] { return collListen(static_cast<CollContext*>(ctx), dev, handle, listenComm); });
}
Result collConnectAny(void* handles[], int nranks, int rank, void* listenComm, void** collComm) {
  return guarded([&] { return collConnect(handles, nranks, rank, listenComm, collComm); });
}
Result reduceSupportAny(DataType type, RedOp op, int* supported) {
  return guarded([&] { return collReduceSupport(type, op, supported); });
}
Result collRegMrAny(void* comm, void* data, size_t size, int type, void** mhandle) {
  return guarded([&] { return collRegMr(comm, data, size, type, mhandle); });
}
Result collDeregMrAny(void* comm, void* mhandle) {
  return guarded([&] { return collDeregMr(comm, mhandle); });
}
Result iallreduceV8(void* comm, void* send, void* recv, int count, DataType type, RedOp op, void*,
                    void*, void** request) {
  return guarded([&] {
    SQUALL_REQUIRE(count >= 0, Status::kInvalidArgument, Subsys::kColl,
                   "CollNet/Squall: iallreduce() of %d elements", count);
    return collAllReduce(comm, send, recv, static_cast<size_t>(count), type, op, request);
  });
}
Result iallreduceV9(void* comm, void* send, void* recv, size_t count, DataType type, RedOp op,
                    void*, void*, void** request) {
  return guarded([&] { return collAllReduce(comm, send, recv, count, type, op, request); });
}
// NCCL passes one receive part (the window); more would need a scatter.
template <typename Sge>
Status onePart(int parts, const Sge* sge, const char* what) {
  SQUALL_REQUIRE(parts == 1 && sge != nullptr, Status::kInvalidArgument, Subsys::kColl,
                 "CollNet/Squall: %s() with %d parts; the plugin handles one contiguous part", what,
                 parts);
  return Status::kOk;
}
template <typename Sge>
Result iallgatherAny(void* comm, void* send, int nParts, Sge* parts, size_t bytesPerRank,
                     size_t windowOffset, size_t windowBytes, void*, void** request) {
  return guarded([&] {
    SQUALL_TRY(onePart(nParts, parts, "iallgather"));
    return collAllGather(comm, send, parts[0].address, parts[0].size, bytesPerRank, windowOffset,
                         windowBytes, request);
  });
}
template <typename Sge>
Result ireducescatterAny(void* comm, int nParts, Sge* parts, void* recv, size_t bytesPerRank,
                         size_t windowOffset, size_t windowBytes, DataType type, RedOp op, void*,
                         void** request) {
  return guarded([&] {
    SQUALL_TRY(onePart(nParts, parts, "ireducescatter"));
    return collReduceScatter(comm, parts[0].address, parts[0].size, recv, bytesPerRank,
                             windowOffset, windowBytes, type, op, request);
  });
}
Result collIflushAny(void*, void*, int, void*, void** request) {
  if (request != nullptr) *request = nullptr;
  return kSuccess;
}
Result collTestAny(void* request, int* done, int* size) {
  if (size != nullptr) *size = 0;
  return guarded([&] { return collTest(request, done); });
}
Result closeCollAny(void* comm) {
  return guarded([&] { return collClose(comm); });
}
Result collCloseListenAny(void* comm) {
  return guarded([&] { return collCloseListen(comm); });
}

// ---- the v11 and v12 tables -----------------------------------------------------

// One table of adapters for both versions; only init (which logs the
// version) and getProperties (the struct) tell them apart.
template <int V, typename Table>
constexpr Table netWithContext(decltype(Table::getProperties) getProperties) noexcept {
  return {
      "squall",
      netInitWithContext<V>,
      devicesAny,
      getProperties,
      listenWithContext,
      connectWithContext,
      acceptAny,
      regMrAny,
      regMrDmaBufAny,
      deregMrAny,
      isendV10,
      irecvV10,
      iflushAny,
      testAny,
      closeSendAny,
      closeRecvAny,
      closeListenAny,
      nullptr,  // getDeviceMr
      nullptr,  // irecvConsumed
      nullptr,  // makeVDevice
      netFinalizeWithContext,
      nullptr,  // setNetAttr
  };
}

template <int V, typename Table>
constexpr Table collNetWithContext(decltype(Table::getProperties) getProperties) noexcept {
  return {
      "squall",
      collInitWithContext<V>,
      devicesAny,
      getProperties,
      collListenWithContext,
      collConnectAny,
      reduceSupportAny,
      collRegMrAny,
      regMrDmaBufAny,
      collDeregMrAny,
      iallreduceV9,
      iallgatherAny<SgeV9>,
      ireducescatterAny<SgeV9>,
      collIflushAny,
      collTestAny,
      closeCollAny,
      collCloseListenAny,
      nullptr,  // makeVDevice
      collFinalizeWithContext,
  };
}

}  // namespace
}  // namespace squall::nccl_plugin

// ---- the exported tables (found by NCCL with dlsym) ------------------------------
namespace np = squall::nccl_plugin;
namespace wire = squall::nccl_abi;

#define SQUALL_EXPORT extern "C" __attribute__((visibility("default")))

SQUALL_EXPORT wire::NetV12 ncclNetPlugin_v12;
constinit wire::NetV12 ncclNetPlugin_v12 =
    np::netWithContext<12, wire::NetV12>(np::getPropertiesV12);

SQUALL_EXPORT wire::NetV11 ncclNetPlugin_v11;
constinit wire::NetV11 ncclNetPlugin_v11 =
    np::netWithContext<11, wire::NetV11>(np::getPropertiesV11);

SQUALL_EXPORT wire::NetV10 ncclNetPlugin_v10;
wire::NetV10 ncclNetPlugin_v10 = {
    "squall",           np::netInitV10, np::devicesAny,   np::getPropertiesV9,
    np::listenOld,      np::connectV10, np::acceptAny,    np::regMrAny,
    np::regMrDmaBufAny, np::deregMrAny, np::isendV10,     np::irecvV10,
    np::iflushAny,      np::testAny,    np::closeSendAny, np::closeRecvAny,
    np::closeListenAny, nullptr,        nullptr,          nullptr,
};

SQUALL_EXPORT wire::NetV9 ncclNetPlugin_v9;
wire::NetV9 ncclNetPlugin_v9 = {
    "squall",           np::netInitV9,  np::devicesAny,   np::getPropertiesV9,
    np::listenOld,      np::connectOld, np::acceptAny,    np::regMrAny,
    np::regMrDmaBufAny, np::deregMrAny, np::isendV9,      np::irecvV9,
    np::iflushAny,      np::testAny,    np::closeSendAny, np::closeRecvAny,
    np::closeListenAny, nullptr,        nullptr,          nullptr,
};

SQUALL_EXPORT wire::NetV8 ncclNetPlugin_v8;
wire::NetV8 ncclNetPlugin_v8 = {
    "squall",           np::netInitV8,  np::devicesAny,   np::getPropertiesV8,
    np::listenOld,      np::connectOld, np::acceptAny,    np::regMrAny,
    np::regMrDmaBufAny, np::deregMrAny, np::isendV8,      np::irecvV8,
    np::iflushAny,      np::testAny,    np::closeSendAny, np::closeRecvAny,
    np::closeListenAny, nullptr,        nullptr,
};

SQUALL_EXPORT wire::CollNetV12 ncclCollNetPlugin_v12;
constinit wire::CollNetV12 ncclCollNetPlugin_v12 =
    np::collNetWithContext<12, wire::CollNetV12>(np::getPropertiesV12);

SQUALL_EXPORT wire::CollNetV11 ncclCollNetPlugin_v11;
constinit wire::CollNetV11 ncclCollNetPlugin_v11 =
    np::collNetWithContext<11, wire::CollNetV11>(np::getPropertiesV11);

SQUALL_EXPORT wire::CollNetV10 ncclCollNetPlugin_v10;
wire::CollNetV10 ncclCollNetPlugin_v10 = {
    "squall",
    np::collInitOld<10>,
    np::devicesAny,
    np::getPropertiesV9,
    np::collListenOld,
    np::collConnectAny,
    np::reduceSupportAny,
    np::collRegMrAny,
    np::regMrDmaBufAny,
    np::collDeregMrAny,
    np::iallreduceV9,
    np::iallgatherAny<wire::SgeV9>,
    np::ireducescatterAny<wire::SgeV9>,
    np::collIflushAny,
    np::collTestAny,
    np::closeCollAny,
    np::collCloseListenAny,
    nullptr,
};

SQUALL_EXPORT wire::CollNetV9 ncclCollNetPlugin_v9;
wire::CollNetV9 ncclCollNetPlugin_v9 = []() noexcept {
  wire::CollNetV9 table = ncclCollNetPlugin_v10;
  table.init = np::collInitOld<9>;
  return table;
}();

SQUALL_EXPORT wire::CollNetV8 ncclCollNetPlugin_v8;
wire::CollNetV8 ncclCollNetPlugin_v8 = {
    "squall",
    np::collInitOld<8>,
    np::devicesAny,
    np::getPropertiesV8,
    np::collListenOld,
    np::collConnectAny,
    np::reduceSupportAny,
    np::collRegMrAny,
    np::regMrDmaBufAny,
    np::collDeregMrAny,
    np::iallreduceV8,
    np::iallgatherAny<wire::SgeV8>,
    np::ireducescatterAny<wire::SgeV8>,
    np::collIflushAny,
    np::collTestAny,
    np::closeCollAny,
    np::collCloseListenAny,
};
