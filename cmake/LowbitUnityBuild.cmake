# Test programs built as a few unity files (CMake's UNITY_BUILD): each test file pays once for what
# every file of a target instantiates again (gtest's machinery, ATen's inline functions, the
# precompiled header's load), so 8 test files compile in about the time of 2.5 (measured on 2
# cores: 8 of lowbit_tests' files 169 s of CPU one by one, 45-52 s as one unity file). CI builds the
# tests twice (with CUDA, then under the sanitizers). The library is not: its kernel files carry
# their own flags (AVX2, AVX-512) and are compiled alone anyway. Test files keep their helpers in
# anonymous namespaces with names no other test file of the target uses (a unity file is one
# translation unit); LOWBIT_UNITY_BUILD=OFF compiles them one by one (a quicker rebuild of one file).
option(LOWBIT_UNITY_BUILD "Compile each test program's files as a few unity files" ON)

# lowbit_unity_build(TARGET...): the target's C++ files in unity files of 8.
function(lowbit_unity_build)
  if(NOT LOWBIT_UNITY_BUILD)
    return()
  endif()
  foreach(target ${ARGN})
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endforeach()
endfunction()
