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

# c10d (torch.distributed's C++ backends, inside the libtorch it was built with: libtorch_cpu for
# Gloo, libtorch_cuda for NCCL): ProcessGroupCommunicator wraps a backend the caller hands in. Found
# when libtorch was built with USE_DISTRIBUTED and ships the c10d headers (the torch wheel does).
set(c10d_found FALSE)
set(c10d_why "libtorch was built without USE_DISTRIBUTED or lacks the c10d headers")
if(LOWBIT_WITH_MPI AND TARGET torch_cpu)
  get_target_property(torch_defs torch_cpu INTERFACE_COMPILE_DEFINITIONS)
  find_path(LOWBIT_C10D_INCLUDE torch/csrc/distributed/c10d/Backend.hpp HINTS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
  if("USE_DISTRIBUTED" IN_LIST torch_defs AND LOWBIT_C10D_INCLUDE)
    set(c10d_found TRUE)
  endif()
elseif(NOT LOWBIT_WITH_MPI)
  set(c10d_why "distributed/ is off (LOWBIT_MPI)")
endif()
lowbit_resolve_backend(LOWBIT_WITH_C10D LOWBIT_C10D "${c10d_found}" "${c10d_why}")
# A ProcessGroupNCCL for the --cuda tests: libtorch_cuda built with it, and lowbit's NCCL headers.
set(LOWBIT_WITH_PG_NCCL_TESTS FALSE)
if(LOWBIT_WITH_C10D AND LOWBIT_WITH_NCCL AND TARGET torch_cuda)
  get_target_property(torch_cuda_defs torch_cuda INTERFACE_COMPILE_DEFINITIONS)
  if("USE_C10D_NCCL" IN_LIST torch_cuda_defs)
    set(LOWBIT_WITH_PG_NCCL_TESTS TRUE)
  endif()
endif()
# The tests build a ProcessGroupGloo, whose header includes Gloo's (the wheel does not ship them;
# Debian's libgloo-dev does, and only headers are used: the code is libtorch's).
set(LOWBIT_WITH_GLOO_TESTS FALSE)
if(LOWBIT_WITH_C10D AND "USE_C10D_GLOO" IN_LIST torch_defs)
  find_path(LOWBIT_GLOO_INCLUDE gloo/rendezvous/store.h)
  if(LOWBIT_GLOO_INCLUDE)
    set(LOWBIT_WITH_GLOO_TESTS TRUE)
  else()
    message(STATUS "lowbit: no Gloo headers (Debian: libgloo-dev) -> ProcessGroupCommunicator's Gloo tests off")
  endif()
endif()

# Adds distributed/ to `target` (the lowbit library) when MPI is on; NCCL's communicator with CUDA,
# the c10d one with LOWBIT_WITH_C10D.
# MPI and NCCL link privately: the public headers (distributed.h) need neither mpi.h nor nccl.h.
function(lowbit_add_distributed target)
  if(NOT LOWBIT_WITH_MPI)
    return()
  endif()
  set(dir ${PROJECT_SOURCE_DIR}/distributed)
  target_sources(${target} PRIVATE
    ${dir}/communicator.cpp ${dir}/compressed_wire.cpp ${dir}/copy_engine_support.cpp ${dir}/flat_layout.cpp ${dir}/fully_sharded_module.cpp ${dir}/init.cpp
    ${dir}/launch_env.cpp ${dir}/mpi_communicator.cpp ${dir}/rank_agreement.cpp ${dir}/serial_worker.cpp ${dir}/sharded_checkpoint.cpp
    ${dir}/sharded_optimizer.cpp)
  target_link_libraries(${target} PRIVATE MPI::MPI_CXX)
  if(LOWBIT_WITH_NCCL)
    target_sources(${target} PRIVATE ${dir}/nccl_communicator.cpp)
    target_include_directories(${target} PRIVATE ${LOWBIT_NCCL_INCLUDE})
    target_link_libraries(${target} PRIVATE ${LOWBIT_NCCL_LIBRARY} CUDA::cudart)
  endif()
  if(LOWBIT_WITH_C10D)
    # Nothing more to link: c10d lives in the libtorch the library already links.
    target_sources(${target} PRIVATE ${dir}/process_group_communicator.cpp)
    # For `lowbit info` only (not in build_config.h, which every file includes through lowbit.h).
    set_property(SOURCE ${PROJECT_SOURCE_DIR}/tensors/build_info.cpp APPEND PROPERTY COMPILE_DEFINITIONS LOWBIT_WITH_C10D=1)
    install(FILES ${dir}/process_group_communicator.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/lowbit/distributed)
  endif()
  install(FILES ${dir}/communicator.h ${dir}/compressed_wire.h ${dir}/distributed.h ${dir}/flat_layout.h
                ${dir}/fully_sharded_module.h ${dir}/init.h ${dir}/launch_env.h
                ${dir}/sharded_checkpoint.h ${dir}/sharded_optimizer.h ${dir}/mpi_communicator.h
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/lowbit/distributed)
endfunction()
