# MPI and NCCL, for the distributed/ layer.
find_package(MPI COMPONENTS CXX QUIET)
lowbit_resolve_backend(LOWBIT_WITH_MPI LOWBIT_MPI "${MPI_CXX_FOUND}" "MPI (C++) was not found")

set(nccl_found FALSE)
if(LOWBIT_WITH_CUDA)
  find_path(LOWBIT_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(LOWBIT_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(LOWBIT_NCCL_INCLUDE AND LOWBIT_NCCL_LIBRARY)
    set(nccl_found TRUE)
  endif()
endif()
lowbit_resolve_backend(LOWBIT_WITH_NCCL LOWBIT_NCCL "${nccl_found}" "NCCL needs the CUDA backend and nccl.h/libnccl")
