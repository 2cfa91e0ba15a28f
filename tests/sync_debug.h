// The first host synchronization a piece of GPU code makes: fn runs with libtorch's CUDA sync debug
// mode turned to errors (c10::cuda::warning_state), so a wait for the device throws. Returns that
// error's text, or "" when fn never waited.
#pragma once

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include <functional>
#include <string>

namespace lowbit_test {

inline std::string first_host_sync(const std::function<void()>& fn) {
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  std::string err;
  try {
    fn();
  } catch (const c10::Error& e) {
    err = e.what_without_backtrace();
  }
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  return err;
}

}  // namespace lowbit_test
