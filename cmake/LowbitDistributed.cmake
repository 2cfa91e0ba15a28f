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

# Adds distributed/ to `target` (the lowbit library) when MPI is on; NCCL's communicator with CUDA.
# MPI and NCCL link privately: the public headers (distributed.h) need neither mpi.h nor nccl.h.
function(lowbit_add_distributed target)
  if(NOT LOWBIT_WITH_MPI)
    return()
  endif()
  set(dir ${PROJECT_SOURCE_DIR}/distributed)
  target_sources(${target} PRIVATE
    ${dir}/communicator.cpp ${dir}/flat_layout.cpp ${dir}/fragment_state.cpp ${dir}/init.cpp
    ${dir}/launch_env.cpp ${dir}/mpi_communicator.cpp ${dir}/sharded_checkpoint.cpp ${dir}/sharded_optimizer.cpp)
  target_link_libraries(${target} PRIVATE MPI::MPI_CXX)
  if(LOWBIT_WITH_NCCL)
    target_sources(${target} PRIVATE ${dir}/nccl_communicator.cpp)
    target_include_directories(${target} PRIVATE ${LOWBIT_NCCL_INCLUDE})
    target_link_libraries(${target} PRIVATE ${LOWBIT_NCCL_LIBRARY} CUDA::cudart)
  endif()
  install(FILES ${dir}/communicator.h ${dir}/distributed.h ${dir}/flat_layout.h ${dir}/init.h ${dir}/launch_env.h
                ${dir}/sharded_checkpoint.h ${dir}/sharded_optimizer.h ${dir}/mpi_communicator.h
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/lowbit/distributed)
endfunction()
