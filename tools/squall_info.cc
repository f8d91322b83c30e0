// squall_info: what this build of Squall is and how it is configured.
//
//   squall_info               version, CPU features, codec implementation (and
//                             why: forced, cached or calibrated), codec threads
//   squall_info --params      every SQUALL_* variable with its current value
//   squall_info --params-md   the same table as Markdown (docs/env.md)
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "squall/squall.h"
#include "src/codec/calibrate.h"
#include "src/codec/parallel.h"
#include "src/common/cpu.h"
#include "src/common/params.h"

namespace {

int printParams() {
  for (const squall::ParamInfo& p : squall::allParams()) {
    const char* value = std::getenv(p.name);
    std::printf("%-24s = %-12s (default %s)\n    %s\n", p.name,
                value != nullptr ? value : "(unset)",
                p.defaultValue[0] != '\0' ? p.defaultValue : "(unset)", p.doc);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--params") == 0) return printParams();
  if (argc > 1 && std::strcmp(argv[1], "--params-md") == 0) {
    std::fputs(squall::paramsMarkdown().c_str(), stdout);
    return 0;
  }
  if (argc > 1) {
    std::fprintf(stderr, "usage: %s [--params | --params-md]\n", argv[0]);
    return 2;
  }
  int version = 0;
  squallGetVersion(&version);
  const squall::CpuFeatures& cpu = squall::cpuFeatures();
  std::printf("squall %d.%d.%d\n", version / 10000, version / 100 % 100, version % 100);
  std::printf("cpu: avx2=%s avx512=%s\n", cpu.avx2 ? "yes" : "no", cpu.avx512 ? "yes" : "no");
  std::printf("cpu model: %s\n", squall::cpuModel().c_str());
  std::printf("codec implementation: %s\n", squallCodecImplementation());
  const squall::codec::Calibration& c = squall::codec::processCalibration();
  std::printf("codec choice: %s%s%s\n", c.source.c_str(), c.reason.empty() ? "" : ": ",
              c.reason.c_str());
  std::printf("codec threads: %d per call (%d cores in this process's affinity mask)\n",
              squall::codec::codecThreads(), squall::codec::affinityCores());
  unsigned caps = 0;
  squallGetCapabilities(&caps);
  std::printf("built with: GPU path (CUDA, NCCL at run time) %s, UCX (at run time) %s\n",
              (caps & squallCapabilityDevice) != 0 ? "yes" : "no",
              (caps & squallCapabilityUcx) != 0 ? "yes" : "no");
  return 0;
}
