// The Squall side of one interposed communicator: a communicator over the
// application's MPI or NCCL communicator and the compressed allreduce on it.
// Everything here goes through Squall's core; no codec or algorithm lives in
// the interposer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "squall/squall.h"
#include "src/common/status.h"
#include "src/common/types.h"

namespace squall::preload {

class Compressor {
 public:
  explicit Compressor(squallCompressor_t c) : c_(c) {}
  ~Compressor();
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;
  squallCompressor_t get() const { return c_; }

 private:
  squallCompressor_t c_;
};

class Engine {
 public:
  // Collective over `mpiComm` (points to an MPI_Comm): duplicates it. The
  // transport reaches MPI only through functions the interposer does not define.
  static Status fromMpi(const void* mpiComm, std::unique_ptr<Engine>* out);
  // Borrows `ncclComm`; kUnsupported without CUDA and NCCL in this build.
  static Status fromNccl(void* ncclComm, std::unique_ptr<Engine>* out);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int size() const { return size_; }
  Status createCompressor(size_t count, const squallCodecSpec_t& spec,
                          std::unique_ptr<Compressor>* out);
  // Host buffers; *bytesSent is what this rank sent.
  Status compressedAllReduce(const void* in, void* out, DataType dtype, ReduceOp op, Compressor& c,
                             uint64_t* bytesSent);
  // Device buffers, enqueued on the caller's stream.
  Status compressedAllReduceOnStream(const void* in, void* out, DataType dtype, ReduceOp op,
                                     Compressor& c, void* stream, uint64_t* bytesSent);

 private:
  explicit Engine(squallComm_t comm);
  squallComm_t comm_;
  int size_ = 1;
};

}  // namespace squall::preload
