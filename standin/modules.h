// Modules and kernel launches. A module is any image (the stand-in cannot run GPU code); its
// functions are tide's kernels compiled for the host (kernels/host_kernel.h: the kernels' own
// source) and the kernels tests register through the control API. A launch copies the parameter
// struct when it is called, as CUDA does, and runs the kernel over the whole grid, every block
// and thread, on the stream's worker (kernels/host/grid.h).
#pragma once

#include <cuda.h>

#include <cstddef>

#include "standin/standin.h"
#include "standin/streams.h"

namespace tide::standin {

class Context;

CUresult module_load_data(CUmodule* out, const void* image);
CUresult module_unload(CUmodule module);
CUresult module_get_function(CUfunction* out, CUmodule module, const char* name);
CUresult launch_kernel(CUfunction function, const unsigned grid[3], const unsigned block[3],
                       unsigned shared_bytes, CUstream stream, void** params, void** extra,
                       DefaultStream fallback);

// tide_standin_register_kernel.
int register_kernel(const char* name, tide_standin_kernel run, std::size_t param_bytes);

// Unloads the modules loaded in `context`, when it is destroyed.
void unload_modules_of(const Context& context);

}  // namespace tide::standin
