# The Python package's side of the build (pyproject.toml; scikit-build-core sets SKBUILD): where
# liblowbit.so goes in the wheel, and which torch it is built against.
#
# liblowbit.so is installed into the package folder (component `python`, the only one the wheel
# takes), as a plain file: a wheel holds no symbolic links. `import lowbit` loads it from there
# after `import torch`, whose libraries it then finds already loaded.

# LOWBIT_PREBUILT_LIBRARY (a liblowbit.so, or the build folder holding one): package that library
# instead of compiling it again (the tests install the package from the build they test).
function(lowbit_python_package_prebuilt path)
  if(IS_DIRECTORY "${path}")
    set(path "${path}/liblowbit.so")
  endif()
  if(NOT EXISTS "${path}")
    message(FATAL_ERROR "LOWBIT_PREBUILT_LIBRARY: ${path} does not exist; build the library first (scripts/setup)")
  endif()
  file(REAL_PATH "${path}" real)  # liblowbit.so is a link to the versioned file
  install(FILES "${real}" DESTINATION lowbit RENAME liblowbit.so COMPONENT python)
  add_custom_target(lowbit)  # what pyproject.toml builds: here, nothing
  message(STATUS "lowbit: packaging the prebuilt ${real}")
endfunction()

# The torch of the interpreter that runs the build. Under pip's build isolation that interpreter
# hides its own site-packages; `python -I` (isolated mode: no PYTHONPATH, so no pip overlay) sees
# them again, so `pip install .` builds against the installed torch instead of downloading one.
function(lowbit_python_find_torch)
  if(Torch_DIR OR DEFINED ENV{Torch_DIR})
    return()
  endif()
  set(python "${Python_EXECUTABLE}")
  if(NOT python)
    set(python "${Python3_EXECUTABLE}")
  endif()
  foreach(flags "-c" "-I;-c")
    execute_process(
      COMMAND ${python} ${flags} "import torch; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE prefix OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
    if(rc EQUAL 0)
      set(CMAKE_PREFIX_PATH ${CMAKE_PREFIX_PATH} "${prefix}" PARENT_SCOPE)
      message(STATUS "lowbit: torch for the Python package from ${prefix}")
      return()
    endif()
  endforeach()
  message(FATAL_ERROR "lowbit: ${python} cannot import torch; install torch first (pip install torch)")
endfunction()

function(lowbit_python_package_install target)
  install(FILES $<TARGET_FILE:${target}> DESTINATION lowbit RENAME liblowbit.so COMPONENT python)
endfunction()
