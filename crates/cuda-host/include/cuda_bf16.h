// The host build's stand-in for CUDA's header: `__nv_bfloat16` is in wick_cuda.h.
#pragma once
#include "wick_cuda.h"
