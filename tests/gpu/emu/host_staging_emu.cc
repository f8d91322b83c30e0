// core's staging of device buffers on a host engine, compiled by the host
// compiler against the CPU emulation of CUDA.
// The .cc itself is the point: the same source, built by another compiler.
#include "src/core/host_staging.cc"  // NOLINT(bugprone-suspicious-include)
