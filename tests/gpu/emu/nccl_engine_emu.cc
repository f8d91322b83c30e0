// core's NCCL engine, compiled by the host compiler against the CPU
// emulation of CUDA (and run over the emulation's NCCL table).
// The .cc itself is the point: the same source, built by another compiler.
#include "src/core/nccl_engine.cc"  // NOLINT(bugprone-suspicious-include)
