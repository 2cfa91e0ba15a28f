# Precompiled <torch/torch.h>: parsing libtorch's headers is about half the compile time of every
# source file that includes them (20 of 39 s for one test file at -O3; the header alone is ~700 MB
# of compiler state), and CI builds the library twice on 2 cores. The kernels never see it: they
# know nothing of torch (kernels/cpu sources are skipped), and the installed headers are compiled
# without it by the install test.
option(LOWBIT_PRECOMPILE_TORCH "Precompile <torch/torch.h> for the targets that include it" ON)

# lowbit_precompile_torch(TARGET...): each target gets its own precompiled header, built once and
# used by every C++ file of the target (the library: its -fPIC shapes the header).
function(lowbit_precompile_torch)
  if(NOT LOWBIT_PRECOMPILE_TORCH)
    return()
  endif()
  foreach(target ${ARGN})
    target_precompile_headers(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:<torch/torch.h>>")
  endforeach()
endfunction()

# lowbit_reuse_torch_pch(TARGET...): every program (the tests, the GPT example, the CLI, tools,
# benches) shares one precompiled header instead of parsing libtorch's headers again (~15 s of CPU
# a program, ~70 s for a header of its own). GCC uses a precompiled header only where the flags that
# shape it match, so there are two: with OpenMP (_OPENMP reaches ATen's headers) and without; each
# program takes the one of its flags (call it after target_link_libraries). Options that only steer
# code generation (-ffp-contract=off, warnings) and macros ATen never reads leave it usable; one that
# does not match is ignored by GCC (-Winvalid-pch says so), which then parses the headers as before:
# slower, never wrong.
function(lowbit_reuse_torch_pch)
  if(NOT LOWBIT_PRECOMPILE_TORCH)
    return()
  endif()
  foreach(target ${ARGN})
    get_target_property(libs ${target} LINK_LIBRARIES)
    set(anchor lowbit_program_pch)
    if("OpenMP::OpenMP_CXX" IN_LIST libs)
      set(anchor lowbit_program_pch_openmp)
    endif()
    if(NOT TARGET ${anchor})
      set(source ${PROJECT_BINARY_DIR}/generated/program_pch_anchor.cpp)
      if(NOT EXISTS ${source})
        file(WRITE ${source} "// Compiled only to build the programs' precompiled <torch/torch.h>.\n")
      endif()
      add_library(${anchor} OBJECT ${source})
      target_link_libraries(${anchor} PRIVATE lowbit)
      if(anchor STREQUAL lowbit_program_pch_openmp)
        target_link_libraries(${anchor} PRIVATE OpenMP::OpenMP_CXX)
      endif()
      target_precompile_headers(${anchor} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:<torch/torch.h>>")
    endif()
    target_precompile_headers(${target} REUSE_FROM ${anchor})
  endforeach()
endfunction()
