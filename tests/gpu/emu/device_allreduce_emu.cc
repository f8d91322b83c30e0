// The real device allreduce source, compiled by the host compiler against the
// CPU emulation of CUDA and NCCL in this directory.
#include "src/coll/device/device_allreduce.cu"
