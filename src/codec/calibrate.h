// Which codec implementation runs fastest on this CPU, measured rather than
// assumed from the widest vector unit.
//
// What is timed is what the pipelined compressed allreduce does per segment
// (SQUALL_SEGMENT_BYTES of fp32): encode with error feedback from memory,
// decode into the accumulator, decode-accumulate, and decode into the
// output, with the input, residuals and output flushed from every cache
// level first, since a large allreduce streams them from memory (timing the
// same kernels on cache-resident buffers ranks the implementations
// differently on some CPUs). Every round times every candidate back to back
// in alternating order, and the choice is made on the per-round paired
// ratios, so that a burst of load from other processes hits both sides of a
// pair. The result is cached per CPU model (calibrationCacheKey).
//
// All implementations produce the same bytes, so ranks that choose
// differently still interoperate and agree bit for bit.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "src/codec/kernels.h"

namespace squall::codec {

constexpr int kNumIsas = 3;

struct Calibration {
  Isa chosen = Isa::kScalar;
  std::string source;   // "calibrated", "cache", "forced", "off" or "only one available"
  std::string reason;   // why `chosen`, with the figures
  size_t elements = 0;  // per timed call
  std::vector<Isa> candidates;
  // seconds[round][isa] of one timed sequence; negative where not run.
  std::vector<std::array<double, kNumIsas>> seconds;
  double costSeconds = 0;  // wall time the calibration took
};

// The decision alone, from paired timings: the implementation with the
// lowest median time replaces the widest candidate (the default without a
// measurement) only when its median paired ratio to the widest is at least
// kCalibrationMargin below 1 and it won at least two thirds of the rounds
// both ran; otherwise the difference is noise and the widest stays.
constexpr double kCalibrationMargin = 0.03;
Isa decideIsa(const std::vector<Isa>& candidates,
              const std::vector<std::array<double, kNumIsas>>& seconds, std::string* reason);

// Times the candidates (the available implementations) on `elements`-long
// segments for `rounds` rounds; scalar is dropped after the first round when
// it is clearly (1.3x) slower than a SIMD candidate.
Calibration calibrateIsa(size_t elements, int rounds);

// The cache key of a calibration of `elements`-long segments on this CPU:
// CPU model, L3 size, online CPUs, segment length, the implementations
// available, the compiler and a format version.
std::string calibrationCacheKey(size_t elements);
// The cache file for `key` in `dir` ("" when there is no directory to use).
std::string calibrationCachePath(const std::string& dir, const std::string& key);
// Reads a cached choice (and, when `reason` is set, the figures it was made
// on); false when absent, for another key, or naming an implementation that
// cannot run here.
bool readCalibrationCache(const std::string& path, const std::string& key, Isa* isa,
                          std::string* reason = nullptr);
// Writes it (atomically: a temporary file renamed); false on failure.
bool writeCalibrationCache(const std::string& path, const std::string& key,
                           const Calibration& calibration);

// What SQUALL_CODEC_ISA, SQUALL_CODEC_CALIBRATE and the cache decide, done
// once per process by activeKernels(); later calls return the same object.
const Calibration& processCalibration();

const char* isaName(Isa isa);

}  // namespace squall::codec
