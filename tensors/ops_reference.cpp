// The reference blockwise quantize / dequantize, written with ATen ops only. It is the test oracle
// and the CompositeExplicitAutograd kernel that serves any device without a dedicated one.
#include <torch/library.h>

#include <cfloat>

#include "../kernels/common/code_tables.h"

#include "blockwise_ops.h"

namespace lowbit {
namespace ops {

std::tuple<at::Tensor, at::Tensor> quantize_reference_flagged(const at::Tensor& input, std::string_view format,
                                                              int64_t block_size) {
  const char* op = "lowbit::quantize_blockwise";
  const QuantizeArgs a = check_quantize_args(input, std::string(format), block_size, op);
  const int64_t n = a.input.numel();
  const int64_t B = a.block_size;
  const int64_t nb = num_blocks(n, B);
  const auto fopts = a.input.options().dtype(at::kFloat);
  at::Tensor padded = at::zeros({nb * B}, fopts);
  padded.narrow(0, 0, n).copy_(a.input);
  const at::Tensor blocks = padded.view({nb, B});

  // absmax with the in-band flags of kernels/common/encode.h.
  const at::Tensor amax = blocks.abs().amax(1);
  const at::Tensor nonfinite = at::logical_not(at::isfinite(blocks)).any(1);
  at::Tensor absmax = amax;
  if (!format_is_signed(a.format)) {
    absmax = at::where((blocks < 0).any(1), -amax.clamp_min(FLT_MIN), absmax);
  }
  absmax = at::where(nonfinite, at::full_like(absmax, NAN), absmax);

  const kernels::EncodeTable tab = kernels::make_encode_table(a.format);
  const at::Tensor thresholds =
      at::tensor(at::ArrayRef<float>(tab.thresholds, tab.num_values - 1), at::kFloat).to(blocks.device());
  const at::Tensor sorted_codes =
      at::tensor(at::ArrayRef<uint8_t>(tab.sorted_codes, tab.num_values), at::kByte).to(blocks.device());
  // Normalizer of kernels/common/encode.h: (x * pre) * (1 / (absmax * pre)), 0 for all-zero blocks.
  const at::Tensor pre = at::where(absmax < 0x1p-64f, at::full_like(absmax, 0x1p64f),
                                   at::where(absmax > 0x1p64f, at::full_like(absmax, 0x1p-64f), at::ones_like(absmax)));
  const at::Tensor inv = at::where(absmax > 0, at::ones_like(absmax) / (absmax * pre), at::zeros_like(absmax));
  const at::Tensor normalized = (blocks * pre.unsqueeze(1)) * inv.unsqueeze(1);
  // #{thresholds < x}; the kernels order floats by encode.h's order keys, where a NaN with its sign
  // set is below every threshold (bucketize puts every NaN above them). Only flagged blocks hold one.
  at::Tensor idx = at::bucketize(normalized, thresholds, /*out_int32=*/false, /*right=*/false);
  idx = at::where(at::logical_and(at::isnan(normalized), at::signbit(normalized)), at::zeros_like(idx), idx);
  at::Tensor codes = sorted_codes.index({idx.view(-1)}).narrow(0, 0, n);
  if (format_bits(a.format) == 4) codes = pack_nibbles(codes);
  return {codes.contiguous(), absmax.contiguous()};
}

std::tuple<at::Tensor, at::Tensor> quantize_reference(const at::Tensor& input, std::string_view format,
                                                      int64_t block_size) {
  auto [codes, absmax] = quantize_reference_flagged(input, format, block_size);
  const char* op = "lowbit::quantize_blockwise";
  check_absmax_flags(absmax, check_quantize_args(input, std::string(format), block_size, op), op);
  return {codes, absmax};
}

at::Tensor dequantize_reference(const at::Tensor& codes, const at::Tensor& absmax, std::string_view format,
                                int64_t block_size, at::IntArrayRef shape, std::optional<at::ScalarType> dtype) {
  const DequantizeArgs a = check_dequantize_args(codes, absmax, std::string(format), block_size, shape, dtype,
                                                 "lowbit::dequantize_blockwise");
  check_absmax_values(a, "lowbit::dequantize_blockwise");
  const int64_t n = a.numel;
  const at::Tensor idx = format_bits(a.format) == 4 ? unpack_nibbles(a.codes, n) : a.codes;
  const at::Tensor cb = codebook(a.format).to(a.codes.device());
  const at::Tensor scale = a.absmax.repeat_interleave(a.block_size).narrow(0, 0, n);
  const at::Tensor values = cb.index({idx.to(at::kLong)}) * scale;
  return values.to(a.dtype).view(a.shape);
}

}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CompositeExplicitAutograd, m) {
  m.impl("quantize_blockwise", &lowbit::ops::quantize_reference);
  m.impl("dequantize_blockwise", &lowbit::ops::dequantize_reference);
  m.impl("quantize_blockwise_reference", &lowbit::ops::quantize_reference);
  m.impl("dequantize_blockwise_reference", &lowbit::ops::dequantize_reference);
}
