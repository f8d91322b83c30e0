// The real device optimizer sources, compiled by the host compiler against
// the CPU emulation of CUDA and NCCL in this directory.
#include "src/optim/cuda/update_kernels.cu"
