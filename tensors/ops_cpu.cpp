// CPU kernels of the blockwise ops: argument checks, then the OpenMP loops of kernels/cpu.
#include <torch/library.h>

#include <lowbit/kernels/cpu/quantize_cpu.h>

#include "blockwise_ops.h"

namespace lowbit {
namespace ops {
namespace {

std::tuple<at::Tensor, at::Tensor> quantize_cpu(const at::Tensor& input, std::string_view format,
                                                int64_t block_size) {
  const char* op = "lowbit::quantize_blockwise";
  const QuantizeArgs a = check_quantize_args(input, std::string(format), block_size, op);
  auto [codes, absmax] = allocate_quantized(a);
  const kernels::QuantizeParams p = quantize_params(a, codes, absmax);
  kernels::quantize_blockwise_cpu(p);
  check_absmax_flags(absmax, a, op);
  return {codes, absmax};
}

at::Tensor dequantize_cpu(const at::Tensor& codes, const at::Tensor& absmax, std::string_view format,
                          int64_t block_size, at::IntArrayRef shape, std::optional<at::ScalarType> dtype) {
  const DequantizeArgs a = check_dequantize_args(codes, absmax, std::string(format), block_size, shape, dtype,
                                                 "lowbit::dequantize_blockwise");
  check_absmax_values(a, "lowbit::dequantize_blockwise");
  at::Tensor out = at::empty(a.shape, a.codes.options().dtype(a.dtype));
  const kernels::DequantizeParams p = dequantize_params(a, out);
  kernels::dequantize_blockwise_cpu(p);
  return out;
}

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CPU, m) {
  m.impl("quantize_blockwise", &lowbit::ops::quantize_cpu);
  m.impl("dequantize_blockwise", &lowbit::ops::dequantize_cpu);
}
