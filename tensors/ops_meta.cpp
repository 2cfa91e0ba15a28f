// Meta kernels of the blockwise quantize / dequantize ops: the same argument checks, no data read,
// outputs of the right shapes and dtypes (shape inference, FakeTensor, torch.compile).
#include <torch/library.h>

#include "blockwise_ops.h"

namespace lowbit {
namespace ops {
namespace {

std::tuple<at::Tensor, at::Tensor> quantize_meta(const at::Tensor& input, std::string_view format, int64_t block_size) {
  return allocate_quantized(check_quantize_args(input, std::string(format), block_size, "lowbit::quantize_blockwise"));
}

at::Tensor dequantize_meta(const at::Tensor& codes, const at::Tensor& absmax, std::string_view format,
                           int64_t block_size, at::IntArrayRef shape, std::optional<at::ScalarType> dtype) {
  const DequantizeArgs a = check_dequantize_args(codes, absmax, std::string(format), block_size, shape, dtype,
                                                 "lowbit::dequantize_blockwise");
  return at::empty(a.shape, a.codes.options().dtype(a.dtype));
}

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, Meta, m) {
  m.impl("quantize_blockwise", &lowbit::ops::quantize_meta);
  m.impl("dequantize_blockwise", &lowbit::ops::dequantize_meta);
  m.impl("quantize_blockwise_reference", &lowbit::ops::quantize_meta);
  m.impl("dequantize_blockwise_reference", &lowbit::ops::dequantize_meta);
}
