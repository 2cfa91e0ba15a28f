// Switches the tests use to run the same optimizer through other step paths; not installed.
#pragma once

#include "lowbit_optimizer.h"

namespace lowbit {
namespace optim {

struct StepTesting {
  // Every parameter through the ATen reference step instead of the fused kernel (the oracle).
  static void use_reference_step(LowbitOptimizer& o, bool on) {
    o.path_ = on ? LowbitOptimizer::StepPath::Reference : LowbitOptimizer::StepPath::Fused;
  }
  // The fused CPU kernel's scalar loop even where AVX-512 is present (what other CPUs run).
  static void use_scalar_kernel(LowbitOptimizer& o, bool on) {
    o.path_ = on ? LowbitOptimizer::StepPath::ScalarLoop : LowbitOptimizer::StepPath::Fused;
  }
};

}  // namespace optim
}  // namespace lowbit
