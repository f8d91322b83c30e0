/* The public header compiles as C99 and libsquall.so exports what it declares:
 * a round trip through the shared library, as a C user would write it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "squall/optim.h"
#include "squall/squall.h"

#define CHECK(call)                                                           \
  do {                                                                        \
    squallResult_t r_ = (call);                                               \
    if (r_ != squallSuccess) {                                                \
      fprintf(stderr, "%s failed: %s: %s\n", #call, squallGetErrorString(r_), \
              squallGetLastError());                                          \
      return 1;                                                               \
    }                                                                         \
  } while (0)

int main(void) {
  enum { kCount = 5000 };
  static float input[kCount], output[kCount];
  squallCodecSpec_t spec = SQUALL_CODEC_SPEC_ONEBIT;
  squallResidual_t residual;
  size_t capacity, written, i;
  void* wire;
  int version;
  unsigned capabilities;
  for (i = 0; i < kCount; ++i) input[i] = (float)sin((double)i);
  CHECK(squallGetVersion(&version));
  CHECK(squallGetCapabilities(&capabilities));
  CHECK(squallResidualCreate(kCount, &residual));
  CHECK(squallEncodedSize(&spec, kCount, &capacity));
  wire = malloc(capacity);
  CHECK(squallEncode(&spec, input, squallFloat32, kCount, residual, wire, capacity, &written));
  CHECK(squallDecode(wire, written, output, kCount));
  for (i = 0; i < kCount; ++i) {
    if ((output[i] >= 0) != (input[i] >= 0)) {
      fprintf(stderr, "sign of element %zu lost\n", i);
      return 1;
    }
  }
  CHECK(squallResidualDestroy(residual));
  free(wire);
  {
    /* One APMSqueeze step through optim.h on a one-rank communicator. */
    squallUniqueId id;
    squallComm_t comm;
    squallOptimizer_t opt;
    squallOptimConfig_t config = SQUALL_OPTIM_CONFIG_INIT;
    squallOptimInfo_t info;
    config.warmupSteps = 1;
    CHECK(squallGetUniqueId(&id));
    CHECK(squallCommInitRank(&comm, 1, id, 0, NULL));
    CHECK(squallOptimizerCreate(comm, kCount, &config, &opt));
    CHECK(squallOptimizerStep(opt, output, input, 0.0f));
    CHECK(squallOptimizerStep(opt, output, input, 0.0f));
    CHECK(squallOptimizerGetInfo(opt, &info));
    if (info.step != 2 || info.phase != squallPhaseCompressed) {
      fprintf(stderr, "optimizer info: step %ld phase %d\n", (long)info.step, (int)info.phase);
      return 1;
    }
    CHECK(squallOptimizerDestroy(opt));
    CHECK(squallCommDestroy(comm));
  }
  printf("squall %d: %zu bytes for %d floats with %s\n", version, written, kCount,
         squallCodecImplementation());
  return 0;
}
