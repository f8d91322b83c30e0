// codec_bench: throughput of the block codecs' kernels (onebit, int2, int4,
// int8; fp32 input) for each implementation and thread count, next to a
// STREAM-style copy measured in the same run, since the kernels are meant to
// be memory-bound.
//
//   codec_bench [--sizes=1M,4M,...] [--iters=N] [--impl=scalar,avx2,avx512]
//               [--codecs=onebit,int2,int4,int8] [--threads=1,2,4,8] [--full]
//               [--json] [--summary]
//   codec_bench --calibrate[=N] [--segment=256K]
//
// Each figure is the median of --iters timed runs after one warm-up run, on
// buffers whose pages were touched beforehand; per codec, the configurations
// (impl x threads) run interleaved, one run of each per iteration in rotating order,
// so that load from other processes falls on all of them alike, and each
// configuration's per-iteration time ratio to the first one (the "paired"
// column) is reported next to the medians. GB/s counts the bytes a kernel
// must move (reads plus writes, as STREAM does), and "% copy" relates that to
// the copy's GB/s, the bandwidth a streaming kernel can hope for. Threads run
// the library's multi-threaded codec (src/codec/parallel.h), whose bytes are
// those of one thread.
//
// --calibrate runs the library's implementation calibration (calibrate.h) N
// times on --segment-element segments and prints every round's paired
// figures and each run's decision, then what this process would use.
#include <emmintrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "src/codec/calibrate.h"
#include "src/codec/kernels.h"
#include "src/codec/numeric.h"
#include "src/codec/parallel.h"

namespace squall::codec {
namespace {

struct Options {
  std::vector<size_t> sizes;
  int iters = 7;
  std::vector<Isa> impls;
  std::vector<CodecId> codecs;
  std::vector<int> threads;
  bool json = false;
  bool summary = false;
  int calibrate = 0;  // runs of the calibration; 0: none
  size_t segment = size_t{1} << 18;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "codec_bench: %s\n"
               "usage: codec_bench [--sizes=1M,4M,16M,64M] [--iters=N] "
               "[--impl=scalar,avx2,avx512] [--codecs=onebit,int2,int4,int8]\n"
               "                   [--threads=1,2,4,8] [--full] [--json] [--summary]\n"
               "       codec_bench --calibrate[=N] [--segment=256K]\n",
               why);
  std::exit(2);
}

// "64M" = 64 * 2^20 elements; "1000" = 1000 elements.
size_t parseSize(const std::string& s) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) usage(("bad size \"" + s + "\"").c_str());
  size_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = size_t{1} << 10;
  if (*end == 'M' || *end == 'm') scale = size_t{1} << 20;
  if (*end == 'G' || *end == 'g') scale = size_t{1} << 30;
  return static_cast<size_t>(v) * scale;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = std::min(s.find(',', start), s.size());
    if (comma > start) parts.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return parts;
}

Options parseOptions(int argc, char** argv) {
  Options o;
  bool full = false;
  bool sizesGiven = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      return arg.compare(0, n, flag) == 0 ? arg.c_str() + n : nullptr;
    };
    if (const char* v = value("--sizes=")) {
      for (const std::string& s : split(v)) o.sizes.push_back(parseSize(s));
      sizesGiven = true;
    } else if (const char* v = value("--iters=")) {
      o.iters = std::atoi(v);
      if (o.iters < 1) usage("--iters must be at least 1");
    } else if (const char* v = value("--impl=")) {
      for (const std::string& s : split(v)) {
        if (s == "scalar")
          o.impls.push_back(Isa::kScalar);
        else if (s == "avx2")
          o.impls.push_back(Isa::kAvx2);
        else if (s == "avx512")
          o.impls.push_back(Isa::kAvx512);
        else
          usage(("unknown implementation \"" + s + "\"").c_str());
      }
    } else if (const char* v = value("--codecs=")) {
      for (const std::string& s : split(v)) {
        if (s == "onebit")
          o.codecs.push_back(CodecId::kOnebit);
        else if (s == "int2")
          o.codecs.push_back(CodecId::kInt2);
        else if (s == "int4")
          o.codecs.push_back(CodecId::kInt4);
        else if (s == "int8")
          o.codecs.push_back(CodecId::kInt8);
        else
          usage(("unknown codec \"" + s + "\" (onebit, int2, int4, int8)").c_str());
      }
    } else if (const char* v = value("--threads=")) {
      for (const std::string& t : split(v)) {
        const int n = std::atoi(t.c_str());
        if (n < 1 || n > 64) usage("--threads takes counts from 1 to 64");
        o.threads.push_back(n);
      }
    } else if (arg == "--calibrate") {
      o.calibrate = 1;
    } else if (const char* v = value("--calibrate=")) {
      o.calibrate = std::atoi(v);
      if (o.calibrate < 1) usage("--calibrate= takes a positive count");
    } else if (const char* v = value("--segment=")) {
      o.segment = parseSize(v);
      if (o.segment < kDefaultBlock) usage("--segment must be at least one block (2048)");
    } else if (arg == "--full") {
      full = true;
    } else if (arg == "--json") {
      o.json = true;
    } else if (arg == "--summary") {
      o.summary = true;
    } else {
      usage(("unknown argument \"" + arg + "\"").c_str());
    }
  }
  if (!sizesGiven) {
    if (o.summary)
      o.sizes = {size_t{16} << 20};
    else
      o.sizes = {size_t{1} << 20, size_t{4} << 20, size_t{16} << 20, size_t{64} << 20};
    if (full) o.sizes.push_back(size_t{256} << 20);
  }
  if (o.summary && o.iters == 7) o.iters = 3;
  if (o.impls.empty()) o.impls = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};
  if (o.codecs.empty())
    o.codecs = {CodecId::kOnebit, CodecId::kInt2, CodecId::kInt4, CodecId::kInt8};
  if (o.threads.empty()) o.threads = {1};
  return o;
}

