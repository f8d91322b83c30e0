// The real CUDA codec source, compiled by the host compiler against the CPU
// emulation in this directory (see cuda_runtime_api.h).
#include "src/codec/cuda/kernels.cu"
