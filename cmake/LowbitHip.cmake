# HIP backend: the same kernels/cuda sources compiled with hipcc (through kernels/cuda/portability.cuh).
# With a ROCm build of libtorch the objects are linked into lowbit and the GPU bindings
# (tensors/ops_cuda.cpp, registered under the CUDA key as ROCm libtorch expects) are compiled; with
# any other libtorch the objects are still built, so every build proves the sources stay HIP-clean,
# and `lowbit info` says "compiled, not linked".
find_program(LOWBIT_HIPCC hipcc)
set(hip_found FALSE)
if(LOWBIT_HIPCC)
  set(hip_found TRUE)
endif()
lowbit_resolve_backend(LOWBIT_WITH_HIP LOWBIT_HIP "${hip_found}" "hipcc was not found")
set(LOWBIT_HIP_ARCHS "gfx90a" CACHE STRING "AMD GPU architectures to compile the HIP kernels for")

if(LOWBIT_WITH_HIP)
  file(GLOB lowbit_hip_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cu)
  file(GLOB lowbit_hip_headers CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cuh
       ${PROJECT_SOURCE_DIR}/kernels/cuda/*.h ${PROJECT_SOURCE_DIR}/kernels/common/*.h)
  set(arch_flags "")
  foreach(arch ${LOWBIT_HIP_ARCHS})
    list(APPEND arch_flags --offload-arch=${arch})
  endforeach()
  set(hip_objects "")
  foreach(src ${lowbit_hip_sources})
    get_filename_component(stem ${src} NAME_WE)
    set(obj ${PROJECT_BINARY_DIR}/hip/${stem}.o)
    add_custom_command(
      OUTPUT ${obj}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/hip
      COMMAND ${LOWBIT_HIPCC} -x hip -std=c++17 -O3 -fPIC ${arch_flags} -ffp-contract=off
              -I${LOWBIT_INCLUDE_ROOT} -c ${src} -o ${obj}
      DEPENDS ${src} ${lowbit_hip_headers}
      COMMENT "hipcc ${stem}.cu (${LOWBIT_HIP_ARCHS})"
      VERBATIM)
    list(APPEND hip_objects ${obj})
  endforeach()
  add_custom_target(lowbit_hip_kernels ALL DEPENDS ${hip_objects})
  set(LOWBIT_HIP_OBJECTS ${hip_objects})
  if(NOT LOWBIT_TORCH_HAS_ROCM)
    message(STATUS "lowbit: HIP kernels compile for ${LOWBIT_HIP_ARCHS}; libtorch is not a ROCm build, so they are not linked")
  endif()
endif()
