// The binary interface between NCCL and an external net / CollNet plugin, as
// NCCL 2.20 to 2.30 read it: the function tables of versions 8 to 12 and the
// structs they pass. Declared here from the documented layout (every size and
// offset is pinned by a static_assert below, for LP64), so the plugin builds
// without NCCL installed. Names carry a Squall prefix; only the exported
// table symbols (interface.cc) use NCCL's spelling, since NCCL finds them by
// name.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/transport/nccl/nccl_abi_values.h"

namespace squall::nccl_abi {

// ncclDebugLogLevel and the subsystem bits NCCL's logger filters on.
enum LogLevel : int {
  kLogNone = 0,
  kLogVersion = 1,
  kLogWarn = 2,
  kLogInfo = 3,
  kLogAbort = 4,
  kLogTrace = 5
};
constexpr unsigned long kLogInit = 0x1;
constexpr unsigned long kLogNet = 0x10;
constexpr unsigned long kLogColl = 0x2;

using Logger = void (*)(LogLevel level, unsigned long flags, const char* file, int line,
                        const char* format, ...);
using ProfilerCallback = Result (*)(void** eventHandle, int type, void* parentHandle,
                                    int64_t pluginId, void* extraData);

constexpr size_t kHandleMaxBytes = 128;      // NCCL_NET_HANDLE_MAXSIZE
constexpr int kMaxRequests = 32;             // NCCL_NET_MAX_REQUESTS
constexpr int kPtrHost = 0x1;                // NCCL_PTR_HOST
constexpr int kPtrCuda = 0x2;                // NCCL_PTR_CUDA
constexpr int kPtrDmaBuf = 0x4;              // NCCL_PTR_DMABUF
constexpr int kMaxDevsPerNic = 4;            // NCCL_NET_MAX_DEVS_PER_NIC, v9 to v11
constexpr int kMaxDevsPerNicV12 = 8;         // the same, from v12 on
constexpr int16_t kNetIdUndef = -1;          // NCCL_NET_ID_UNDEF: rail / plane not known
constexpr size_t kMaxNetBytes = 1ull << 40;  // NCCL_MAX_NET_SIZE_BYTES

enum NetDeviceType : int { kDeviceHost = 0, kDeviceUnpack = 1 };

// ncclNetDeviceHandle_v7..v12_t: device offload, which this plugin never offers.
struct NetDeviceHandle {
  NetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
};

// A virtual NIC: the physical devices it merges.
struct VDeviceProps {  // ncclNetVDeviceProps_v9..v11_t
  int ndevs;
  int devs[kMaxDevsPerNic];
};
struct VDevicePropsV12 {  // ncclNetVDeviceProps_v12_t: twice the devices
  int ndevs;
  int devs[kMaxDevsPerNicV12];
};

struct CommConfig {  // ncclNetCommConfig_v10..v12_t
  int trafficClass;
};

// v11 and v12 share these two.
struct NetCommAttr {  // ncclNetCommAttr_v11_t
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
};
struct NetAttr {  // ncclNetAttr_v11_t
  NetCommAttr sendCommAttr;
  NetCommAttr recvCommAttr;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
};

struct PropertiesV8 {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;  // Mbit/s
  int port;
  float latency;  // us
  int maxComms;
  int maxRecvs;
  NetDeviceType netDeviceType;
  int netDeviceVersion;
};

// v9 and v10 share this; v11 appends maxMultiRequestSize.
struct PropertiesV9 {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  NetDeviceType netDeviceType;
  int netDeviceVersion;
  VDeviceProps vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
};
struct PropertiesV11 {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  NetDeviceType netDeviceType;
  int netDeviceVersion;
  VDeviceProps vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
};
// v12: the wider vProps moves everything after it by 16 bytes, and the NIC's
// rail and plane (kNetIdUndef when unknown) follow maxMultiRequestSize. NCCL
// reads a v12 plugin's struct as it is, so every member must be written.
struct PropertiesV12 {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  NetDeviceType netDeviceType;
  int netDeviceVersion;
  VDevicePropsV12 vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
  int16_t railId;
  int16_t planeId;
};

struct SgeV8 {
  void* mhandle;
  void* address;
  uint32_t size;
};
struct SgeV9 {  // also v10 to v12
  void* mhandle;
  void* address;
  size_t size;
};

// ---- net tables -------------------------------------------------------------

struct NetV8 {
  const char* name;
  Result (*init)(Logger logger);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV8* props);
  Result (*listen)(int dev, void* handle, void** listenComm);
  Result (*connect)(int dev, void* handle, void** sendComm, NetDeviceHandle** sendDevComm);
  Result (*accept)(void* listenComm, void** recvComm, NetDeviceHandle** recvDevComm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                        void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle, void** request);
  Result (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                  void** request);
  Result (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* sendComm);
  Result (*closeRecv)(void* recvComm);
  Result (*closeListen)(void* listenComm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptrMhandle);
  Result (*irecvConsumed)(void* recvComm, int n, void* request);
};

