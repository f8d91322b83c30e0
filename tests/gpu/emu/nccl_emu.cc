// The NCCL stand-in of tests/gpu/emu/nccl.h: FIFO mailboxes between threads.
#include "nccl.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

struct ncclWorld {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::pair<int, int>, std::deque<std::vector<unsigned char>>> mail;  // (from, to)
};

struct ncclComm {
  std::shared_ptr<ncclWorld> world;
  int rank = 0;
  int size = 1;
};

namespace {

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

size_t sizeOf(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    default: return 8;
  }
}

// Every send first, then every receive (which waits for its message).
void run(const std::vector<Op>& ops) {
  for (const Op& op : ops) {
    if (!op.send) continue;
    ncclWorld& w = *op.comm->world;
    const auto* p = static_cast<const unsigned char*>(op.from);
    std::lock_guard<std::mutex> lock(w.mutex);
    w.mail[{op.comm->rank, op.peer}].emplace_back(p, p + op.bytes);
    w.cv.notify_all();
  }
  for (const Op& op : ops) {
    if (op.send) continue;
    ncclWorld& w = *op.comm->world;
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

ncclResult_t submit(std::vector<Op> ops, cudaStream_t stream) {
  if (tGroupDepth > 0) {
    if (!tPending.empty() && tGroupStream != stream) return ncclInvalidUsage;
    tGroupStream = stream;
    tPending.insert(tPending.end(), ops.begin(), ops.end());
    return ncclSuccess;
  }
  squall_emu::enqueue(stream, [ops = std::move(ops)] { run(ops); });
  return ncclSuccess;
}

}  // namespace

const char* ncclGetErrorString(ncclResult_t result) {
  return result == ncclSuccess ? "no error" : "emulated NCCL error";
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++tGroupDepth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (tGroupDepth == 0) return ncclInvalidUsage;
  if (--tGroupDepth > 0 || tPending.empty()) return ncclSuccess;
  std::vector<Op> ops = std::move(tPending);
  tPending.clear();
  squall_emu::enqueue(tGroupStream, [ops = std::move(ops)] { run(ops); });
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  if (peer < 0 || peer >= comm->size || peer == comm->rank) return ncclInvalidArgument;
  return submit({Op{true, sendbuff, nullptr, count * sizeOf(datatype), peer, comm}}, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  if (peer < 0 || peer >= comm->size || peer == comm->rank) return ncclInvalidArgument;
  return submit({Op{false, nullptr, recvbuff, count * sizeOf(datatype), peer, comm}}, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
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

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  if (datatype != ncclFloat32 || op != ncclSum || tGroupDepth > 0) return ncclInvalidUsage;
  squall_emu::enqueue(stream, [=] {
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
  return ncclSuccess;
}

namespace squall_emu {

void ncclCreateWorld(int n, ncclComm_t* comms) {
  auto world = std::make_shared<ncclWorld>();
  for (int i = 0; i < n; ++i) comms[i] = new ncclComm{world, i, n};
}

void ncclDestroyWorld(int n, ncclComm_t* comms) {
  for (int i = 0; i < n; ++i) delete comms[i];
}

}  // namespace squall_emu