// ---- buffers and timing --------------------------------------------------

// A page-touched, 64-byte-aligned buffer (touching keeps first-touch page
// faults out of the timed runs).
struct Buffer {
  explicit Buffer(size_t bytes) : bytes(bytes) {
    data = static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    if (data == nullptr) usage("out of memory");
    std::memset(data, 0, bytes);
  }
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* floats() const { return reinterpret_cast<float*>(data); }
  uint8_t* data;
  size_t bytes;
};

template <typename F>
double medianSeconds(int iters, F&& run) {
  run();  // warm-up: caches, TLB, branch predictors
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const auto t1 = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <typename F>
double secondsOf(F&& run) {
  const auto t0 = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double medianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 != 0 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// STREAM "copy" with explicit 16-byte loads and stores, so that the compiler
// does not turn it into a call to memcpy (whose non-temporal stores would
// measure something else).
void copyFloats(const float* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128 a = _mm_load_ps(src + i);
    const __m128 b = _mm_load_ps(src + i + 4);
    const __m128 c = _mm_load_ps(src + i + 8);
    const __m128 d = _mm_load_ps(src + i + 12);
    _mm_store_ps(dst + i, a);
    _mm_store_ps(dst + i + 4, b);
    _mm_store_ps(dst + i + 8, c);
    _mm_store_ps(dst + i + 12, d);
  }
  for (; i < n; ++i) dst[i] = src[i];
}

// ---- the measurements ------------------------------------------------------

struct Result {
  const char* codec;
  const char* impl;
  int threads;
  const char* kernel;
  size_t count;
  double seconds;                 // median
  double minSeconds, maxSeconds;  // range over the iterations
  double paired;                  // median per-iteration time ratio to the run's first config
  int pairedWins;                 // iterations this config was faster than the first
  double bytes;                   // memory traffic the kernel must cause
  double copyGbps;                // the same run's copy bandwidth
  double gbps() const { return bytes / seconds / 1e9; }
  double elementsPerSecond() const { return static_cast<double>(count) / seconds; }
  double percentOfCopy() const { return 100.0 * gbps() / copyGbps; }
};

// Kernel rows measured per configuration, in this order: encode+EF, decode,
// accumulate, their streaming-store forms, the sum of two encodings, and
// encode+EF with the residual stored in bf16 (codec.h, ResidualStore).
constexpr int kKernelRows = 8;

struct SizeRun {
  double copyGbps = 0;
  int iters = 0;
  std::vector<Result> results;  // per codec, per config: kKernelRows rows
};

// The fp32 buffers every codec of one size shares.
struct Floats {
  explicit Floats(size_t count)
      : x(count * 4),
        eIn(count * 4),
        eOut(count * 4),
        out(count * 4),
        hIn(count * 2),
        hOut(count * 2) {}
  Buffer x, eIn, eOut, out;
  Buffer hIn, hOut;  // the residual's halves in bf16
};

// Bits per element in a block codec's data section.
size_t codeBits(CodecId codec) { return codec == CodecId::kOnebit ? 1 : intBits(codec); }

// Measures one codec's kernels at `count` elements into run.results; the
// configurations (impl x threads) are interleaved, paired to the first.
void measureCodec(const Options& o, size_t count, CodecId codec, const Floats& f, SizeRun& run) {
  const Spec spec{codec, Scale::kMeanAbs, kDefaultBlock};
  Layout layout;
  if (layoutFor(spec, count, &layout) != Status::kOk) usage("size too large");
  const Buffer& x = f.x;
  const Buffer& eIn = f.eIn;
  const Buffer& eOut = f.eOut;
  const Buffer& out = f.out;
  Buffer payload(layout.payloadBytes);
  const Bf16Residual bf16{reinterpret_cast<const uint16_t*>(f.hIn.data),
                          reinterpret_cast<uint16_t*>(f.hOut.data)};
  EncodeJob ejobBf16{x.data, DType::kF32, count, spec, layout, nullptr, nullptr, payload.data};

  struct Config {
    const KernelTable* table;
    int threads;
  };
  std::vector<Config> configs;
  for (Isa isa : o.impls) {
    if (!isaAvailable(isa)) continue;
    for (int t : o.threads) configs.push_back({&kernelsFor(isa), t});
  }
  const EncodeJob ejob{x.data, DType::kF32,  count,         spec,
                       layout, eIn.floats(), eOut.floats(), payload.data};
  const DecodeJob djob{payload.data, count, spec, layout, out.floats()};
  EncodeJob ejobStream = ejob;
  ejobStream.stream = true;
  DecodeJob djobStream = djob;
  djobStream.stream = true;
  // The all-gather's last step at 2 ranks: the sum of two encodings into the
  // output, as the separate passes did it (decode a 1 MiB segment, then
  // decode-accumulate the other encoding into it while it is in the L2
  // cache), and fused (parallelDecodeSum: L1 tiles, one streaming store).
  const uint8_t* two[] = {payload.data, payload.data};
  const SumJob sum{two, 2, count, spec, layout, 0};
  constexpr size_t kSegment = size_t{1} << 18;
  auto separateSum = [&](const CodecKernels& k, int threads) {
    for (size_t at = 0; at < count; at += kSegment) {
      const size_t m = std::min(kSegment, count - at);
      DecodeJob seg{payload.data, m, spec, layout, out.floats() + at};
      // A segment of whole blocks seen as its own call (parallel.cc, rebase).
      Layout l = layout;
      l.blocks = (m + spec.block - 1) / spec.block;
      l.dataOffset = layout.dataOffset + at * codeBits(codec) / 8 - (at / spec.block) * 4;
      seg.payload = payload.data + (at / spec.block) * 4;
      seg.layout = l;
      parallelDecode(k.decode, seg, threads);
      parallelDecode(k.accumulate, seg, threads);
    }
  };
  constexpr int kKernels = kKernelRows;
  // times[config][kernel][iteration]
  std::vector<std::array<std::vector<double>, kKernels>> times(configs.size());
  auto once = [&](const Config& c, int kernel) {
    const CodecKernels& k = c.table->codecs[static_cast<int>(codec)];
    switch (kernel) {
      case 0: return secondsOf([&] { (void)parallelEncode(k.encode, ejob, c.threads); });
      case 1: return secondsOf([&] { parallelDecode(k.decode, djob, c.threads); });
      case 2: return secondsOf([&] { parallelDecode(k.accumulate, djob, c.threads); });
      case 3: return secondsOf([&] { (void)parallelEncode(k.encode, ejobStream, c.threads); });
      case 4: return secondsOf([&] { parallelDecode(k.decode, djobStream, c.threads); });
      case 5: return secondsOf([&] { separateSum(k, c.threads); });
      case 6: return secondsOf([&] { parallelDecodeSum(k, sum, out.floats(), true, c.threads); });
      default:
        return secondsOf([&] { (void)parallelEncode(k.encode, ejobBf16, c.threads, &bf16); });
    }
  };
  for (const Config& c : configs)
    for (int kernel = 0; kernel < kKernels; ++kernel) (void)once(c, kernel);  // warm-up
  for (int i = 0; i < o.iters; ++i) {
    for (size_t j = 0; j < configs.size(); ++j) {
      const size_t c = (j + static_cast<size_t>(i)) % configs.size();  // rotating order
      for (int kernel = 0; kernel < kKernels; ++kernel)
        times[c][kernel].push_back(once(configs[c], kernel));
    }
  }
  const double n = static_cast<double>(count);
  const double payloadBytes = static_cast<double>(layout.payloadBytes);
  // Read x and e, write e and the payload; read the payload, write the
  // output; read the payload and the accumulator, write the accumulator.
  // The streaming rows move the same bytes, without the read of each written
  // line; a sum of two encodings must read both and write the output once;
  // a bf16 residual is half the residual's bytes.
  const double traffic[kKernels] = {12.0 * n + payloadBytes,      4.0 * n + payloadBytes,
                                    8.0 * n + payloadBytes,       12.0 * n + payloadBytes,
                                    4.0 * n + payloadBytes,       4.0 * n + 2.0 * payloadBytes,
                                    4.0 * n + 2.0 * payloadBytes, 8.0 * n + payloadBytes};
  const char* names[kKernels] = {"encode+EF",     "decode",        "accumulate", "encode+EF stream",
                                 "decode stream", "sum2 separate", "sum2 fused", "encode+EF bf16"};
  for (size_t c = 0; c < configs.size(); ++c) {
    for (int kernel = 0; kernel < kKernels; ++kernel) {
      const std::vector<double>& t = times[c][kernel];
      std::vector<double> ratios;
      int wins = 0;
      for (size_t i = 0; i < t.size(); ++i) {
        ratios.push_back(t[i] / times[0][kernel][i]);
        wins += t[i] < times[0][kernel][i] ? 1 : 0;
      }
      run.results.push_back({codecName(codec), configs[c].table->name, configs[c].threads,
                             names[kernel], count, medianOf(t),
                             *std::min_element(t.begin(), t.end()),
                             *std::max_element(t.begin(), t.end()), medianOf(ratios), wins,
                             traffic[kernel], run.copyGbps});
    }
  }
}

SizeRun measureSize(const Options& o, size_t count) {
  Floats f(count);
  for (size_t i = 0; i < count; ++i) {
    f.x.floats()[i] = static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000) * 1e-3f;
    f.eIn.floats()[i] = static_cast<float>(static_cast<int>(i * 40503u % 201) - 100) * 1e-5f;
    reinterpret_cast<uint16_t*>(f.hIn.data)[i] = floatToBf16(f.eIn.floats()[i]);
  }
  SizeRun run;
  run.iters = o.iters;
  const double copySeconds =
      medianSeconds(o.iters, [&] { copyFloats(f.x.floats(), f.out.floats(), count); });
  run.copyGbps = 2.0 * 4.0 * static_cast<double>(count) / copySeconds / 1e9;
  for (CodecId codec : o.codecs) measureCodec(o, count, codec, f, run);
  return run;
}

