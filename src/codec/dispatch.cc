// Chooses the kernel table once per process. SQUALL_CODEC_ISA=auto (the
// default) measures: when the CPU has more than one SIMD implementation, each
// encodes the same buffer with error feedback (the hot kernel of every
// compressed call) a few times, interleaved, and the fastest median wins.
// The wider instructions are not always faster: AVX-512 can lower the clock,
// and encode+EF is bound by memory bandwidth, so on some CPUs AVX2 wins by a
// few percent. Every implementation emits the same bytes, so the choice only
// affects speed, and ranks may choose differently. A named ISA caps the
// choice instead (useful to compare implementations or to work around a
// suspected SIMD problem without rebuilding); the measurement costs about
// 10-30 ms once per process.
#include <strings.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <string>
#include <vector>

#include "src/codec/kernels.h"
#include "src/common/cpu.h"
#include "src/common/params.h"

namespace squall::codec {
namespace {

Isa bestIsa() {
  if (isaAvailable(Isa::kAvx512)) return Isa::kAvx512;
  if (isaAvailable(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

// Seconds of one onebit encode with error feedback of `count` elements.
double timeEncode(const KernelTable& table, const std::vector<float>& x,
                  const std::vector<float>& residual, std::vector<float>* next,
                  std::vector<uint8_t>* payload) {
  Spec spec;
  Layout layout;
  if (layoutFor(spec, x.size(), &layout) != Status::kOk) return 0.0;
  payload->resize(layout.payloadBytes);
  const EncodeJob job{x.data(), DType::kF32,     x.size(),     spec,
                      layout,   residual.data(), next->data(), payload->data()};
  const auto start = std::chrono::steady_clock::now();
  (void)table.codecs[static_cast<int>(CodecId::kOnebit)].encode(job);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Isa calibratedIsa(Isa best) {
  std::vector<Isa> candidates;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512})
    if (isa <= best && isaAvailable(isa)) candidates.push_back(isa);
  if (candidates.size() < 2) return best;
  // 2 Mi elements: 24 MiB of traffic per encode, beyond most caches, so the
  // measurement sees the memory-bound behaviour of real buffers.
  constexpr size_t kCount = size_t{1} << 21;
  constexpr int kRounds = 5;
  std::vector<float> x(kCount), residual(kCount), next(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    x[i] = static_cast<float>(static_cast<int>(i % 97) - 48) * 0.01f;
    residual[i] = static_cast<float>(static_cast<int>(i % 13) - 6) * 0.001f;
  }
  std::vector<uint8_t> payload;
  std::vector<std::vector<double>> seconds(candidates.size());
  for (size_t c = 0; c < candidates.size(); ++c)  // warm up: page in, clocks up
    (void)timeEncode(kernelsFor(candidates[c]), x, residual, &next, &payload);
  for (int round = 0; round < kRounds; ++round) {
    for (size_t c = 0; c < candidates.size(); ++c)
      seconds[c].push_back(timeEncode(kernelsFor(candidates[c]), x, residual, &next, &payload));
  }
  std::vector<double> medians;
  for (auto& s : seconds) {
    std::sort(s.begin(), s.end());
    medians.push_back(s[s.size() / 2]);
  }
  const size_t fastest = fastestCandidate(medians);
  for (size_t c = 0; c < candidates.size(); ++c) {
    SQUALL_INFO(Subsys::kCodec, "codec calibration: %s encode+EF %.2f GB/s%s",
                kernelsFor(candidates[c]).name,
                medians[c] > 0 ? 12.125 * kCount / medians[c] / 1e9 : 0.0,
                c == fastest ? " (chosen)" : "");
  }
  return candidates[fastest];
}

Isa chooseIsa() {
  const std::string wanted = paramString(Param::kCodecIsa);
  Isa cap = Isa::kAvx512;
  bool measure = true;
  if (strcasecmp(wanted.c_str(), "scalar") == 0) {
    cap = Isa::kScalar;
    measure = false;
  } else if (strcasecmp(wanted.c_str(), "avx2") == 0) {
    cap = Isa::kAvx2;
    measure = false;
  } else if (strcasecmp(wanted.c_str(), "avx512") == 0) {
    measure = false;
  } else if (strcasecmp(wanted.c_str(), "auto") != 0) {
    SQUALL_WARN(Subsys::kEnv,
                "SQUALL_CODEC_ISA=\"%s\" is not auto, scalar, avx2 or avx512; using auto",
                wanted.c_str());
  }
  const Isa best = bestIsa();
  const Isa capped = cap < best ? cap : best;
  const Isa chosen = measure ? calibratedIsa(capped) : capped;
  SQUALL_INFO(Subsys::kCodec, "codec implementation: %s (SQUALL_CODEC_ISA=%s%s)",
              kernelsFor(chosen).name, wanted.c_str(), measure ? ", measured" : "");
  return chosen;
}

}  // namespace

size_t fastestCandidate(const std::vector<double>& medianSeconds) {
  size_t best = 0;
  // Ties and unmeasurable (0 s) timings keep the earlier, narrower ISA.
  for (size_t c = 1; c < medianSeconds.size(); ++c)
    if (medianSeconds[c] > 0 && medianSeconds[c] < medianSeconds[best]) best = c;
  return best;
}

bool isaAvailable(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return true;
#if defined(__x86_64__)
    case Isa::kAvx2: return cpuFeatures().avx2;
    case Isa::kAvx512: return cpuFeatures().avx512;
#else
    default: return false;
#endif
  }
  return false;
}

const KernelTable& kernelsFor(Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::kAvx512 && isaAvailable(Isa::kAvx512)) return avx512Kernels();
  if (isa >= Isa::kAvx2 && isaAvailable(Isa::kAvx2)) return avx2Kernels();
#endif
  (void)isa;
  return scalarKernels();
}

const KernelTable& activeKernels() {
  static const KernelTable& table = kernelsFor(chooseIsa());
  return table;
}

}  // namespace squall::codec
