// Argument checks shared by every backend of the blockwise ops, so all of them refuse the same
// inputs with the same messages.
#include "blockwise_ops.h"

#include <limits>

namespace lowbit {
namespace ops {

kernels::ElemType elem_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return kernels::ElemType::F32;
    case at::kBFloat16: return kernels::ElemType::BF16;
    case at::kHalf: return kernels::ElemType::F16;
    default: TORCH_CHECK(false, "lowbit: unsupported dtype ", t, "; expected float32, bfloat16 or float16");
  }
}

QuantizeArgs check_quantize_args(const at::Tensor& input, const std::string& format, int64_t block_size,
                                 const char* op) {
  TORCH_CHECK(input.defined(), op, ": input is an undefined tensor");
  const auto t = input.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, op,
              ": input must be float32, bfloat16 or float16, got ", t);
  TORCH_CHECK(input.layout() == at::kStrided, op, ": input must be a dense (strided) tensor, got layout ",
              input.layout());
  QuantizeArgs a;
  a.format = format_from_name(format);
  a.block_size = resolve_block_size(a.format, block_size, op);
  a.input = input.contiguous().view(-1);
  return a;
}

DequantizeArgs check_dequantize_args(const at::Tensor& codes, const at::Tensor& absmax, const std::string& format,
                                     int64_t block_size, at::IntArrayRef shape, std::optional<at::ScalarType> dtype,
                                     const char* op) {
  TORCH_CHECK(codes.defined() && absmax.defined(), op, ": codes and absmax must be defined tensors");
  TORCH_CHECK(codes.scalar_type() == at::kByte, op, ": codes must be uint8, got ", codes.scalar_type());
  TORCH_CHECK(absmax.scalar_type() == at::kFloat, op, ": absmax must be float32, got ", absmax.scalar_type());
  TORCH_CHECK(codes.device() == absmax.device(), op, ": codes are on ", codes.device(), " but absmax is on ",
              absmax.device(), "; both must be on one device");
  DequantizeArgs a;
  a.format = format_from_name(format);
  a.block_size = resolve_block_size(a.format, block_size, op);
  a.shape = shape.vec();
  a.numel = 1;
  for (const int64_t s : a.shape) {
    TORCH_CHECK(s >= 0, op, ": shape has a negative size ", s);
    a.numel *= s;
  }
  TORCH_CHECK(codes.numel() == code_bytes(a.format, a.numel), op, ": shape ", shape, " (", a.numel,
              " elements) in format ", format_name(a.format), " needs ", code_bytes(a.format, a.numel),
              " code bytes, got ", codes.numel());
  TORCH_CHECK(absmax.numel() == num_blocks(a.numel, a.block_size), op, ": ", a.numel,
              " elements in blocks of ", a.block_size, " need ", num_blocks(a.numel, a.block_size),
              " absmax values, got ", absmax.numel());
  a.dtype = dtype.value_or(at::kFloat);
  TORCH_CHECK(a.dtype == at::kFloat || a.dtype == at::kBFloat16 || a.dtype == at::kHalf, op,
              ": dtype must be float32, bfloat16 or float16, got ", a.dtype);
  a.codes = codes.contiguous().view(-1);
  a.absmax = absmax.contiguous().view(-1);
  return a;
}

kernels::QuantizeParams quantize_params(const QuantizeArgs& a, at::Tensor& codes, at::Tensor& absmax) {
  kernels::QuantizeParams p;
  p.input = a.input.data_ptr();
  p.input_type = elem_type(a.input.scalar_type());
  p.n = a.input.numel();
  p.block_size = a.block_size;
  p.format = a.format;
  p.codes = codes.data_ptr<uint8_t>();
  p.absmax = absmax.data_ptr<float>();
  return p;
}

kernels::DequantizeParams dequantize_params(const DequantizeArgs& a, at::Tensor& out) {
  kernels::DequantizeParams p;
  p.codes = a.codes.data_ptr<uint8_t>();
  p.absmax = a.absmax.data_ptr<float>();
  p.n = a.numel;
  p.block_size = a.block_size;
  p.format = a.format;
  p.output = out.data_ptr();
  p.output_type = elem_type(a.dtype);
  return p;
}

std::tuple<at::Tensor, at::Tensor> allocate_quantized(const QuantizeArgs& a) {
  const int64_t n = a.input.numel();
  const auto opts = a.input.options();
  return {at::empty({code_bytes(a.format, n)}, opts.dtype(at::kByte)),
          at::empty({num_blocks(n, a.block_size)}, opts.dtype(at::kFloat))};
}

int64_t first_true(const at::Tensor& bad) {
  const at::Tensor flat = bad.reshape(-1);
  if (flat.numel() == 0 || !flat.any().item<bool>()) return -1;
  return flat.nonzero()[0][0].item<int64_t>();
}

void check_absmax_values(const DequantizeArgs& a, const char* op) {
  if (a.absmax.is_meta()) return;
  const int64_t b = first_true(a.absmax.isnan() | (a.absmax < 0) | a.absmax.isinf());
  if (b < 0) return;
  TORCH_CHECK(false, op, ": absmax[", b, "] is ", a.absmax[b].item<float>(),
              "; a block's absmax is a finite scale >= 0 (NaN or negative: the block was flagged invalid when it "
              "was quantized or stepped, and has no values to decode)");
}

void check_absmax_flags(const at::Tensor& absmax, const QuantizeArgs& a, const char* op) {
  const int64_t b = first_true(absmax.isnan() | (absmax < 0));
  if (b < 0) return;
  const int64_t first = b * a.block_size;
  const int64_t last = std::min(first + a.block_size, a.input.numel()) - 1;
  const bool nonfinite = std::isnan(absmax[b].item<float>());
  TORCH_CHECK(!nonfinite, op, ": input holds NaN or Inf in block ", b, " (elements ", first, "..", last,
              " of the flattened input); lowbit refuses non-finite values instead of encoding garbage");
  TORCH_CHECK(false, op, ": input holds negative values in block ", b, " (elements ", first, "..", last,
              "), but format ", format_name(a.format), " is unsigned");
}

}  // namespace ops
}  // namespace lowbit
