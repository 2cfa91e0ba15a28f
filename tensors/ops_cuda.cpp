// CUDA (and ROCm: libtorch's HIP build uses the CUDA key) kernels of the blockwise ops: checks,
// device guard, current stream, then the launchers of kernels/cuda.
#include <torch/library.h>

#include "../kernels/cuda/quantize_cuda.h"

#include "blockwise_ops.h"
#include "gpu_runtime.h"
#include "wire_ops.h"

namespace lowbit {
namespace ops {
namespace {

std::tuple<at::Tensor, at::Tensor> quantize_cuda(const at::Tensor& input, std::string_view format,
                                                 int64_t block_size) {
  const char* op = "lowbit::quantize_blockwise";
  const QuantizeArgs a = check_quantize_args(input, std::string(format), block_size, op);
  const GpuGuard guard(a.input.device());
  auto [codes, absmax] = allocate_quantized(a);
  const kernels::QuantizeParams p = quantize_params(a, codes, absmax);
  const char* err = kernels::quantize_blockwise_gpu(p, current_gpu_stream());
  TORCH_CHECK(err == nullptr, op, ": CUDA launch failed: ", err);
  check_absmax_flags(absmax, a, op);
  return {codes, absmax};
}

at::Tensor dequantize_cuda(const at::Tensor& codes, const at::Tensor& absmax, std::string_view format,
                           int64_t block_size, at::IntArrayRef shape, std::optional<at::ScalarType> dtype) {
  const char* op = "lowbit::dequantize_blockwise";
  const DequantizeArgs a = check_dequantize_args(codes, absmax, std::string(format), block_size, shape, dtype, op);
  check_absmax_values(a, op);
  const GpuGuard guard(a.codes.device());
  at::Tensor out = at::empty(a.shape, a.codes.options().dtype(a.dtype));
  const kernels::DequantizeParams p = dequantize_params(a, out);
  const char* err = kernels::dequantize_blockwise_gpu(p, current_gpu_stream());
  TORCH_CHECK(err == nullptr, op, ": CUDA launch failed: ", err);
  return out;
}

// One launch per row on the current stream; a flagged block is carried, not refused (no wait).
void wire_pack_cuda(const at::Tensor& input, const at::Tensor& packed, std::string_view format, int64_t block_size) {
  const char* op = "lowbit::wire_pack_";
  const WireArgs a = check_wire_args(input, packed, std::string(format), block_size, false, op);
  const GpuGuard guard(a.flat.device());
  for (int64_t r = 0; r < a.rows; ++r) {
    const char* err = kernels::quantize_blockwise_gpu(wire_pack_params(a, r), current_gpu_stream());
    TORCH_CHECK(err == nullptr, op, ": CUDA launch failed: ", err);
  }
}

void wire_unpack_cuda(const at::Tensor& packed, const at::Tensor& output, std::string_view format, int64_t block_size) {
  const char* op = "lowbit::wire_unpack_";
  const WireArgs a = check_wire_args(output, packed, std::string(format), block_size, true, op);
  const GpuGuard guard(a.flat.device());
  for (int64_t r = 0; r < a.rows; ++r) {
    const char* err = kernels::dequantize_blockwise_gpu(wire_unpack_params(a, r), current_gpu_stream());
    TORCH_CHECK(err == nullptr, op, ": CUDA launch failed: ", err);
  }
}

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CUDA, m) {
  m.impl("quantize_blockwise", &lowbit::ops::quantize_cuda);
  m.impl("dequantize_blockwise", &lowbit::ops::dequantize_cuda);
  m.impl("wire_pack_", &lowbit::ops::wire_pack_cuda);
  m.impl("wire_unpack_", &lowbit::ops::wire_unpack_cuda);
}
