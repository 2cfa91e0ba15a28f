# CUDA backend: the torch-free kernels in kernels/cuda built with nvcc, plus the CUDA binding.
include(CheckLanguage)
check_language(CUDA)
set(cuda_found FALSE)
if(CMAKE_CUDA_COMPILER AND LOWBIT_TORCH_HAS_CUDA)
  set(cuda_found TRUE)
endif()
lowbit_resolve_backend(LOWBIT_WITH_CUDA LOWBIT_CUDA "${cuda_found}"
  "needs nvcc (found: '${CMAKE_CUDA_COMPILER}') and a CUDA build of libtorch (found: ${LOWBIT_TORCH_HAS_CUDA})")

set(LOWBIT_CUDA_ARCHS "80;90" CACHE STRING "CUDA architectures to compile the kernels for")
if(LOWBIT_WITH_CUDA)
  set(CMAKE_CUDA_ARCHITECTURES ${LOWBIT_CUDA_ARCHS})
  # The shared CUDA runtime, the one libtorch loads: one runtime per process (for every target
  # that links CUDA objects, liblowbit.so included).
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  file(GLOB lowbit_cuda_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cu)
  add_library(lowbit_cuda_kernels STATIC ${lowbit_cuda_sources})
  set_target_properties(lowbit_cuda_kernels PROPERTIES
    POSITION_INDEPENDENT_CODE ON CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
    CUDA_ARCHITECTURES "${LOWBIT_CUDA_ARCHS}")
  # No FMA contraction: the GPU must round exactly as the CPU loops and the ATen reference do.
  target_compile_options(lowbit_cuda_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false -Xptxas=-warn-spills>)
  target_include_directories(lowbit_cuda_kernels PRIVATE ${LOWBIT_INCLUDE_ROOT})
  # nvcc's host toolchain can add its own library folders to the link of liblowbit.so (seen on the GPU
  # machines: /opt/gcc/lib, whose libstdc++.a then got linked in statically, and std::ostream
  # crashed once the library was loaded into Python). Keep only folders outside such toolchains.
  list(FILTER CMAKE_CUDA_IMPLICIT_LINK_DIRECTORIES EXCLUDE REGEX "/gcc(/|$)")
  # No relocatable device code, so no device runtime; and no second, static CUDA runtime.
  list(REMOVE_ITEM CMAKE_CUDA_IMPLICIT_LINK_LIBRARIES cudart_static cudadevrt)
endif()
