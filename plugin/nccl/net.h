// The one implementation behind every exported net and CollNet table
// (interface.cc holds the per-version adapters). Everything here speaks
// squall::Status; the adapters turn it into ncclResult_t.
//
// Net: one TCP stream per connection (sendComm -> recvComm), carrying
// messages framed by a 16-byte header (magic, tag, size). Sends and receives
// match in posting order; inside a grouped receive the tag picks the buffer.
// There are no threads: a request progresses when NCCL's proxy calls isend,
// irecv or test on it, and each comm has its own lock, so the proxy's service
// and progress threads and several communicators may call concurrently.
// A peer that dies closes the stream (the kernel does that for a killed
// process) or stops answering keepalives and unacknowledged data within
// SQUALL_TIMEOUT_S; either fails the comm's pending requests with
// kRemoteError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "src/bootstrap/socket.h"
#include "src/common/status.h"

namespace squall::nccl_plugin {

constexpr int kMaxRecvs = 8;  // buffers per grouped receive (reported as maxRecvs)
// The most bytes (payload and headers) one isend, irecv or test call moves
// on a TCP connection.
// NCCL's proxy progresses every channel between two calls, so a call that
// copied a whole window of 512 KiB steps into the kernel would hold up all
// the others; at a few GB/s of copying this bounds a call to well under
// 0.5 ms, and a message larger than it takes several calls.
constexpr size_t kMaxBytesPerCall = size_t{256} << 10;

// Every net object NCCL holds (listen, send and receive comms, requests)
// starts with the data plane it belongs to, so one entry point serves both.
constexpr uint32_t kPlaneTcp = 0x53515443;  // "SQTC"
constexpr uint32_t kPlaneUcx = 0x53515543;  // "SQUC"
struct NetObject {
  uint32_t plane = kPlaneTcp;
};
inline uint32_t planeOf(const void* object) { return static_cast<const NetObject*>(object)->plane; }

// The plane new listeners use, from SQUALL_NET_TRANSPORT (auto: UCX when
// built in, loadable (SQUALL_UCX_LIBRARY) and a UCX context can be created,
// else TCP, said in one INFO line), resolved once per load. An explicit ucx
// that cannot be loaded or start is an error. Connect follows the handle's
// plane, whatever this side chose.
Status netPlane(uint32_t* plane);
const char* planeName(uint32_t plane);

struct DeviceInfo {
  std::string name;     // the interface name; NCCL keys its topology on it
  std::string pciPath;  // sysfs PCI directory, "" when the interface has none
  std::string address;  // "10.0.0.1" (for logs)
  int speedMbps = 0;
  bool speedMeasured = false;  // false: /sys gave nothing, speedMbps is the fallback
};

// Devices: discovered once per load (IP interfaces, see devices.cc).
Status netDevices(int* count);
Status netDevice(int dev, const DeviceInfo** info);

// A per-communicator context (v11 init/finalize); older versions share one.
struct NetContext;
Status netInit(NetContext** ctx);
Status netFinalize(NetContext* ctx);
NetContext* sharedContext();

Status netListen(NetContext* ctx, int dev, void* handle, void** listenComm);
// Non-blocking: kOk with *sendComm == nullptr means "call again".
Status netConnect(NetContext* ctx, int dev, void* handle, void** sendComm);
Status netAccept(void* listenComm, void** recvComm);
Status netRegMr(void* comm, void* data, size_t size, int type, void** mhandle);
Status netDeregMr(void* comm, void* mhandle);
// *request == nullptr with kOk: too many requests in flight, retry.
Status netIsend(void* sendComm, void* data, size_t size, int tag, void** request);
Status netIrecv(void* recvComm, int n, void** data, const size_t* sizes, const int* tags,
                void** request);
// `sizes` (may be null) receives `*count` entries: 1 for a send, n for a
// grouped receive. A request reported done is freed.
Status netTest(void* request, int* done, size_t* sizes, int* count);
Status netCloseSend(void* sendComm);
Status netCloseRecv(void* recvComm);
Status netCloseListen(void* listenComm);

// CollNet (collnet.cc).
struct CollContext;
Status collInit(CollContext** ctx);
Status collFinalize(CollContext* ctx);
CollContext* sharedCollContext();
Status collListen(CollContext* ctx, int dev, void* handle, void** listenComm);
Status collConnect(void* const* handles, int nranks, int rank, void* listenComm, void** collComm);
Status collReduceSupport(int dataType, int redOp, int* supported);
Status collRegMr(void* collComm, void* data, size_t size, int type, void** mhandle);
Status collDeregMr(void* collComm, void* mhandle);
Status collAllReduce(void* collComm, const void* send, void* recv, size_t count, int dataType,
                     int redOp, void** request);
Status collAllGather(void* collComm, const void* send, void* recv, size_t recvBytes,
                     size_t bytesPerRank, size_t windowOffset, size_t windowBytes, void** request);
Status collReduceScatter(void* collComm, const void* send, size_t sendBytes, void* recv,
                         size_t bytesPerRank, size_t windowOffset, size_t windowBytes, int dataType,
                         int redOp, void** request);
Status collTest(void* request, int* done);
Status collClose(void* collComm);
Status collCloseListen(void* listenComm);

// Pieces the CollNet rendezvous shares with the net (net.cc): a listener on
// a device with a self-describing handle, and one blocking exchange with the
// listener of another rank.
struct Rendezvous {
  int fd = -1;
  uint64_t nonce = 0;
};
Status openRendezvous(int dev, uint32_t kind, void* handle, Rendezvous* out);
// Connects to the listener named by `handle`, sends `bytes` and closes.
Status sendToHandle(const void* handle, uint32_t kind, const void* data, size_t bytes,
                    int64_t timeoutMs);
// Accepts on `listener` until a peer presenting its nonce delivers `bytes`.
Status receiveOnRendezvous(const Rendezvous& listener, void* data, size_t bytes, int64_t timeoutMs);

// Handles (net.cc): magic, version, kind, nonce, address (offset 16), and a
// connection number the UCX plane puts in its tags.
constexpr uint32_t kKindNetUcx = 3;
struct HandleFields {
  bootstrap::SocketAddress address;
  uint64_t nonce = 0;
  uint32_t connection = 0;
};
Status decodeHandle(const void* handle, uint32_t kind, HandleFields* out);
void writeHandle(uint32_t kind, uint64_t nonce, const bootstrap::SocketAddress& bound,
                 uint32_t connection, void* handle);
uint64_t randomNonce();
int64_t timeoutMs();  // SQUALL_TIMEOUT_S

#if defined(SQUALL_HAVE_UCX)
// The UCX plane (net_ucx.cc); arguments already checked by the net entry
// points, objects dispatched here by planeOf.
Status ucxAvailable();
Status ucxListen(const bootstrap::SocketAddress& address, void* handle, void** listenComm);
Status ucxConnect(void* handle, void** sendComm);
Status ucxAccept(void* listenComm, void** recvComm);
Status ucxIsend(void* sendComm, void* data, size_t size, int tag, void** request);
Status ucxIrecv(void* recvComm, int n, void** data, const size_t* sizes, const int* tags,
                void** request);
Status ucxTest(void* request, int* done, size_t* sizes, int* count);
Status ucxClose(void* comm);
Status ucxCloseListen(void* listenComm);
// Drops the connects still in progress (called when the last v11 context
// is finalized).
void ucxAbandonConnects();
#endif

}  // namespace squall::nccl_plugin
