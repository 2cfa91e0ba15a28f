// torch::autograd functions over the fake-quant dispatcher ops, so fake quantization trains: the
// clipped straight-through estimator (mask from the fused forward), and LSQ for learnable qparams.
// Tensors passed here are already laid out in contiguous groups (qat/group_layout.h).
// Double backward is refused with a clear error (the STE has no useful second derivative).
#pragma once

#include <torch/torch.h>

namespace lowbit {
namespace qat {

// Fake-quant with qparams from x itself; gradient to x only (torchao treats the qparams as constants).
at::Tensor fake_quant_dynamic(const at::Tensor& x, int64_t group_size, int64_t bits, bool is_signed, bool symmetric,
                              double eps);
// Float8 (format "e4m3" or "e5m2") with one dynamic scale per group; gradient to x through the mask.
at::Tensor fake_quant_float8(const at::Tensor& x, int64_t group_size, const std::string& format, double eps);
// Block-scaled floats ("mxfp4", "mxfp8_e4m3", "mxfp8_e5m2", "nvfp4"), blocks along the flat order.
at::Tensor fake_quant_block_float(const at::Tensor& x, const std::string& format, double eps);
// Fake-quant with given qparams (static observers); gradient to x only.
at::Tensor fake_quant_static(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero_point,
                             int64_t group_size, int64_t bits, bool is_signed);
// Fake-quant with learnable scale (and zero point): LSQ / LSQ+ gradients to all three, the scale and
// zero-point gradients multiplied by grad_factor (LSQ: 1 / sqrt(group_numel * qmax)).
at::Tensor fake_quant_learnable(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero_point,
                                int64_t group_size, int64_t bits, bool is_signed, double grad_factor);

}  // namespace qat
}  // namespace lowbit
