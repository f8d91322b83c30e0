#include "src/codec/calibrate.h"

#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "src/common/cpu.h"
#include "src/common/log.h"
#include "src/common/params.h"

namespace squall::codec {
namespace {

constexpr int kFormatVersion = 1;
constexpr int kDefaultRounds = 7;
constexpr double kScalarDropRatio = 1.3;

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 != 0 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

double medianOf(const std::vector<std::array<double, kNumIsas>>& seconds, Isa isa) {
  std::vector<double> v;
  for (const auto& round : seconds)
    if (round[static_cast<int>(isa)] > 0) v.push_back(round[static_cast<int>(isa)]);
  return median(v);
}

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};
using Block = std::unique_ptr<uint8_t, AlignedFree>;

// Not cleared: every buffer is written before it is read (inputs by the
// caller, the rest by the kernels of the untimed first pass).
Block allocate(size_t bytes) {
  const size_t padded = (bytes + 63) / 64 * 64;
  return Block(static_cast<uint8_t*>(std::aligned_alloc(64, padded == 0 ? 64 : padded)));
}

#if defined(__x86_64__)
bool haveClflushopt() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && (b & (1u << 23)) != 0;
}

[[gnu::target("clflushopt")]] void flushOpt(char* p, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 64) _mm_clflushopt(p + i);
  _mm_sfence();
}
#endif

// Evicts a buffer from every cache level, so the next kernel reads it from
// memory as a streaming allreduce does. clflushopt where the CPU has it:
// clflush serialises, and on a VM measured here it took 30-45 ms for 4 MiB
// (clflushopt 0.2 ms), which would have made the calibration cost seconds.
void flush(void* data, size_t bytes) {
#if defined(__x86_64__)
  static const bool opt = haveClflushopt();
  auto* p = static_cast<char*>(data);
  if (opt) {
    flushOpt(p, bytes);
    return;
  }
  for (size_t i = 0; i < bytes; i += 64) _mm_clflush(p + i);
  _mm_mfence();
#else
  (void)data;
  (void)bytes;
#endif
}

std::string defaultCacheDir() {
  std::string dir = paramString(Param::kCodecCacheDir);
  if (!dir.empty()) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] == '/')
    return std::string(xdg) + "/squall";
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] == '/')
    return std::string(home) + "/.cache/squall";
  return "";
}

// The segment the pipelined allreduce encodes at a time, in elements.
size_t segmentElements() {
  const int64_t bytes = paramInt(Param::kSegmentBytes);
  const size_t elements = bytes > 0 ? static_cast<size_t>(bytes) / sizeof(float) : (1u << 18);
  return std::clamp<size_t>(elements / kDefaultBlock * kDefaultBlock, kDefaultBlock, 1u << 22);
}

std::vector<Isa> availableIsas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (isaAvailable(isa)) isas.push_back(isa);
  return isas;
}

void mkdirs(const std::string& path) {
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1))
    (void)::mkdir(path.substr(0, slash).c_str(), 0755);
  (void)::mkdir(path.c_str(), 0755);
}

std::string describe(const Calibration& c) {
  std::ostringstream s;
  s << c.elements << "-element segments, " << c.seconds.size() << " rounds; median us:";
  for (Isa isa : c.candidates) {
    const double m = medianOf(c.seconds, isa);
    if (m > 0) s << " " << isaName(isa) << " " << static_cast<long long>(std::lround(m * 1e6));
  }
  return s.str();
}

}  // namespace

const char* isaName(Isa isa) { return kernelsFor(isa).name; }

Isa decideIsa(const std::vector<Isa>& candidates,
              const std::vector<std::array<double, kNumIsas>>& seconds, std::string* reason) {
  std::string why;
  Isa chosen = Isa::kScalar;
  if (!candidates.empty()) {
    const Isa widest = *std::max_element(candidates.begin(), candidates.end());
    Isa leader = widest;
    double best = medianOf(seconds, widest);
    for (Isa isa : candidates) {
      const double m = medianOf(seconds, isa);
      if (m > 0 && (best <= 0 || m < best)) {
        best = m;
        leader = isa;
      }
    }
    chosen = widest;
    // The paired figures of the leader, or of the runner-up when the widest
    // leads, against the widest.
    Isa other = leader;
    if (leader == widest) {
      double second = -1;
      for (Isa isa : candidates) {
        const double m = medianOf(seconds, isa);
        if (isa != widest && m > 0 && (second <= 0 || m < second)) {
          second = m;
          other = isa;
        }
      }
    }
    std::vector<double> ratios;
    int wins = 0;
    for (const auto& round : seconds) {
      const double a = round[static_cast<int>(other)], b = round[static_cast<int>(widest)];
      if (a > 0 && b > 0) {
        ratios.push_back(a / b);
        wins += a < b ? 1 : 0;
      }
    }
    const double ratio = ratios.empty() ? -1 : median(ratios);
    char text[240];
    std::snprintf(text, sizeof(text),
                  "%s/%s paired time ratio %.3f (median), %s faster in %d of %zu rounds",
                  isaName(other), isaName(widest), ratio, isaName(other), wins, ratios.size());
    if (other == widest) {
      why = std::string(isaName(widest)) + " is the only candidate measured";
    } else if (leader == widest) {
      why = std::string(isaName(widest)) + " has the lowest median time; " + text;
    } else {
      why = text;
      const bool clear = !ratios.empty() && ratio <= 1.0 - kCalibrationMargin &&
                         3 * wins >= 2 * static_cast<int>(ratios.size());
      if (clear)
        chosen = leader;
      else
        why += "; within the noise margin, so the widest stays";
    }
  }
  if (reason != nullptr) *reason = why;
  return chosen;
}

