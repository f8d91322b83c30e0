// core's staging of device buffers on a host engine, compiled by the host
// compiler against the CPU emulation of CUDA.
#include "src/core/host_staging.cc"
