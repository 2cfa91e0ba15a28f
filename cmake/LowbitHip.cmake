# HIP backend: the same kernels/cuda sources compiled with hipcc (through kernels/cuda/portability.cuh).
# With a ROCm build of libtorch the objects are linked into lowbit and the GPU bindings
# (tensors/ops_cuda.cpp, registered under the CUDA key as ROCm libtorch expects) are compiled; with
# any other libtorch the sources are still checked by hipcc's front end, so every build proves they
# stay HIP-clean, and `lowbit info` says "checked, not linked".
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
  # With a ROCm libtorch the objects are linked into lowbit (-O3). With any other nothing uses them,
  # so the sources are only checked: hipcc -fsyntax-only runs the front end for the host and for
  # every device architecture (what a source change can break: HIP-clean code, device-side calls,
  # template instantiation), 7 s a file where compiling the step kernels at -O3 for two
  # architectures took 200-900 s each on 2 cores, most of CI's time. hipcc passes its link flags to
  # every compile, where clang warns that they are unused: not ours to fix, so not shown.
  set(hip_objects "")
  foreach(src ${lowbit_hip_sources})
    get_filename_component(stem ${src} NAME_WE)
    if(LOWBIT_TORCH_HAS_ROCM)
      set(obj ${PROJECT_BINARY_DIR}/hip/${stem}.o)
      set(hip_compile -O3 -fPIC -c ${src} -o ${obj})
      set(hip_touch "")
      set(what "hipcc")
    else()
      set(obj ${PROJECT_BINARY_DIR}/hip/${stem}.checked)
      set(hip_compile -fsyntax-only ${src})
      set(hip_touch COMMAND ${CMAKE_COMMAND} -E touch ${obj})
      set(what "hipcc -fsyntax-only")
    endif()
    add_custom_command(
      OUTPUT ${obj}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/hip
      COMMAND ${LOWBIT_HIPCC} -x hip -std=c++17 ${arch_flags} -ffp-contract=off -Wno-unused-command-line-argument
              -I${LOWBIT_INCLUDE_ROOT} ${hip_compile}
      ${hip_touch}
      DEPENDS ${src} ${lowbit_hip_headers}
      COMMENT "${what} ${stem}.cu (${LOWBIT_HIP_ARCHS})"
      VERBATIM)
    list(APPEND hip_objects ${obj})
  endforeach()
  add_custom_target(lowbit_hip_kernels ALL DEPENDS ${hip_objects})
  set(LOWBIT_HIP_OBJECTS ${hip_objects})
  if(NOT LOWBIT_TORCH_HAS_ROCM)
    message(STATUS "lowbit: HIP kernels checked (hipcc -fsyntax-only) for ${LOWBIT_HIP_ARCHS}; libtorch is not a ROCm build, so they are not compiled to objects")
  endif()
endif()
