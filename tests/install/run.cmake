# Installs the build tree into a scratch prefix, then configures, builds and runs the consumer.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
# The installed headers are the public API, exactly: what <lowbit/lowbit.h> reaches, nothing more
# (no kernel internals: vector types, launch records, CUDA headers) and nothing less. Written out
# here, apart from the install rules, so that a header added to or dropped from them fails this test
# until the list of what users get is changed on purpose.
set(expected
  lowbit.h build_config.h
  kernels/common/format_table.h kernels/common/host_device.h kernels/common/state_slots.h kernels/common/step_config.h
  optim/gradient_release.h optim/host_offload.h optim/lowbit_optimizer.h optim/memory_report.h optim/optimizers.h optim/options.h
  optim/state_format.h optim/state_layout.h
  qat/fake_quant_autograd.h qat/fake_quant_config.h qat/fake_quantized_modules.h qat/fake_quantizer.h qat/int_mm_linear.h
  qat/packed_weight.h qat/prepare_convert.h qat/qat.h qat/quantized_modules.h
  tensors/build_info.h tensors/keyed_random.h tensors/qtensor.h tensors/quant_format.h)
if(WITH_MPI)
  list(APPEND expected distributed/communicator.h distributed/compressed_wire.h distributed/distributed.h
       distributed/flat_layout.h distributed/fully_sharded_module.h distributed/init.h distributed/launch_env.h
       distributed/mpi_communicator.h
       distributed/sharded_checkpoint.h distributed/sharded_optimizer.h)
endif()
if(WITH_MPI AND WITH_C10D)
  list(APPEND expected distributed/process_group_communicator.h)
endif()
file(GLOB_RECURSE installed RELATIVE ${WORK_DIR}/prefix/include/lowbit ${WORK_DIR}/prefix/include/lowbit/*)
list(SORT installed)
list(SORT expected)
set(extra ${installed})
list(REMOVE_ITEM extra ${expected})
set(missing ${expected})
list(REMOVE_ITEM missing ${installed})
if(extra OR missing)
  message(FATAL_ERROR "the installed headers are not the public API: installed but not public: [${extra}]; "
                      "public but not installed: [${missing}]")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring the consumer failed:\n${out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the consumer failed:\n${out}")
endif()
execute_process(COMMAND ${WORK_DIR}/build/consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message(STATUS "consumer: ${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the consumer failed (${rc}): ${out}")
endif()
