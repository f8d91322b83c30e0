// The NCCL stand-in of tests/gpu/emu/nccl_emu.h: FIFO mailboxes between threads.
#include "nccl_emu.h"

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

struct EmuWorld {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::pair<int, int>, std::deque<std::vector<unsigned char>>> mail;  // (from, to)
};

struct ncclComm {
  std::shared_ptr<EmuWorld> world;
  int rank = 0;
  int size = 1;
};

namespace {

using namespace squall::transport::nccl;  // NOLINT: the NCCL constants

ncclComm_t commOf(void* comm) { return static_cast<ncclComm_t>(comm); }
cudaStream_t streamOf(void* stream) { return static_cast<cudaStream_t>(stream); }

struct Op {
  bool send;
  const void* from;
  void* to;
  size_t bytes;
  int peer;
  ncclComm_t comm;
};

thread_local int tGroupDepth = 0;
thread_local std::vector<Op> tPending;
thread_local cudaStream_t tGroupStream = nullptr;

size_t sizeOf(int t) {
  switch (t) {
    case 0:  // int8
    case squall::nccl_abi::kUint8: return 1;
    case squall::nccl_abi::kFloat16:
    case squall::nccl_abi::kBfloat16: return 2;
    case squall::nccl_abi::kInt32:
    case 3:  // uint32
    case squall::nccl_abi::kFloat32: return 4;
    default: return 8;
  }
}

// Every send first, then every receive (which waits for its message).
void run(const std::vector<Op>& ops) {
  for (const Op& op : ops) {
    if (!op.send) continue;
    EmuWorld& w = *op.comm->world;
    const auto* p = static_cast<const unsigned char*>(op.from);
    std::lock_guard<std::mutex> lock(w.mutex);
    w.mail[{op.comm->rank, op.peer}].emplace_back(p, p + op.bytes);
    w.cv.notify_all();
  }
  for (const Op& op : ops) {
    if (op.send) continue;
    EmuWorld& w = *op.comm->world;
    std::unique_lock<std::mutex> lock(w.mutex);
    auto& box = w.mail[{op.peer, op.comm->rank}];
    w.cv.wait(lock, [&] { return !box.empty(); });
    std::vector<unsigned char> message = std::move(box.front());
    box.pop_front();
    lock.unlock();
    if (message.size() != op.bytes) std::abort();  // mismatched send/recv sizes
    std::memcpy(op.to, message.data(), op.bytes);
  }
}

int submit(std::vector<Op> ops, cudaStream_t stream) {
  if (tGroupDepth > 0) {
    if (!tPending.empty() && tGroupStream != stream) return squall::nccl_abi::kInvalidUsage;
    tGroupStream = stream;
    tPending.insert(tPending.end(), ops.begin(), ops.end());
    return squall::nccl_abi::kSuccess;
  }
  squall_emu::enqueue(stream, [ops = std::move(ops)] { run(ops); });
  return squall::nccl_abi::kSuccess;
}

const char* errorString(int result) {
  return result == squall::nccl_abi::kSuccess ? "no error" : "emulated NCCL error";
}

int commCount(void* comm, int* count) {
  *count = commOf(comm)->size;
  return squall::nccl_abi::kSuccess;
}

int commUserRank(void* comm, int* rank) {
  *rank = commOf(comm)->rank;
  return squall::nccl_abi::kSuccess;
}

int commAbort(void*) { return squall::nccl_abi::kSuccess; }

// The emulation's calls are blocking: nothing is ever in progress.
int commGetAsyncError(void*, int* state) {
  *state = squall::nccl_abi::kSuccess;
  return squall::nccl_abi::kSuccess;
}

int groupStart() {
  ++tGroupDepth;
  return squall::nccl_abi::kSuccess;
}

int groupEnd() {
  if (tGroupDepth == 0) return squall::nccl_abi::kInvalidUsage;
  if (--tGroupDepth > 0 || tPending.empty()) return squall::nccl_abi::kSuccess;
  std::vector<Op> ops = std::move(tPending);
  tPending.clear();
  squall_emu::enqueue(tGroupStream, [ops = std::move(ops)] { run(ops); });
  return squall::nccl_abi::kSuccess;
}

int send(const void* sendbuff, size_t count, int datatype, int peer, void* c, void* stream) {
  ncclComm_t comm = commOf(c);
  if (peer < 0 || peer >= comm->size || peer == comm->rank)
    return squall::nccl_abi::kInvalidArgument;
  return submit({Op{true, sendbuff, nullptr, count * sizeOf(datatype), peer, comm}},
                streamOf(stream));
}

int recv(void* recvbuff, size_t count, int datatype, int peer, void* c, void* stream) {
  ncclComm_t comm = commOf(c);
  if (peer < 0 || peer >= comm->size || peer == comm->rank)
    return squall::nccl_abi::kInvalidArgument;
  return submit({Op{false, nullptr, recvbuff, count * sizeOf(datatype), peer, comm}},
                streamOf(stream));
}

int allGather(const void* sendbuff, void* recvbuff, size_t sendcount, int datatype, void* c,
              void* s) {
  ncclComm_t comm = commOf(c);
  cudaStream_t stream = streamOf(s);
  const size_t bytes = sendcount * sizeOf(datatype);
  auto* out = static_cast<unsigned char*>(recvbuff);
  std::vector<Op> ops;
  for (int j = 0; j < comm->size; ++j) {
    if (j != comm->rank) ops.push_back(Op{true, sendbuff, nullptr, bytes, j, comm});
  }
  for (int j = 0; j < comm->size; ++j) {
    if (j != comm->rank) ops.push_back(Op{false, nullptr, out + j * bytes, bytes, j, comm});
  }
  void* mine = out + static_cast<size_t>(comm->rank) * bytes;
  if (mine != sendbuff) {
    squall_emu::enqueue(stream, [=] { std::memmove(mine, sendbuff, bytes); });
  }
  return submit(std::move(ops), stream);
}

int allReduce(const void* sendbuff, void* recvbuff, size_t count, int datatype, int op, void* c,
              void* stream) {
  ncclComm_t comm = commOf(c);
  if (datatype != squall::nccl_abi::kFloat32 || op != squall::nccl_abi::kSum || tGroupDepth > 0)
    return squall::nccl_abi::kInvalidUsage;
  squall_emu::enqueue(streamOf(stream), [=] {
    const size_t bytes = count * sizeof(float);
    const auto n = static_cast<size_t>(comm->size);
    // Every rank's buffer, by an all-gather through the mailboxes.
    std::vector<float> all(n * count);
    std::memcpy(all.data() + static_cast<size_t>(comm->rank) * count, sendbuff, bytes);
    std::vector<Op> ops;
    for (int j = 0; j < comm->size; ++j) {
      if (j != comm->rank) ops.push_back(Op{true, sendbuff, nullptr, bytes, j, comm});
    }
    for (int j = 0; j < comm->size; ++j) {
      if (j != comm->rank)
        ops.push_back(
            Op{false, nullptr, all.data() + static_cast<size_t>(j) * count, bytes, j, comm});
    }
    run(ops);
    auto* out = static_cast<float*>(recvbuff);
    for (size_t i = 0; i < count; ++i) {
      float acc = all[i];
      for (size_t j = 1; j < n; ++j) acc += all[j * count + i];
      out[i] = acc;
    }
  });
  return squall::nccl_abi::kSuccess;
}

// The root sends to every other rank, which receives in place (out).
int broadcast(const void* sendbuff, void* recvbuff, size_t count, int datatype, int root, void* c,
              void* s) {
  ncclComm_t comm = commOf(c);
  if (root < 0 || root >= comm->size || tGroupDepth > 0) return squall::nccl_abi::kInvalidArgument;
  const size_t bytes = count * sizeOf(datatype);
  std::vector<Op> ops;
  if (comm->rank == root) {
    if (recvbuff != sendbuff) {
      squall_emu::enqueue(streamOf(s), [=] { std::memmove(recvbuff, sendbuff, bytes); });
    }
    for (int j = 0; j < comm->size; ++j)
      if (j != root) ops.push_back(Op{true, sendbuff, nullptr, bytes, j, comm});
  } else {
    ops.push_back(Op{false, nullptr, recvbuff, bytes, root, comm});
  }
  return submit(std::move(ops), streamOf(s));
}

constexpr Table kTable = {errorString, commCount,        commUserRank, commAbort,
                          groupStart,  groupEnd,         send,         recv,
                          allGather,   allReduce,        broadcast,    "CPU emulation of NCCL",
                          nullptr,     commGetAsyncError};

}  // namespace

namespace squall_emu {

const Table& ncclTable() { return kTable; }

void ncclCreateWorld(int n, ncclComm_t* comms) {
  squall::transport::nccl::installTable(&kTable);
  auto world = std::make_shared<EmuWorld>();
  for (int i = 0; i < n; ++i) comms[i] = new ncclComm{world, i, n};
}

void ncclDestroyWorld(int n, ncclComm_t* comms) {
  for (int i = 0; i < n; ++i) delete comms[i];
}

}  // namespace squall_emu