struct NetV9 {
  const char* name;
  Result (*init)(Logger logger);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV9* props);
  Result (*listen)(int dev, void* handle, void** listenComm);
  Result (*connect)(int dev, void* handle, void** sendComm, NetDeviceHandle** sendDevComm);
  Result (*accept)(void* listenComm, void** recvComm, NetDeviceHandle** recvDevComm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                        void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request);
  Result (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                  void** request);
  Result (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* sendComm);
  Result (*closeRecv)(void* recvComm);
  Result (*closeListen)(void* listenComm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptrMhandle);
  Result (*irecvConsumed)(void* recvComm, int n, void* request);
  Result (*makeVDevice)(int* d, VDeviceProps* props);
};

struct NetV10 {
  const char* name;
  Result (*init)(Logger logger, ProfilerCallback profiler);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV9* props);
  Result (*listen)(int dev, void* handle, void** listenComm);
  Result (*connect)(int dev, CommConfig* config, void* handle, void** sendComm,
                    NetDeviceHandle** sendDevComm);
  Result (*accept)(void* listenComm, void** recvComm, NetDeviceHandle** recvDevComm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                        void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                  void** request);
  Result (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                  void** phandles, void** request);
  Result (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* sendComm);
  Result (*closeRecv)(void* recvComm);
  Result (*closeListen)(void* listenComm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptrMhandle);
  Result (*irecvConsumed)(void* recvComm, int n, void* request);
  Result (*makeVDevice)(int* d, VDeviceProps* props);
};

// v11 and v12 are the same table over different properties and virtual-NIC
// structs: every call takes the communicator's context from init.
template <typename Properties, typename VProps>
struct NetWithContext {
  const char* name;
  Result (*init)(void** ctx, uint64_t commId, CommConfig* config, Logger logger,
                 ProfilerCallback profiler);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, Properties* props);
  Result (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  Result (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                    NetDeviceHandle** sendDevComm);
  Result (*accept)(void* listenComm, void** recvComm, NetDeviceHandle** recvDevComm);
  Result (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                        void** mhandle);
  Result (*deregMr)(void* comm, void* mhandle);
  Result (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle, void* phandle,
                  void** request);
  Result (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                  void** phandles, void** request);
  Result (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
  Result (*test)(void* request, int* done, int* sizes);
  Result (*closeSend)(void* sendComm);
  Result (*closeRecv)(void* recvComm);
  Result (*closeListen)(void* listenComm);
  Result (*getDeviceMr)(void* comm, void* mhandle, void** dptrMhandle);
  Result (*irecvConsumed)(void* recvComm, int n, void* request);
  Result (*makeVDevice)(int* d, VProps* props);
  Result (*finalize)(void* ctx);
  Result (*setNetAttr)(void* ctx, NetAttr* attr);
};
using NetV11 = NetWithContext<PropertiesV11, VDeviceProps>;
using NetV12 = NetWithContext<PropertiesV12, VDevicePropsV12>;

// ---- CollNet tables ---------------------------------------------------------

struct CollNetV8 {
  const char* name;
  Result (*init)(Logger logger);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV8* props);
  Result (*listen)(int dev, void* handle, void** listenComm);
  Result (*connect)(void* handles[], int nranks, int rank, void* listenComm, void** collComm);
  Result (*reduceSupport)(DataType dataType, RedOp redOp, int* supported);
  Result (*regMr)(void* collComm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,
                        void** mhandle);
  Result (*deregMr)(void* collComm, void* mhandle);
  Result (*iallreduce)(void* collComm, void* sendData, void* recvData, int count, DataType dataType,
                       RedOp redOp, void* sendMhandle, void* recvMhandle, void** request);
  Result (*iallgather)(void* collComm, void* sendData, int nRecvParts, SgeV8* recvParts,
                       size_t bytesPerRank, size_t windowOffset, size_t windowBytes,
                       void* sendMhandle, void** request);
  Result (*ireducescatter)(void* collComm, int nSendParts, SgeV8* sendParts, void* recvData,
                           size_t bytesPerRank, size_t windowOffset, size_t windowBytes,
                           DataType dataType, RedOp redOp, void* recvMhandle, void** request);
  Result (*iflush)(void* collComm, void* data, int size, void* mhandle, void** request);
  Result (*test)(void* request, int* done, int* size);
  Result (*closeColl)(void* collComm);
  Result (*closeListen)(void* listenComm);
};