Calibration calibrateIsa(size_t elements, int rounds) {
  const auto start = std::chrono::steady_clock::now();
  Calibration c;
  c.source = "calibrated";
  c.candidates = availableIsas();
  c.elements = elements;
  const Spec spec{CodecId::kOnebit, Scale::kMeanAbs, kDefaultBlock};
  Layout layout;
  if (layoutFor(spec, elements, &layout) != Status::kOk || c.candidates.size() < 2) {
    c.chosen = c.candidates.empty() ? Isa::kScalar : c.candidates.back();
    c.reason = "nothing to compare";
    return c;
  }
  const size_t bytes = elements * sizeof(float);
  Block x = allocate(bytes), eIn = allocate(bytes), eOut = allocate(bytes), acc = allocate(bytes),
        out = allocate(bytes), payload = allocate(layout.payloadBytes);
  if (!x || !eIn || !eOut || !acc || !out || !payload) {
    c.chosen = c.candidates.back();
    c.reason = "out of memory for the calibration buffers; the widest is used";
    return c;
  }
  auto* xf = reinterpret_cast<float*>(x.get());
  auto* ef = reinterpret_cast<float*>(eIn.get());
  for (size_t i = 0; i < elements; ++i) {
    // Gradient-like values: mixed signs and magnitudes, no zero blocks.
    xf[i] = static_cast<float>(static_cast<int>(i * 2654435761u % 2001) - 1000) * 1e-3f;
    ef[i] = static_cast<float>(static_cast<int>(i * 40503u % 201) - 100) * 1e-5f;
  }
  const EncodeJob encode{
      x.get(),      DType::kF32, elements, spec, layout, ef, reinterpret_cast<float*>(eOut.get()),
      payload.get()};
  const DecodeJob intoAcc{payload.get(), elements, spec, layout,
                          reinterpret_cast<float*>(acc.get())};
  const DecodeJob intoOut{payload.get(), elements, spec, layout,
                          reinterpret_cast<float*>(out.get())};
  // Scalar, an order of magnitude slower than SIMD, is first timed on a
  // sixteenth of the segment (scaled up) to decide whether it is worth
  // timing at full length at all.
  const size_t probe = std::max<size_t>(elements / 16 / kDefaultBlock, 1) * kDefaultBlock;
  Layout probeLayout;
  (void)layoutFor(spec, probe, &probeLayout);
  auto timeOnce = [&](Isa isa, bool probing) {
    const CodecKernels& k = kernelsFor(isa).codecs[static_cast<int>(CodecId::kOnebit)];
    EncodeJob e = encode;
    DecodeJob da = intoAcc, dout = intoOut;
    if (probing) {
      e.count = da.count = dout.count = probe;
      e.layout = da.layout = dout.layout = probeLayout;
    }
    for (const Block* b : {&x, &eIn, &eOut, &out}) flush(b->get(), bytes);
    const auto t0 = std::chrono::steady_clock::now();
    (void)k.encode(e);
    k.decode(da);
    k.accumulate(da);
    k.decode(dout);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return probing ? t * static_cast<double>(elements) / static_cast<double>(probe) : t;
  };
  // One untimed pass of each SIMD candidate: page tables, branch
  // predictors, the vector units' power-up.
  for (Isa isa : c.candidates)
    if (isa != Isa::kScalar) (void)timeOnce(isa, false);
  std::vector<Isa> active = c.candidates;
  for (int round = 0; round < rounds; ++round) {
    std::array<double, kNumIsas> t{-1, -1, -1};
    // Alternate the order so neither side of a pair always runs first.
    std::vector<Isa> order = active;
    if (round % 2 != 0) std::reverse(order.begin(), order.end());
    for (Isa isa : order)
      t[static_cast<int>(isa)] = timeOnce(isa, round == 0 && isa == Isa::kScalar);
    c.seconds.push_back(t);
    if (round == 0 && active.front() == Isa::kScalar && active.size() > 1) {
      double simd = -1;
      for (Isa isa : active)
        if (isa != Isa::kScalar && (simd < 0 || t[static_cast<int>(isa)] < simd))
          simd = t[static_cast<int>(isa)];
      if (t[static_cast<int>(Isa::kScalar)] > kScalarDropRatio * simd) active.erase(active.begin());
    }
  }
  c.chosen = decideIsa(c.candidates, c.seconds, &c.reason);
  c.reason = describe(c) + "; " + c.reason;
  c.costSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return c;
}