std::string sizeLabel(size_t count) {
  if (count % (size_t{1} << 20) == 0) return std::to_string(count >> 20) + "M";
  return std::to_string(count);
}

// The median time of the same codec, implementation and kernel at one thread
// in this run (0 when one thread was not measured).
double oneThreadSeconds(const SizeRun& run, const Result& r) {
  for (const Result& o : run.results)
    if (o.threads == 1 && o.kernel == r.kernel && std::strcmp(o.impl, r.impl) == 0 &&
        std::strcmp(o.codec, r.codec) == 0)
      return o.seconds;
  return 0;
}

// The first result of r's codec in this run: what its "paired" column is
// relative to.
const Result& pairedBase(const SizeRun& run, const Result& r) {
  for (const Result& o : run.results)
    if (std::strcmp(o.codec, r.codec) == 0) return o;
  return r;
}

void printTable(const std::vector<SizeRun>& runs) {
  std::printf("%-6s %-6s %-7s %3s %-16s %9s %19s %9s %8s %7s %7s %8s %s\n", "size", "codec", "impl",
              "thr", "kernel", "ms", "range ms", "Gelem/s", "GB/s", "%copy", "xthr1", "paired",
              "wins");
  for (const SizeRun& run : runs) {
    for (const Result& r : run.results) {
      const double one = oneThreadSeconds(run, r);
      std::printf(
          "%-6s %-6s %-7s %3d %-16s %9.3f %9.3f-%-9.3f %9.3f %8.2f %6.1f%% %6.2fx %8.3f %d/%d\n",
          sizeLabel(r.count).c_str(), r.codec, r.impl, r.threads, r.kernel, r.seconds * 1e3,
          r.minSeconds * 1e3, r.maxSeconds * 1e3, r.elementsPerSecond() / 1e9, r.gbps(),
          r.percentOfCopy(), one > 0 ? one / r.seconds : 0.0, r.paired, r.pairedWins, run.iters);
    }
    if (!run.results.empty()) {
      const Result& base = pairedBase(run, run.results[0]);
      std::printf(
          "# %s: copy %.2f GB/s; paired = median per-iteration time / the codec's %s %d-thread "
          "time\n",
          sizeLabel(run.results[0].count).c_str(), run.copyGbps, base.impl, base.threads);
    }
  }
}