// v9 and v10 are the same table.
struct CollNetV9 {
  const char* name;
  Result (*init)(Logger logger);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, PropertiesV9* props);
  Result (*listen)(int dev, void* handle, void** listenComm);
  Result (*connect)(void* handles[], int nranks, int rank, void* listenComm, void** collComm);
  Result (*reduceSupport)(DataType dataType, RedOp redOp, int* supported);
  Result (*regMr)(void* collComm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,
                        void** mhandle);
  Result (*deregMr)(void* collComm, void* mhandle);
  Result (*iallreduce)(void* collComm, void* sendData, void* recvData, size_t count,
                       DataType dataType, RedOp redOp, void* sendMhandle, void* recvMhandle,
                       void** request);
  Result (*iallgather)(void* collComm, void* sendData, int nRecvParts, SgeV9* recvParts,
                       size_t bytesPerRank, size_t windowOffset, size_t windowBytes,
                       void* sendMhandle, void** request);
  Result (*ireducescatter)(void* collComm, int nSendParts, SgeV9* sendParts, void* recvData,
                           size_t bytesPerRank, size_t windowOffset, size_t windowBytes,
                           DataType dataType, RedOp redOp, void* recvMhandle, void** request);
  Result (*iflush)(void* collComm, void* data, int size, void* mhandle, void** request);
  Result (*test)(void* request, int* done, int* size);
  Result (*closeColl)(void* collComm);
  Result (*closeListen)(void* listenComm);
  Result (*makeVDevice)(int* d, VDeviceProps* props);
};
using CollNetV10 = CollNetV9;

