// CPU kernels of the blockwise ops: argument checks, then the OpenMP loops of kernels/cpu.
#include <torch/library.h>

#include "../kernels/cpu/quantize_cpu.h"

#include "blockwise_ops.h"
#include "wire_ops.h"

namespace lowbit {
namespace ops {
namespace {

// The backend of the op bodies (blockwise_ops.h, wire_ops.h): no device guard, each kernel runs
// over OpenMP's threads in the call.
struct CpuBlockwise {
  struct Guard {
    explicit Guard(at::Device) {}
  };
  static void run(const kernels::QuantizeParams& p, const char*) { kernels::quantize_blockwise_cpu(p); }
  static void run(const kernels::DequantizeParams& p, const char*) { kernels::dequantize_blockwise_cpu(p); }
};

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CPU, m) {
  using namespace lowbit::ops;
  m.impl("quantize_blockwise", &quantize_blockwise_op<CpuBlockwise>);
  m.impl("dequantize_blockwise", &dequantize_blockwise_op<CpuBlockwise>);
  m.impl("wire_pack_", &wire_pack_op<CpuBlockwise>);
  m.impl("wire_unpack_", &wire_unpack_op<CpuBlockwise>);
}
