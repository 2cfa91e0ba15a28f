# The library and the test programs built as a few unity files (CMake's UNITY_BUILD): each file pays
# once for what every file of a target instantiates again (gtest's machinery, ATen's inline
# functions, the precompiled header's load), so 8 files compile in about the time of 2.5 (measured on
# 2 cores: 8 of lowbit_tests' files 169 s of CPU one by one, 45-52 s as one unity file; the library
# cold about 1,160 s of CPU one by one, 553 s with its unity files). CI builds everything twice (with
# CUDA, then under the sanitizers). Left out of the library's unity files: its kernel files (no torch
# header, 1-3 s each) and the files with flags of their own (the x86 loops), which CMake compiles
# alone. Files keep their helpers in anonymous namespaces with names no other file of the target uses
# (a unity file is one translation unit); LOWBIT_UNITY_BUILD=OFF compiles them one by one (a quicker
# rebuild of one file).
option(LOWBIT_UNITY_BUILD "Compile the library's and each test program's files as a few unity files" ON)

# lowbit_unity_build(TARGET...): the target's C++ files in unity files of 8.
function(lowbit_unity_build)
  if(NOT LOWBIT_UNITY_BUILD)
    return()
  endif()
  foreach(target ${ARGN})
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endforeach()
endfunction()
