// The compressed allreduce of device buffers through the public C API, with
// 2 and 4 processes sharing one GPU (tests/gpu/multiproc.h):
//   * nccl:    squallCommInitFromNccl + squallCompressedAllReduceOnStream,
//              several calls (residuals evolve), avg out of place, sum in
//              place, int8, bf16 buffers;
//   * graph:   one call captured into a CUDA graph, replayed with new inputs;
//   * reduce-scatter: squallCompressedReduceScatterOnStream, int4 in place
//              and onebit out of place, call after call, against
//              testing::ReduceScatterReference (each rank its own piece);
//   * all-gather: squallCompressedAllGatherOnStream, int8, every rank's
//              codec round trip;
//   * staging: a TCP communicator given device pointers (pinned host staging);
//   * optimizer: squallOptimizerStepOnStream, APMSqueeze across the switch
//              with a NaN gradient in each phase, on the device over NCCL and
//              staged over TCP (the host optimizer): the parameters must be
//              the same bits (gradients are multiples of 2^-10, so the sums
//              of NCCL and of the host ring are exact in any order).
// Every rank compares its output, bit for bit, with the single-process
// reference simulation (tests/unit/compressed_reference.h), which every rank
// computes for all ranks' inputs; so outputs are also identical across ranks.
// Without a GPU every rank prints SKIP and the test exits 0.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "squall/optim.h"
#include "squall/squall.h"
#include "src/codec/numeric.h"
#include "tests/gpu/multiproc.h"
#include "tests/unit/compressed_reference.h"

namespace {

using squall::gpu_test::Child;

int gRank = 0;
int gFailures = 0;

#define EXPECT_TRUE(cond, ...)                                                    \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::printf("rank %d: FAIL %s:%d: %s: ", gRank, __FILE__, __LINE__, #cond); \
      std::printf(__VA_ARGS__);                                                   \
      std::printf("\n");                                                          \
      ++gFailures;                                                                \
      return;                                                                     \
    }                                                                             \
  } while (0)
#define CUDA_OK(expr) \
  EXPECT_TRUE((expr) == cudaSuccess, "%s", cudaGetErrorString(cudaGetLastError()))
#define SQ_OK(expr) EXPECT_TRUE((expr) == squallSuccess, "%s", squallGetLastError())

struct Case {
  const char* name;
  size_t count;
  squallCodecSpec_t spec;
  bool average;
  bool inPlace;
  squallDataType_t dtype;
  int calls;
  bool graph;
  const squallCodecSpec_t* gather = nullptr;  // the second round's code
};

squall::codec::Spec toSpec(const squallCodecSpec_t& s) {
  return squall::codec::Spec{static_cast<squall::codec::CodecId>(s.codec),
                             static_cast<squall::codec::Scale>(s.scale), s.blockSize};
}

// Inputs of every rank for call t (the same on every rank).
std::vector<std::vector<float>> inputsFor(const Case& c, int n, int t) {
  std::vector<std::vector<float>> in(static_cast<size_t>(n), std::vector<float>(c.count));
  for (int r = 0; r < n; ++r) {
    std::mt19937 rng(static_cast<unsigned>(1000 * t + r + 17));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (float& x : in[static_cast<size_t>(r)]) {
      x = dist(rng);
      if (c.dtype == squallBfloat16) x = squall::codec::bf16ToFloat(squall::codec::floatToBf16(x));
    }
  }
  return in;
}

