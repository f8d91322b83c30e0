// The compressed allreduce of device buffers (squallCompressedAllReduceOnStream
// over NCCL, onebit, avg) against ncclAllReduce (fp32 sum) of the same buffer,
// with 2 and 4 processes sharing one GPU (tests/gpu/multiproc.h). Indicative
// only: ranks on one GPU share its SMs and memory bandwidth, and NCCL moves
// the data through device memory, not a network, so the compression buys
// little here; the numbers show the codec overhead and catch regressions.
// Rank 0 prints the median time of each over `iters` runs.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "squall/squall.h"
#include "tests/gpu/multiproc.h"

namespace {

using squall::gpu_test::Child;

int runChild(const Child& child) {
  const int n = child.nranks;
  const int rank = child.rank;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    if (rank == 0) std::printf("SKIP: no CUDA device\n");
    return squall::gpu_test::kSkip;
  }
  cudaSetDevice(0);
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  ncclUniqueId id;
  if (rank == 0) ncclGetUniqueId(&id);
  if (!squall::gpu_test::exchangeBlob(child, "nccl.id", &id, sizeof(id))) return 1;
  ncclComm_t nccl = nullptr;
  if (ncclCommInitRank(&nccl, n, id, rank) != ncclSuccess) return 1;
  squallComm_t comm = nullptr;
  if (squallCommInitFromNccl(&comm, nccl) != squallSuccess) return 1;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const int iters = 10;
  for (size_t count : {size_t{1} << 24, size_t{1} << 26}) {
    void* in = nullptr;
    void* out = nullptr;
    if (cudaMalloc(&in, count * 4) != cudaSuccess || cudaMalloc(&out, count * 4) != cudaSuccess)
      return 1;
    cudaMemset(in, 0x3c, count * 4);
    const squallCodecSpec_t spec = SQUALL_CODEC_SPEC_ONEBIT;
    squallCompressor_t compressor = nullptr;
    if (squallCompressorCreate(comm, count, &spec, &compressor) != squallSuccess) return 1;
    auto measure = [&](auto&& op) {
      std::vector<float> ms;
      for (int i = 0; i < iters + 2; ++i) {
        cudaEventRecord(start, stream);
        op();
        cudaEventRecord(stop, stream);
        cudaEventSynchronize(stop);
        float t = 0;
        cudaEventElapsedTime(&t, start, stop);
        if (i >= 2) ms.push_back(t);  // two warm-up runs
      }
      std::sort(ms.begin(), ms.end());
      return ms[ms.size() / 2];
    };
    bool ok = true;
    const float compressed = measure([&] {
      ok = ok && squallCompressedAllReduceOnStream(in, out, squallFloat32, squallAvg, compressor,
                                                   comm, stream) == squallSuccess;
    });
    const float plain = measure([&] {
      ok = ok && ncclAllReduce(in, out, count, ncclFloat32, ncclSum, nccl, stream) == ncclSuccess;
    });
    if (!ok) {
      std::printf("rank %d: FAIL: %s\n", rank, squallGetLastError());
      return 1;
    }
    if (rank == 0) {
      std::printf(
          "BENCH n=%d count=%zu (%.0f MiB fp32): compressed onebit %8.3f ms, "
          "ncclAllReduce %8.3f ms, ratio %.2fx\n",
          n, count, count * 4.0 / (1 << 20), compressed, plain, plain / compressed);
    }
    squallCompressorDestroy(compressor);
    cudaFree(in);
    cudaFree(out);
  }
  squallCommDestroy(comm);
  ncclCommDestroy(nccl);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Child child;
  if (squall::gpu_test::parseChild(argc, argv, &child)) return runChild(child);
  std::printf("GPU allreduce benchmark: median of 10 runs, ranks sharing one GPU (indicative)\n");
  std::fflush(stdout);
  int result = 0;
  for (int n : {2, 4}) {
    const int code = squall::gpu_test::spawn(n, {}, 18);
    if (code == squall::gpu_test::kSkip) return 0;
    if (code != 0) {
      std::printf("FAIL: the benchmark with %d processes failed\n", n);
      result = 1;
    }
  }
  return result;
}
