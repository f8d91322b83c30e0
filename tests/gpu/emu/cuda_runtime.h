// CPU emulation of CUDA for logic tests; see cuda_runtime_api.h.
#pragma once
#include "cuda_runtime_api.h"
