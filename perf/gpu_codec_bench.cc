// Throughput of the CUDA codec kernels against the device's own copy speed.
//
// A device-to-device cudaMemcpy of the same element count, measured in the
// same run, gives the achievable bandwidth B (read + write bytes per second).
// Each codec operation moves a known number of bytes (inputs read, residual
// read and written, payload written or read, output written); the time B
// implies for those bytes is the operation's bound, and the report shows the
// measured time as a percentage of that bound (100% = as fast as a copy
// moving the same bytes). The target is at least 70%.
//
//   gpu_codec_bench [--elements 64M,256M] [--iters 20] [--block 2048]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "src/codec/codec.h"
#include "src/codec/cuda/cuda_codec.h"

using namespace squall::codec;

namespace {

#define CHECK_CUDA(expr)                                                                      \
  do {                                                                                        \
    const cudaError_t e_ = (expr);                                                            \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "FAIL: %s: %s (%s:%d)\n", #expr, cudaGetErrorString(e_), __FILE__, \
                   __LINE__);                                                                 \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

#define CHECK_OK(expr)                                                       \
  do {                                                                       \
    if ((expr) != squall::Status::kOk) {                                     \
      std::fprintf(stderr, "FAIL: %s (%s:%d)\n", #expr, __FILE__, __LINE__); \
      std::exit(1);                                                          \
    }                                                                        \
  } while (0)

// Median milliseconds of `iters` timed runs of fn after 3 warm-ups.
template <typename Fn>
double timeMs(cudaStream_t stream, int iters, Fn fn) {
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    fn();
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

size_t parseCount(const std::string& s) {
  size_t mult = 1;
  std::string digits = s;
  if (!s.empty() && (s.back() == 'M' || s.back() == 'm')) {
    mult = size_t{1} << 20;
    digits.pop_back();
  } else if (!s.empty() && (s.back() == 'K' || s.back() == 'k')) {
    mult = size_t{1} << 10;
    digits.pop_back();
  }
  return std::strtoull(digits.c_str(), nullptr, 10) * mult;
}

int gBelow = 0;

void report(const char* op, size_t n, double ms, double bytes, double copyBytesPerMs) {
  const double boundMs = bytes / copyBytesPerMs;
  const double pct = 100.0 * boundMs / ms;
  if (pct < 70.0) ++gBelow;
  std::printf("%-34s n=%-10zu %8.3f ms  %7.1f GB/s  %5.1f%% of copy bound%s\n", op, n, ms,
              bytes / ms / 1e6, pct, pct < 70.0 ? "  (below 70% target)" : "");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes = {size_t{64} << 20, size_t{256} << 20};
  int iters = 20;
  uint32_t block = kDefaultBlock;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--elements") {
      sizes.clear();
      std::string list = argv[i + 1];
      size_t pos = 0;
      while (pos <= list.size()) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        sizes.push_back(parseCount(list.substr(pos, comma - pos)));
        pos = comma + 1;
      }
    } else if (arg == "--iters") {
      iters = std::atoi(argv[i + 1]);
    } else if (arg == "--block") {
      block = static_cast<uint32_t>(std::atoi(argv[i + 1]));
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("GPU: %s, block %u, median of %d runs\n", prop.name, block, iters);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  for (size_t n : sizes) {
    const Spec onebit{CodecId::kOnebit, Scale::kMeanAbs, block};
    const Spec int8{CodecId::kInt8, Scale::kMeanAbs, block};
    const Spec fp16{CodecId::kFp16, Scale::kMeanAbs, block};
    size_t onebitBytes = 0, int8Bytes = 0, fp16Bytes = 0;
    CHECK_OK(encodedSize(onebit, n, &onebitBytes));
    CHECK_OK(encodedSize(int8, n, &int8Bytes));
    CHECK_OK(encodedSize(fp16, n, &fp16Bytes));
    void *in = nullptr, *out = nullptr, *dst = nullptr;
    CHECK_CUDA(cudaMalloc(&in, n * 4));
    CHECK_CUDA(cudaMalloc(&dst, n * 4));
    CHECK_CUDA(cudaMalloc(&out, std::max({onebitBytes, int8Bytes, fp16Bytes})));
    CHECK_CUDA(cudaMemset(in, 0x3f, n * 4));   // 0x3f3f3f3f: 0.747f, bf16 0x3f3f: 0.746f
    CHECK_CUDA(cudaMemset(dst, 0x3f, n * 4));  // finite accumulator
    DeviceResidual* residual = nullptr;
    CHECK_OK(cudaResidualCreate(n, &residual));
    size_t bytes = 0;

    const double copyMs = timeMs(stream, iters, [&] {
      CHECK_CUDA(cudaMemcpyAsync(dst, in, n * 4, cudaMemcpyDeviceToDevice, stream));
    });
    const double copyBytesPerMs = 2.0 * n * 4 / copyMs;
    std::printf("%-34s n=%-10zu %8.3f ms  %7.1f GB/s  (reference)\n", "cudaMemcpy D2D fp32", n,
                copyMs, copyBytesPerMs / 1e6);

    struct Case {
      const char* name;
      Spec spec;
      DType dtype;
      bool ef;
      size_t encoded;
    };
    const Case cases[] = {
        {"encode+EF onebit fp32", onebit, DType::kF32, true, onebitBytes},
        {"encode+EF onebit bf16", onebit, DType::kBf16, true, onebitBytes},
        {"encode onebit fp32 (no EF)", onebit, DType::kF32, false, onebitBytes},
        {"encode+EF int8 fp32", int8, DType::kF32, true, int8Bytes},
        {"encode+EF fp16 fp32", fp16, DType::kF32, true, fp16Bytes},
    };
    for (const Case& c : cases) {
      const double ms = timeMs(stream, iters, [&] {
        CHECK_OK(cudaEncode(c.spec, in, c.dtype, n, c.ef ? residual : nullptr, out, c.encoded,
                            stream, &bytes));
      });
      const double traffic = static_cast<double>(n) * (c.dtype == DType::kF32 ? 4 : 2) +
                             (c.ef ? 8.0 * n : 0.0) + static_cast<double>(c.encoded);
      report(c.name, n, ms, traffic, copyBytesPerMs);
    }
    for (const Case& c : {cases[0], cases[3]}) {
      CHECK_OK(cudaEncode(c.spec, in, DType::kF32, n, nullptr, out, c.encoded, stream, &bytes));
      const double decMs = timeMs(stream, iters, [&] {
        CHECK_OK(cudaDecode(c.spec, out, c.encoded, static_cast<float*>(dst), n, stream, nullptr));
      });
      const std::string dname = std::string("decode ") + codecName(c.spec.codec);
      report(dname.c_str(), n, decMs, 4.0 * n + c.encoded, copyBytesPerMs);
      const double accMs = timeMs(stream, iters, [&] {
        CHECK_OK(cudaDecodeAccumulate(c.spec, out, c.encoded, static_cast<float*>(dst), n, stream,
                                      nullptr));
      });
      const std::string aname = std::string("decode-accumulate ") + codecName(c.spec.codec);
      report(aname.c_str(), n, accMs, 8.0 * n + c.encoded, copyBytesPerMs);
    }
    cudaResidualDestroy(residual);
    CHECK_CUDA(cudaFree(in));
    CHECK_CUDA(cudaFree(out));
    CHECK_CUDA(cudaFree(dst));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("BENCH %s: %d measurement(s) below 70%% of the copy bound\n",
              gBelow == 0 ? "TARGET MET" : "TARGET MISSED", gBelow);
  return 0;
}