void printSummary(const std::vector<SizeRun>& runs) {
  for (const SizeRun& run : runs) {
    if (run.results.empty()) continue;
    std::printf("%s fp32 elements; copy %.1f GB/s\n", sizeLabel(run.results[0].count).c_str(),
                run.copyGbps);
    std::printf("  %-6s %-7s %3s %18s %18s %18s\n", "codec", "impl", "thr", "encode+EF", "decode",
                "accumulate");
    for (size_t i = 0; i + 2 < run.results.size(); i += kKernelRows) {
      std::printf("  %-6s %-7s %3d", run.results[i].codec, run.results[i].impl,
                  run.results[i].threads);
      for (size_t j = i; j < i + 3; ++j) {
        std::printf(" %7.1f GB/s %3.0f%%", run.results[j].gbps(), run.results[j].percentOfCopy());
      }
      std::printf("\n");
    }
  }
}

void printJson(const std::vector<SizeRun>& runs) {
  std::printf("[\n");
  bool first = true;
  for (const SizeRun& run : runs) {
    for (const Result& r : run.results) {
      std::printf(
          "%s  {\"codec\": \"%s\", \"impl\": \"%s\", \"threads\": %d, \"kernel\": \"%s\", "
          "\"elements\": %zu, "
          "\"seconds\": %.6g, \"seconds_min\": %.6g, \"seconds_max\": %.6g, "
          "\"elements_per_s\": %.6g, \"gb_per_s\": %.4g, \"copy_gb_per_s\": %.4g, "
          "\"percent_of_copy\": %.4g, \"paired_ratio\": %.4g, \"paired_wins\": %d, "
          "\"iters\": %d, \"affinity_cores\": %d}",
          first ? "" : ",\n", r.codec, r.impl, r.threads, r.kernel, r.count, r.seconds,
          r.minSeconds, r.maxSeconds, r.elementsPerSecond(), r.gbps(), r.copyGbps,
          r.percentOfCopy(), r.paired, r.pairedWins, run.iters, affinityCores());
      first = false;
    }
  }
  std::printf("\n]\n");
}

