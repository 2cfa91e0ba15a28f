// CPU kernels of the blockwise ops: argument checks, then the OpenMP loops of kernels/cpu.
#include <torch/library.h>

#include "../kernels/cpu/quantize_cpu.h"

#include "blockwise_ops.h"
#include "wire_ops.h"

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

// Rows one after another, each over OpenMP's threads; a flagged block is carried, not refused.
void wire_pack_cpu(const at::Tensor& input, const at::Tensor& packed, std::string_view format, int64_t block_size) {
  const WireArgs a = check_wire_args(input, packed, std::string(format), block_size, false, "lowbit::wire_pack_");
  for (int64_t r = 0; r < a.rows; ++r) kernels::quantize_blockwise_cpu(wire_pack_params(a, r));
}

void wire_unpack_cpu(const at::Tensor& packed, const at::Tensor& output, std::string_view format, int64_t block_size) {
  const WireArgs a = check_wire_args(output, packed, std::string(format), block_size, true, "lowbit::wire_unpack_");
  for (int64_t r = 0; r < a.rows; ++r) kernels::dequantize_blockwise_cpu(wire_unpack_params(a, r));
}

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CPU, m) {
  m.impl("quantize_blockwise", &lowbit::ops::quantize_cpu);
  m.impl("dequantize_blockwise", &lowbit::ops::dequantize_cpu);
  m.impl("wire_pack_", &lowbit::ops::wire_pack_cpu);
  m.impl("wire_unpack_", &lowbit::ops::wire_unpack_cpu);
}
