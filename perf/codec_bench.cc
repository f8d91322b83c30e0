// codec_bench: single-thread throughput of the onebit codec kernels (fp32
// input) for each implementation, next to a STREAM-style copy measured in the
// same run, since the kernels are meant to be memory-bound.
//
//   codec_bench [--sizes=1M,4M,...] [--iters=N] [--impl=scalar,avx2,avx512]
//               [--full] [--json] [--summary]
//
// Each figure is the median of --iters timed runs after one warm-up run, on
// buffers whose pages were touched beforehand. GB/s counts the bytes a kernel
// must move (reads plus writes, as STREAM does), and "% copy" relates that to
// the copy's GB/s, the bandwidth a streaming kernel can hope for.
#include <emmintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "src/codec/kernels.h"

namespace squall::codec {
namespace {

struct Options {
  std::vector<size_t> sizes;
  int iters = 7;
  std::vector<Isa> impls;
  bool json = false;
  bool summary = false;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "codec_bench: %s\n"
               "usage: codec_bench [--sizes=1M,4M,16M,64M] [--iters=N] "
               "[--impl=scalar,avx2,avx512] [--full] [--json] [--summary]\n",
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
  const char* impl;
  const char* kernel;
  size_t count;
  double seconds;
  double bytes;     // memory traffic the kernel must cause
  double copyGbps;  // the same run's copy bandwidth
  double gbps() const { return bytes / seconds / 1e9; }
  double elementsPerSecond() const { return static_cast<double>(count) / seconds; }
  double percentOfCopy() const { return 100.0 * gbps() / copyGbps; }
};

struct SizeRun {
  double copyGbps = 0;
  std::vector<Result> results;
};

SizeRun measureSize(const Options& o, size_t count) {
  const Spec spec{CodecId::kOnebit, Scale::kMeanAbs, kDefaultBlock};
  Layout layout;
  if (layoutFor(spec, count, &layout) != Status::kOk) usage("size too large");

  Buffer x(count * 4), eIn(count * 4), eOut(count * 4), out(count * 4);
  Buffer payload(layout.payloadBytes);
  for (size_t i = 0; i < count; ++i) {
    x.floats()[i] = static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000) * 1e-3f;
    eIn.floats()[i] = static_cast<float>(static_cast<int>(i * 40503u % 201) - 100) * 1e-5f;
  }

  SizeRun run;
  const double copySeconds =
      medianSeconds(o.iters, [&] { copyFloats(x.floats(), out.floats(), count); });
  run.copyGbps = 2.0 * 4.0 * static_cast<double>(count) / copySeconds / 1e9;

  const double n = static_cast<double>(count);
  const double payloadBytes = static_cast<double>(layout.payloadBytes);
  for (Isa isa : o.impls) {
    if (!isaAvailable(isa)) continue;
    const KernelTable& table = kernelsFor(isa);
    const CodecKernels& k = table.codecs[static_cast<int>(CodecId::kOnebit)];
    const EncodeJob ejob{x.data, DType::kF32,  count,         spec,
                         layout, eIn.floats(), eOut.floats(), payload.data};
    const DecodeJob djob{payload.data, count, spec, layout, out.floats()};
    // Read x and e, write e and the payload.
    run.results.push_back({table.name, "encode+EF", count,
                           medianSeconds(o.iters, [&] { k.encode(ejob); }), 12.0 * n + payloadBytes,
                           run.copyGbps});
    // Read the payload, write the output.
    run.results.push_back({table.name, "decode", count,
                           medianSeconds(o.iters, [&] { k.decode(djob); }), 4.0 * n + payloadBytes,
                           run.copyGbps});
    // Read the payload and the accumulator, write the accumulator.
    run.results.push_back({table.name, "accumulate", count,
                           medianSeconds(o.iters, [&] { k.accumulate(djob); }),
                           8.0 * n + payloadBytes, run.copyGbps});
  }
  return run;
}

std::string sizeLabel(size_t count) {
  if (count % (size_t{1} << 20) == 0) return std::to_string(count >> 20) + "M";
  return std::to_string(count);
}

void printTable(const std::vector<SizeRun>& runs) {
  std::printf("%-8s %-7s %-11s %10s %12s %9s %9s %8s\n", "size", "impl", "kernel", "ms", "Gelem/s",
              "GB/s", "copyGB/s", "%copy");
  for (const SizeRun& run : runs) {
    for (const Result& r : run.results) {
      std::printf("%-8s %-7s %-11s %10.3f %12.3f %9.2f %9.2f %7.1f%%\n", sizeLabel(r.count).c_str(),
                  r.impl, r.kernel, r.seconds * 1e3, r.elementsPerSecond() / 1e9, r.gbps(),
                  r.copyGbps, r.percentOfCopy());
    }
  }
}

void printSummary(const std::vector<SizeRun>& runs) {
  for (const SizeRun& run : runs) {
    if (run.results.empty()) continue;
    std::printf("onebit codec, %s fp32 elements, one thread; copy %.1f GB/s\n",
                sizeLabel(run.results[0].count).c_str(), run.copyGbps);
    std::printf("  %-7s %18s %18s %18s\n", "impl", "encode+EF", "decode", "accumulate");
    for (size_t i = 0; i + 2 < run.results.size(); i += 3) {
      std::printf("  %-7s", run.results[i].impl);
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
          "%s  {\"impl\": \"%s\", \"kernel\": \"%s\", \"elements\": %zu, "
          "\"seconds\": %.6g, \"elements_per_s\": %.6g, \"gb_per_s\": %.4g, "
          "\"copy_gb_per_s\": %.4g, \"percent_of_copy\": %.4g}",
          first ? "" : ",\n", r.impl, r.kernel, r.count, r.seconds, r.elementsPerSecond(), r.gbps(),
          r.copyGbps, r.percentOfCopy());
      first = false;
    }
  }
  std::printf("\n]\n");
}

}  // namespace
}  // namespace squall::codec

int main(int argc, char** argv) {
  using namespace squall::codec;
  const Options o = parseOptions(argc, argv);
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
