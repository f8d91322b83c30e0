/* The public header compiles as C99 and libsquall.so exports what it declares:
 * a round trip through the shared library, as a C user would write it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

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
  for (i = 0; i < kCount; ++i) input[i] = (float)sin((double)i);
  CHECK(squallGetVersion(&version));
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
  printf("squall %d: %zu bytes for %d floats with %s\n", version, written, kCount,
         squallCodecImplementation());
  return 0;
}
