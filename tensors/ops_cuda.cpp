// CUDA (and ROCm: libtorch's HIP build uses the CUDA key) kernels of the blockwise ops: checks,
// device guard, current stream, then the launchers of kernels/cuda.
#include <torch/library.h>

#include <lowbit/kernels/cuda/quantize_cuda.h>

#include "blockwise_ops.h"
#include "gpu_runtime.h"

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

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CUDA, m) {
  m.impl("quantize_blockwise", &lowbit::ops::quantize_cuda);
  m.impl("dequantize_blockwise", &lowbit::ops::dequantize_cuda);
}
