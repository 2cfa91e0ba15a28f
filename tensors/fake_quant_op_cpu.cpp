// CPU kernels of the fake-quant ops: argument checks, then the OpenMP loops of kernels/cpu.
#include <torch/library.h>

#include "../kernels/cpu/fake_quant_cpu.h"

#include "fake_quant_ops.h"

namespace lowbit {
namespace ops {
namespace {

// The backend of the op bodies (fake_quant_ops.h): no device guard, the kernels run in the call.
struct CpuFakeQuant {
  struct Guard {
    explicit Guard(at::Device) {}
  };
  static void run(const kernels::FakeQuantParams& p, const char*) { kernels::fake_quant_cpu(p); }
  static void run(const kernels::Float8FakeQuantParams& p, const char*) { kernels::fake_quant_float8_cpu(p); }
  static void run(const kernels::BlockFloatParams& p, const char*) { kernels::fake_quant_block_float_cpu(p); }
  static void run(const kernels::FakeQuantBackwardParams& p, const char*) { kernels::fake_quant_backward_cpu(p); }
  static void run(const kernels::LsqBackwardParams& p, const char*) { kernels::fake_quant_lsq_backward_cpu(p); }
};

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CPU, m) {
  using namespace lowbit::ops;
  m.impl("fake_quant_dynamic", &fake_quant_dynamic_op<CpuFakeQuant>);
  m.impl("fake_quant_static", &fake_quant_static_op<CpuFakeQuant>);
  m.impl("fake_quant_float8", &fake_quant_float8_op<CpuFakeQuant>);
  m.impl("fake_quant_block_float", &fake_quant_block_float_op<CpuFakeQuant>);
  m.impl("fake_quant_backward", &fake_quant_backward_op<CpuFakeQuant>);
  m.impl("fake_quant_lsq_backward", &fake_quant_lsq_backward_op<CpuFakeQuant>);
}