std::string calibrationCacheKey(size_t elements) {
  std::ostringstream key;
  key << "squall-codec-calibration " << kFormatVersion << "; cpu " << cpuModel() << "; l3 "
      << sysconf(_SC_LEVEL3_CACHE_SIZE) << "; cpus " << sysconf(_SC_NPROCESSORS_ONLN)
      << "; segment " << elements << "; isas";
  for (Isa isa : availableIsas()) key << " " << isaName(isa);
#if defined(__VERSION__)
  key << "; compiler " << __VERSION__;
#endif
  return key.str();
}

std::string calibrationCachePath(const std::string& dir, const std::string& key) {
  if (dir.empty()) return "";
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : key) hash = (hash ^ ch) * 1099511628211ull;
  char name[40];
  std::snprintf(name, sizeof(name), "/codec-isa-%016llx.txt",
                static_cast<unsigned long long>(hash));
  return dir + name;
}

bool readCalibrationCache(const std::string& path, const std::string& key, Isa* isa,
                          std::string* reason) {
  if (path.empty()) return false;
  std::ifstream in(path);
  std::string keyLine, choiceLine;
  if (!std::getline(in, keyLine) || !std::getline(in, choiceLine)) return false;
  if (keyLine != "key " + key || choiceLine.rfind("choice ", 0) != 0) return false;
  const std::string name = choiceLine.substr(7);
  for (Isa candidate : availableIsas()) {
    if (name == isaName(candidate)) {
      *isa = candidate;
      std::string reasonLine;
      if (reason != nullptr && std::getline(in, reasonLine) && reasonLine.rfind("reason ", 0) == 0)
        *reason = reasonLine.substr(7);
      return true;
    }
  }
  return false;
}

bool writeCalibrationCache(const std::string& path, const std::string& key,
                           const Calibration& calibration) {
  if (path.empty()) return false;
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) mkdirs(path.substr(0, slash));
  const std::string temporary = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << "key " << key << "\nchoice " << isaName(calibration.chosen) << "\nreason "
        << calibration.reason << "\n";
    if (!out.good()) {
      std::remove(temporary.c_str());
      return false;
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    return false;
  }
  return true;
}

const Calibration& processCalibration() {
  static const Calibration calibration = [] {
    Calibration c;
    c.candidates = availableIsas();
    const Isa widest = c.candidates.back();
    const std::string wanted = paramString(Param::kCodecIsa);
    Isa forced = widest;
    bool isForced = true;
    if (strcasecmp(wanted.c_str(), "scalar") == 0) {
      forced = Isa::kScalar;
    } else if (strcasecmp(wanted.c_str(), "avx2") == 0) {
      forced = std::min(Isa::kAvx2, widest);
    } else if (strcasecmp(wanted.c_str(), "avx512") == 0) {
      forced = std::min(Isa::kAvx512, widest);
    } else {
      isForced = false;
      if (strcasecmp(wanted.c_str(), "auto") != 0)
        SQUALL_WARN(Subsys::kEnv,
                    "SQUALL_CODEC_ISA=\"%s\" is not auto, scalar, avx2 or avx512; using auto",
                    wanted.c_str());
    }
    if (isForced) {
      c.chosen = forced;
      c.source = "forced";
      c.reason = "SQUALL_CODEC_ISA=" + wanted;
      return c;
    }
    if (c.candidates.size() < 2) {
      c.chosen = widest;
      c.source = "only one available";
      return c;
    }
    const std::string mode = paramString(Param::kCodecCalibrate);
    if (strcasecmp(mode.c_str(), "off") == 0) {
      c.chosen = widest;
      c.source = "off";
      c.reason = "SQUALL_CODEC_CALIBRATE=off: the widest";
      return c;
    }
    const bool always = strcasecmp(mode.c_str(), "always") == 0;
    if (!always && strcasecmp(mode.c_str(), "auto") != 0)
      SQUALL_WARN(Subsys::kEnv,
                  "SQUALL_CODEC_CALIBRATE=\"%s\" is not auto, always or off; using auto",
                  mode.c_str());
    const size_t elements = segmentElements();
    const std::string key = calibrationCacheKey(elements);
    const std::string path = calibrationCachePath(defaultCacheDir(), key);
    Isa cached = widest;
    std::string cachedReason;
    if (!always && readCalibrationCache(path, key, &cached, &cachedReason)) {
      c.chosen = cached;
      c.source = "cache";
      c.reason = path + ": " + cachedReason;
      c.elements = elements;
      return c;
    }
    c = calibrateIsa(elements, kDefaultRounds);
    // A calibration that timed nothing (one candidate, no memory for its
    // buffers) is not cached: the next process on this machine tries again.
    if (!c.seconds.empty() && !writeCalibrationCache(path, key, c))
      SQUALL_INFO(Subsys::kCodec,
                  "could not cache the codec calibration in \"%s\" (set SQUALL_CODEC_CACHE_DIR to "
                  "a writable directory to calibrate once per machine)",
                  path.c_str());
    return c;
  }();
  return calibration;
}

}  // namespace squall::codec
