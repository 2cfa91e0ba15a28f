# Finds libtorch: Torch_DIR if given (CMake or environment variable), else the `torch` Python wheel's
# CMake package.
if(NOT Torch_DIR AND DEFINED ENV{Torch_DIR})
  set(Torch_DIR "$ENV{Torch_DIR}")
endif()
if(NOT Torch_DIR)
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import torch; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE LOWBIT_TORCH_PREFIX OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE torch_rc ERROR_QUIET)
    if(torch_rc EQUAL 0)
      list(APPEND CMAKE_PREFIX_PATH "${LOWBIT_TORCH_PREFIX}")
    endif()
  endif()
endif()
# libtorch's CMake appends its own gencode list and flags to CMAKE_CUDA_FLAGS; our kernels are
# torch-free and choose their architectures themselves, so keep the flags as they were.
set(lowbit_saved_cuda_flags "${CMAKE_CUDA_FLAGS}")
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
endif()
find_package(Torch REQUIRED)
set(CMAKE_CUDA_FLAGS "${lowbit_saved_cuda_flags}")
if(NOT TARGET torch)
  message(FATAL_ERROR "libtorch not found: install the torch wheel (pip install torch==2.11.0) or pass -DTorch_DIR=")
endif()
# torch_cpu carries the compile definitions and include dirs we need; whether this libtorch was
# built with CUDA decides whether the CUDA binding can link.
if(TARGET c10_cuda OR TARGET torch_cuda)
  set(LOWBIT_TORCH_HAS_CUDA TRUE)
else()
  set(LOWBIT_TORCH_HAS_CUDA FALSE)
endif()
if(TARGET c10_hip OR TARGET torch_hip)
  set(LOWBIT_TORCH_HAS_ROCM TRUE)
else()
  set(LOWBIT_TORCH_HAS_ROCM FALSE)
endif()
