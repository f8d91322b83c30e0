// core's NCCL engine, compiled by the host compiler against the CPU
// emulation of CUDA (and run over the emulation's NCCL table).
#include "src/core/nccl_engine.cc"