// v11 and v12, as for the net.
template <typename Properties, typename VProps>
struct CollNetWithContext {
  const char* name;
  Result (*init)(void** ctx, uint64_t commId, Logger logger);
  Result (*devices)(int* ndev);
  Result (*getProperties)(int dev, Properties* props);
  Result (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  Result (*connect)(void* handles[], int nranks, int rank, void* listenComm, void** collComm);
  Result (*reduceSupport)(DataType dataType, RedOp redOp, int* supported);
  Result (*regMr)(void* collComm, void* data, size_t size, int type, void** mhandle);
  Result (*regMrDmaBuf)(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,
                        void** mhandle);
  Result (*deregMr)(void* collComm, void* mhandle);
  Result (*iallreduce)(void* collComm, void* sendData, void* recvData, size_t count,
                       DataType dataType, RedOp redOp, void* sendMhandle, void* recvMhandle,
                       void** request);
  Result (*iallgather)(void* collComm, void* sendData, int nRecvParts, SgeV9* recvParts,
                       size_t bytesPerRank, size_t windowOffset, size_t windowBytes,
                       void* sendMhandle, void** request);
  Result (*ireducescatter)(void* collComm, int nSendParts, SgeV9* sendParts, void* recvData,
                           size_t bytesPerRank, size_t windowOffset, size_t windowBytes,
                           DataType dataType, RedOp redOp, void* recvMhandle, void** request);
  Result (*iflush)(void* collComm, void* data, int size, void* mhandle, void** request);
  Result (*test)(void* request, int* done, int* size);
  Result (*closeColl)(void* collComm);
  Result (*closeListen)(void* listenComm);
  Result (*makeVDevice)(int* d, VProps* props);
  Result (*finalize)(void* ctx);
};
using CollNetV11 = CollNetWithContext<PropertiesV11, VDeviceProps>;
using CollNetV12 = CollNetWithContext<PropertiesV12, VDevicePropsV12>;

// ---- layout checks (LP64) ---------------------------------------------------
#if defined(__LP64__)
static_assert(sizeof(Result) == 4 && sizeof(DataType) == 4 && sizeof(RedOp) == 4);
static_assert(sizeof(NetDeviceHandle) == 32 && offsetof(NetDeviceHandle, handle) == 8 &&
              offsetof(NetDeviceHandle, size) == 16 &&
              offsetof(NetDeviceHandle, needsProxyProgress) == 24);
static_assert(sizeof(VDeviceProps) == 20);
static_assert(sizeof(VDevicePropsV12) == 36);
static_assert(sizeof(CommConfig) == 4);
static_assert(sizeof(NetCommAttr) == 16);
static_assert(sizeof(NetAttr) == 44 && offsetof(NetAttr, op) == 32 &&
              offsetof(NetAttr, proto) == 40);
static_assert(sizeof(SgeV8) == 24 && offsetof(SgeV8, size) == 16);
static_assert(sizeof(SgeV9) == 24 && offsetof(SgeV9, size) == 16);

static_assert(sizeof(PropertiesV8) == 64);
static_assert(offsetof(PropertiesV8, guid) == 16 && offsetof(PropertiesV8, ptrSupport) == 24 &&
              offsetof(PropertiesV8, speed) == 32 && offsetof(PropertiesV8, latency) == 40 &&
              offsetof(PropertiesV8, maxRecvs) == 48 &&
              offsetof(PropertiesV8, netDeviceType) == 52 &&
              offsetof(PropertiesV8, netDeviceVersion) == 56);

static_assert(sizeof(PropertiesV9) == 104);
static_assert(sizeof(PropertiesV11) == 112);
static_assert(sizeof(PropertiesV12) == 128);
// Up to vProps every version from v9 on agrees.
#define SQUALL_CHECK_PROPS(T)                                                                     \
  static_assert(offsetof(T, name) == 0 && offsetof(T, pciPath) == 8 && offsetof(T, guid) == 16 && \
                offsetof(T, ptrSupport) == 24 && offsetof(T, regIsGlobal) == 28 &&                \
                offsetof(T, forceFlush) == 32 && offsetof(T, speed) == 36 &&                      \
                offsetof(T, port) == 40 && offsetof(T, latency) == 44 &&                          \
                offsetof(T, maxComms) == 48 && offsetof(T, maxRecvs) == 52 &&                     \
                offsetof(T, netDeviceType) == 56 && offsetof(T, netDeviceVersion) == 60 &&        \
                offsetof(T, vProps) == 64)
SQUALL_CHECK_PROPS(PropertiesV9);
SQUALL_CHECK_PROPS(PropertiesV11);
SQUALL_CHECK_PROPS(PropertiesV12);
#undef SQUALL_CHECK_PROPS
static_assert(offsetof(PropertiesV9, maxP2pBytes) == 88 &&
              offsetof(PropertiesV9, maxCollBytes) == 96);
static_assert(offsetof(PropertiesV11, maxP2pBytes) == 88 &&
              offsetof(PropertiesV11, maxCollBytes) == 96 &&
              offsetof(PropertiesV11, maxMultiRequestSize) == 104);
static_assert(offsetof(PropertiesV12, maxP2pBytes) == 104 &&
              offsetof(PropertiesV12, maxCollBytes) == 112 &&
              offsetof(PropertiesV12, maxMultiRequestSize) == 120 &&
              offsetof(PropertiesV12, railId) == 124 && offsetof(PropertiesV12, planeId) == 126);

// Tables: one pointer per member.
static_assert(sizeof(NetV8) == 19 * 8);
static_assert(sizeof(NetV9) == 20 * 8 && sizeof(NetV10) == 20 * 8);
static_assert(sizeof(NetV11) == 22 * 8 && offsetof(NetV11, finalize) == 20 * 8 &&
              offsetof(NetV11, setNetAttr) == 21 * 8);
static_assert(offsetof(NetV11, isend) == 10 * 8 && offsetof(NetV11, test) == 13 * 8 &&
              offsetof(NetV11, makeVDevice) == 19 * 8);
static_assert(sizeof(NetV12) == sizeof(NetV11) && offsetof(NetV12, getProperties) == 3 * 8 &&
              offsetof(NetV12, makeVDevice) == 19 * 8 && offsetof(NetV12, setNetAttr) == 21 * 8);
static_assert(sizeof(CollNetV8) == 17 * 8);
static_assert(sizeof(CollNetV9) == 18 * 8);
static_assert(sizeof(CollNetV11) == 19 * 8 && offsetof(CollNetV11, iallreduce) == 10 * 8 &&
              offsetof(CollNetV11, test) == 14 * 8 && offsetof(CollNetV11, finalize) == 18 * 8);
static_assert(sizeof(CollNetV12) == sizeof(CollNetV11) &&
              offsetof(CollNetV12, getProperties) == 3 * 8 &&
              offsetof(CollNetV12, makeVDevice) == 17 * 8 &&
              offsetof(CollNetV12, finalize) == 18 * 8);
#endif

}  // namespace squall::nccl_abi