int runCalibrations(const Options& o) {
  std::printf("calibration of %s-element segments (the pipelined allreduce's), %d run(s)\n",
              sizeLabel(o.segment).c_str(), o.calibrate);
  int chosen[kNumIsas] = {0, 0, 0};
  for (int run = 0; run < o.calibrate; ++run) {
    const Calibration c = calibrateIsa(o.segment, 7);
    std::printf("run %d: %.1f ms, chose %s\n", run + 1, c.costSeconds * 1e3, isaName(c.chosen));
    for (size_t i = 0; i < c.seconds.size(); ++i) {
      std::printf("  round %zu:", i + 1);
      for (Isa isa : c.candidates)
        if (c.seconds[i][static_cast<int>(isa)] > 0)
          std::printf(" %s %.0f us", isaName(isa), c.seconds[i][static_cast<int>(isa)] * 1e6);
      std::printf("\n");
    }
    std::printf("  %s\n", c.reason.c_str());
    ++chosen[static_cast<int>(c.chosen)];
  }
  std::printf("chosen: scalar %d, avx2 %d, avx512 %d of %d\n", chosen[0], chosen[1], chosen[2],
              o.calibrate);
  const Calibration& p = processCalibration();
  std::printf("this process (SQUALL_CODEC_ISA / SQUALL_CODEC_CALIBRATE / cache): %s, %s%s%s\n",
              isaName(p.chosen), p.source.c_str(), p.reason.empty() ? "" : ": ", p.reason.c_str());
  return 0;
}

}  // namespace
}  // namespace squall::codec

int main(int argc, char** argv) {
  using namespace squall::codec;
  const Options o = parseOptions(argc, argv);
  if (o.calibrate > 0) return runCalibrations(o);
  std::vector<SizeRun> runs;
  for (size_t count : o.sizes) runs.push_back(measureSize(o, count));
  if (o.json)
    printJson(runs);
  else if (o.summary)
    printSummary(runs);
  else
    printTable(runs);
  return 0;
}
