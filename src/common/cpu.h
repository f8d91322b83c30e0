// What the CPU (and the operating system's register saving) supports.
#pragma once

#include <string>

namespace squall {

struct CpuFeatures {
  bool avx2 = false;    // AVX2 + FMA + F16C, with YMM state enabled by the OS
  bool avx512 = false;  // AVX-512 F/BW/VL/DQ, with ZMM state enabled by the OS
};

const CpuFeatures& cpuFeatures();

// What identifies the CPU model, for caches of per-CPU measurements: the
// vendor and brand strings and family / model / stepping ("" off x86).
const std::string& cpuModel();

}  // namespace squall
