#include "src/common/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace squall {
namespace {

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return f;
  const bool osxsave = (c & (1u << 27)) != 0;
  const bool fma = (c & (1u << 12)) != 0;
  const bool f16c = (c & (1u << 29)) != 0;
  const bool avx = (c & (1u << 28)) != 0;
  if (!osxsave || !avx) return f;
  unsigned xcr0Lo = 0, xcr0Hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0Lo), "=d"(xcr0Hi) : "c"(0));
  const uint64_t xcr0 = (static_cast<uint64_t>(xcr0Hi) << 32) | xcr0Lo;
  const bool ymm = (xcr0 & 0x6) == 0x6;    // SSE + AVX state
  const bool zmm = (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return f;
  const bool avx2 = (b & (1u << 5)) != 0;
  const bool avx512f = (b & (1u << 16)) != 0;
  const bool avx512dq = (b & (1u << 17)) != 0;
  const bool avx512bw = (b & (1u << 30)) != 0;
  const bool avx512vl = (b & (1u << 31)) != 0;
  f.avx2 = ymm && avx2 && fma && f16c;
  f.avx512 = f.avx2 && zmm && avx512f && avx512dq && avx512bw && avx512vl;
#endif
  return f;
}

std::string detectModel() {
  std::string model;
#if defined(__x86_64__) || defined(__i386__)
  unsigned regs[4] = {0, 0, 0, 0};
  if (__get_cpuid(0, &regs[0], &regs[1], &regs[2], &regs[3]) == 0) return model;
  char vendor[13] = {};
  std::memcpy(vendor, &regs[1], 4);
  std::memcpy(vendor + 4, &regs[3], 4);
  std::memcpy(vendor + 8, &regs[2], 4);
  model = vendor;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) != 0) {
    const unsigned family = ((a >> 8) & 0xf) + ((a >> 20) & 0xff);
    const unsigned modelId = ((a >> 4) & 0xf) | (((a >> 16) & 0xf) << 4);
    char fms[48];
    std::snprintf(fms, sizeof(fms), " family %u model %u stepping %u", family, modelId, a & 0xf);
    model += fms;
  }
  char brand[49] = {};
  if (__get_cpuid(0x80000000u, &a, &b, &c, &d) != 0 && a >= 0x80000004u) {
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      __get_cpuid(0x80000002u + leaf, &regs[0], &regs[1], &regs[2], &regs[3]);
      std::memcpy(brand + static_cast<size_t>(leaf) * 16, regs, 16);
    }
    model += " ";
    model += brand;
  }
#endif
  return model;
}

}  // namespace

const std::string& cpuModel() {
  static const std::string model = detectModel();
  return model;
}

const CpuFeatures& cpuFeatures() {
  static const CpuFeatures features = detect();
  return features;
}

}  // namespace squall