void runCase(const Case& c, squallComm_t comm, int n, cudaStream_t stream) {
  const size_t esize = c.dtype == squallFloat32 ? 4 : 2;
  squall::testing::CompressedReference ref(n, c.count, toSpec(c.spec));
  squallCompressor_t compressor = nullptr;
  SQ_OK(squallCompressorCreate(comm, c.count, &c.spec, &compressor));
  if (c.gather != nullptr) {
    ref.setGatherSpec(toSpec(*c.gather));
    SQ_OK(squallCompressorSetGatherCodec(compressor, c.gather));
  }
  void* in = nullptr;
  void* out = nullptr;
  CUDA_OK(cudaMalloc(&in, c.count * esize));
  CUDA_OK(cudaMalloc(&out, c.count * esize));
  void* target = c.inPlace ? in : out;
  const squallRedOp_t op = c.average ? squallAvg : squallSum;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<uint8_t> host(c.count * esize);
  for (int t = 0; t < c.calls; ++t) {
    const auto inputs = inputsFor(c, n, t);
    const std::vector<float> expected = ref.twoPhase(inputs, c.average);
    const std::vector<float>& mine = inputs[static_cast<size_t>(gRank)];
    if (esize == 4) {
      std::memcpy(host.data(), mine.data(), host.size());
    } else {
      auto* h = reinterpret_cast<uint16_t*>(host.data());
      for (size_t i = 0; i < c.count; ++i) h[i] = squall::codec::floatToBf16(mine[i]);
    }
    CUDA_OK(cudaMemcpyAsync(in, host.data(), host.size(), cudaMemcpyHostToDevice, stream));
    if (c.graph) {
      if (t == 0) {
        CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        const squallResult_t res =
            squallCompressedAllReduceOnStream(in, target, c.dtype, op, compressor, comm, stream);
        CUDA_OK(cudaStreamEndCapture(stream, &graph));
        SQ_OK(res);
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      }
      CUDA_OK(cudaGraphLaunch(exec, stream));
    } else {
      SQ_OK(squallCompressedAllReduceOnStream(in, target, c.dtype, op, compressor, comm, stream));
    }
    CUDA_OK(cudaMemcpyAsync(host.data(), target, host.size(), cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < c.count; ++i) {
      float got, want = expected[i];
      if (esize == 4) {
        std::memcpy(&got, host.data() + 4 * i, 4);
      } else {
        got = squall::codec::bf16ToFloat(reinterpret_cast<const uint16_t*>(host.data())[i]);
        want = squall::codec::bf16ToFloat(squall::codec::floatToBf16(want));
      }
      uint32_t a, b;
      std::memcpy(&a, &got, 4);
      std::memcpy(&b, &want, 4);
      EXPECT_TRUE(a == b, "%s call %d element %zu: %.9g, reference %.9g", c.name, t, i, got, want);
    }
  }
  squallCompressorStats_t stats;
  SQ_OK(squallCompressorGetStats(compressor, &stats));
  EXPECT_TRUE(
      stats.calls == static_cast<uint64_t>(c.graph ? 1 : c.calls) && stats.skippedCalls == 0,
      "%s: stats calls %llu skipped %llu", c.name, static_cast<unsigned long long>(stats.calls),
      static_cast<unsigned long long>(stats.skippedCalls));
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaFree(in);
  cudaFree(out);
  SQ_OK(squallCompressorDestroy(compressor));
  std::printf("rank %d: PASS %s (n=%d, count %zu)\n", gRank, c.name, n, c.count);
}

// Bits of device floats against expected ones (count elements).
void compareFloats(const char* name, int t, const float* device, const std::vector<float>& want,
                   cudaStream_t stream) {
  std::vector<float> got(want.size());
  CUDA_OK(cudaMemcpyAsync(got.data(), device, got.size() * 4, cudaMemcpyDeviceToHost, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  for (size_t i = 0; i < want.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    EXPECT_TRUE(a == b, "%s call %d element %zu: %.9g, reference %.9g", name, t, i, got[i],
                want[i]);
  }
}

// The compressed reduce-scatter of n x recvcount fp32 elements, avg.
void runReduceScatter(const char* name, size_t recvcount, const squallCodecSpec_t& spec,
                      bool inPlace, squallComm_t comm, int n, cudaStream_t stream) {
  const size_t total = recvcount * static_cast<size_t>(n);
  squall::testing::ReduceScatterReference ref(n, recvcount, toSpec(spec));
  squallCompressor_t compressor = nullptr;
  SQ_OK(squallCompressorCreateReduceScatter(comm, recvcount, &spec, &compressor));
  float* in = nullptr;
  float* out = nullptr;
  CUDA_OK(cudaMalloc(&in, total * 4));
  CUDA_OK(cudaMalloc(&out, recvcount * 4));
  float* target = inPlace ? in + static_cast<size_t>(gRank) * recvcount : out;
  const Case shape{name, total, spec, true, inPlace, squallFloat32, 3, false};
  for (int t = 0; t < 3; ++t) {
    const auto inputs = inputsFor(shape, n, t);
    const auto expected = ref.run(inputs, true);
    CUDA_OK(cudaMemcpyAsync(in, inputs[static_cast<size_t>(gRank)].data(), total * 4,
                            cudaMemcpyHostToDevice, stream));
    SQ_OK(squallCompressedReduceScatterOnStream(in, target, recvcount, squallFloat32, squallAvg,
                                                compressor, comm, stream));
    compareFloats(name, t, target, expected[static_cast<size_t>(gRank)], stream);
  }
  cudaFree(in);
  cudaFree(out);
  SQ_OK(squallCompressorDestroy(compressor));
  std::printf("rank %d: PASS %s (n=%d, recvcount %zu)\n", gRank, name, n, recvcount);
}

// The quantized all-gather of count fp32 elements per rank, in place.
void runAllGather(const char* name, size_t count, const squallCodecSpec_t& spec, squallComm_t comm,
                  int n, cudaStream_t stream) {
  squallCompressor_t compressor = nullptr;
  SQ_OK(squallCompressorCreateAllGather(comm, count, &spec, &compressor));
  const Case shape{name, count, spec, false, true, squallFloat32, 1, false};
  const auto inputs = inputsFor(shape, n, 0);
  size_t slot = 0;
  SQ_OK(squallEncodedSize(&spec, count, &slot));
  std::vector<float> want(count * static_cast<size_t>(n));
  std::vector<uint8_t> encoded(slot);
  for (int r = 0; r < n; ++r) {
    size_t written = 0;
    SQ_OK(squallEncode(&spec, inputs[static_cast<size_t>(r)].data(), squallFloat32, count, nullptr,
                       encoded.data(), slot, &written));
    SQ_OK(
        squallDecode(encoded.data(), written, want.data() + static_cast<size_t>(r) * count, count));
  }
  float* out = nullptr;
  CUDA_OK(cudaMalloc(&out, want.size() * 4));
  float* mine = out + static_cast<size_t>(gRank) * count;
  CUDA_OK(cudaMemcpyAsync(mine, inputs[static_cast<size_t>(gRank)].data(), count * 4,
                          cudaMemcpyHostToDevice, stream));
  SQ_OK(
      squallCompressedAllGatherOnStream(mine, out, count, squallFloat32, compressor, comm, stream));
  compareFloats(name, 0, out, want, stream);
  cudaFree(out);
  SQ_OK(squallCompressorDestroy(compressor));
  std::printf("rank %d: PASS %s (n=%d, count %zu)\n", gRank, name, n, count);
}

// Runs the optimizer steps on device buffers; *out gets the parameters.
void runOptimizer(squallComm_t comm, cudaStream_t stream, std::vector<float>* out) {
  const size_t count = 3000;
  squallOptimConfig_t cfg = SQUALL_OPTIM_CONFIG_INIT;
  cfg.warmupSteps = 3;
  cfg.weightDecay = 0.01f;
  squallOptimizer_t opt = nullptr;
  SQ_OK(squallOptimizerCreate(comm, count, &cfg, &opt));
  float *dx = nullptr, *dg = nullptr;
  CUDA_OK(cudaMalloc(&dx, count * sizeof(float)));
  CUDA_OK(cudaMalloc(&dg, count * sizeof(float)));
  std::vector<float> x(count), g(count);
  std::mt19937 init(42);
  std::uniform_real_distribution<float> xdist(-1.0f, 1.0f);
  for (float& v : x) v = xdist(init);
  CUDA_OK(cudaMemcpy(dx, x.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  for (int step = 0; step < 8; ++step) {
    std::mt19937 rng(static_cast<uint32_t>(1000 * step + gRank));
    std::uniform_int_distribution<int> dist(-1024, 1024);
    for (float& v : g) v = static_cast<float>(dist(rng)) / 1024.0f;
    if ((step == 1 || step == 5) && gRank == 1) g[17] = std::nanf("");
    CUDA_OK(cudaMemcpy(dg, g.data(), count * sizeof(float), cudaMemcpyHostToDevice));
    SQ_OK(squallOptimizerStepOnStream(opt, dx, dg, 0.0f, stream));
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  squallOptimInfo_t info;
  SQ_OK(squallOptimizerGetInfo(opt, &info));
  EXPECT_TRUE(info.step == 8 && info.skippedSteps == 2 && info.phase == squallPhaseCompressed,
              "optimizer info: step %lld skipped %llu phase %d", static_cast<long long>(info.step),
              static_cast<unsigned long long>(info.skippedSteps), static_cast<int>(info.phase));
  out->resize(count);
  CUDA_OK(cudaMemcpy(out->data(), dx, count * sizeof(float), cudaMemcpyDeviceToHost));
  cudaFree(dx);
  cudaFree(dg);
  SQ_OK(squallOptimizerDestroy(opt));
}

void runChild(const Child& child, cudaStream_t stream) {
  const int n = child.nranks;
  const squallCodecSpec_t onebit = SQUALL_CODEC_SPEC_ONEBIT;
  const squallCodecSpec_t int8 = {squallCodecInt8, squallScaleMeanAbs, 256};
  const size_t big = static_cast<size_t>(n) * 2048 * 24 + 77;  // a short last chunk

  // Device path over NCCL.
  ncclUniqueId id;
  if (gRank == 0) EXPECT_TRUE(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
  EXPECT_TRUE(squall::gpu_test::exchangeBlob(child, "nccl.id", &id, sizeof(id)), "nccl id");
  ncclComm_t nccl = nullptr;
  EXPECT_TRUE(ncclCommInitRank(&nccl, n, id, gRank) == ncclSuccess, "ncclCommInitRank");
  squallComm_t comm = nullptr;
  SQ_OK(squallCommInitFromNccl(&comm, nccl));
  const char* transport = nullptr;
  SQ_OK(squallCommTransport(comm, &transport));
  EXPECT_TRUE(std::strcmp(transport, "nccl") == 0, "transport %s", transport);
  runCase({"nccl-onebit-avg", big, onebit, true, false, squallFloat32, 3, false}, comm, n, stream);
  runCase({"nccl-onebit-sum-inplace", 1000, onebit, false, true, squallFloat32, 2, false}, comm, n,
          stream);
  runCase({"nccl-int8-avg", big, int8, true, false, squallFloat32, 2, false}, comm, n, stream);
  const squallCodecSpec_t int4 = {squallCodecInt4, squallScaleMeanAbs, 256};
  const squallCodecSpec_t int8Wide = {squallCodecInt8, squallScaleMeanAbs, 2048};
  runCase({"nccl-int4-int8-gather", big, int4, true, false, squallFloat32, 3, false, &int8Wide},
          comm, n, stream);
  runCase({"nccl-bf16-buffers", big, onebit, true, false, squallBfloat16, 2, false}, comm, n,
          stream);
  runCase({"nccl-graph-replay", big, onebit, true, false, squallFloat32, 3, true}, comm, n, stream);
  runReduceScatter("nccl-reduce-scatter-int4-inplace", 2048 * 12 + 77, int4, true, comm, n, stream);
  runReduceScatter("nccl-reduce-scatter-onebit", 5000, onebit, false, comm, n, stream);
  runAllGather("nccl-all-gather-int8", 2048 * 12 + 77, int8, comm, n, stream);
  std::vector<float> deviceParams;
  runOptimizer(comm, stream, &deviceParams);
  SQ_OK(squallCommDestroy(comm));
  ncclCommDestroy(nccl);

  // Host staging: a TCP communicator given device pointers.
  squallUniqueId sid;
  if (gRank == 0) SQ_OK(squallGetUniqueId(&sid));
  EXPECT_TRUE(squall::gpu_test::exchangeBlob(child, "squall.id", &sid, sizeof(sid)), "squall id");
  squallConfig_t config = SQUALL_CONFIG_INIT;
  config.transport = squallTransportTcp;
  squallComm_t host = nullptr;
  SQ_OK(squallCommInitRank(&host, n, sid, gRank, &config));
  runCase({"staging-tcp-onebit-avg", big, onebit, true, false, squallFloat32, 2, false}, host, n,
          stream);
  SQ_OK(squallCommDestroy(host));

  // The optimizer staged over TCP (the host optimizer), with the compressed
  // allreduce pinned to the two-phase algorithm that the device runs (auto
  // picks the all-gather one for small buffers, a different result).
  setenv("SQUALL_COMPRESSED_ALGO", "twophase", 1);
  if (gRank == 0) SQ_OK(squallGetUniqueId(&sid));
  EXPECT_TRUE(squall::gpu_test::exchangeBlob(child, "squall2.id", &sid, sizeof(sid)), "id");
  SQ_OK(squallCommInitRank(&host, n, sid, gRank, &config));
  std::vector<float> hostParams;
  runOptimizer(host, stream, &hostParams);
  EXPECT_TRUE(!deviceParams.empty() && deviceParams.size() == hostParams.size() &&
                  std::memcmp(deviceParams.data(), hostParams.data(),
                              hostParams.size() * sizeof(float)) == 0,
              "optimizer: the device parameters differ from the host optimizer's");
  std::printf("rank %d: PASS optimizer-device-vs-host (n=%d)\n", gRank, n);
  SQ_OK(squallCommDestroy(host));
}

}  // namespace

int main(int argc, char** argv) {
  Child child;
  if (!squall::gpu_test::parseChild(argc, argv, &child)) {
    int result = 0;
    for (int n : {2, 4}) {
      std::printf("== %d processes sharing the GPU\n", n);
      std::fflush(stdout);
      const int code = squall::gpu_test::spawn(n, {}, 27);
      if (code == squall::gpu_test::kSkip) {
        std::printf("SKIP: no usable GPU (see the ranks' messages above)\n");
        return 0;
      }
      std::printf("%s: %d processes\n", code == 0 ? "PASS" : "FAIL", n);
      if (code != 0) result = 1;
    }
    return result;
  }
  gRank = child.rank;
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("rank %d: SKIP: no CUDA device (%s)\n", gRank,
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return squall::gpu_test::kSkip;
  }
  if (cudaSetDevice(0) != cudaSuccess) return 1;
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 1;
  runChild(child, stream);
  cudaStreamDestroy(stream);
  std::fflush(stdout);
  return gFailures == 0 ? 0 : 1;
}
