# Precompiled <torch/torch.h>: parsing libtorch's headers is about half the compile time of every
# source file that includes them (20 of 39 s for one test file at -O3; the header alone is ~700 MB
# of compiler state), and CI builds the library twice on 2 cores. The kernels never see it: they
# know nothing of torch (kernels/cpu sources are skipped), and the installed headers are compiled
# without it by the install test.
option(LOWBIT_PRECOMPILE_TORCH "Precompile <torch/torch.h> for the targets that include it" ON)

# lowbit_precompile_torch(TARGET...): each target gets its own precompiled header (its flags differ:
# -fPIC, -fopenmp), built once and used by every C++ file of the target.
function(lowbit_precompile_torch)
  if(NOT LOWBIT_PRECOMPILE_TORCH)
    return()
  endif()
  foreach(target ${ARGN})
    target_precompile_headers(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:<torch/torch.h>>")
  endforeach()
endfunction()
