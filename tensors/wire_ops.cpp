// The wire ops (wire_ops.h): argument checks shared by every backend, each row's kernel
// parameters, the ATen reference and the calls through the dispatcher. The CPU and CUDA kernels
// register in ops_cpu.cpp / ops_cuda.cpp beside the blockwise ops whose launchers they reuse.
#include "wire_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cmath>

#include "blockwise_ops.h"

namespace lowbit {
namespace ops {

WireArgs check_wire_args(const at::Tensor& flat, const at::Tensor& packed, const std::string& format,
                         int64_t block_size, bool unpacking, const char* op) {
  const char* flat_name = unpacking ? "output" : "input";
  TORCH_CHECK(flat.defined() && packed.defined(), op, ": ", flat_name, " and packed must be defined tensors");
  const auto t = flat.scalar_type();
  if (unpacking) {
    TORCH_CHECK(t == at::kFloat, op, ": output must be float32 (the receiver sums in float32), got ", t);
  } else {
    TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, op,
                ": input must be float32, bfloat16 or float16, got ", t);
  }
  TORCH_CHECK(packed.scalar_type() == at::kByte, op, ": packed must be uint8, got ", packed.scalar_type());
  TORCH_CHECK(flat.layout() == at::kStrided && flat.is_contiguous(), op, ": ", flat_name,
              " must be a dense contiguous tensor");
  TORCH_CHECK(packed.layout() == at::kStrided && packed.is_contiguous() && packed.dim() == 2, op,
              ": packed must be a contiguous 2-D uint8 tensor [rows, row bytes], got shape ", packed.sizes());
  TORCH_CHECK(flat.device() == packed.device(), op, ": ", flat_name, " is on ", flat.device(), " but packed is on ",
              packed.device());
  WireArgs a;
  a.format = format_from_name(format);
  TORCH_CHECK(format_is_signed(a.format), op, ": format ", format_name(a.format),
              " is unsigned; gradients and updates need a signed format");
  a.block_size = resolve_block_size(a.format, block_size, op);
  a.rows = packed.size(0);
  TORCH_CHECK(a.rows > 0, op, ": packed has no rows");
  TORCH_CHECK(flat.numel() % a.rows == 0, op, ": ", flat_name, " has ", flat.numel(),
              " elements, not a whole number of chunks for packed's ", a.rows, " rows");
  a.chunk = flat.numel() / a.rows;
  TORCH_CHECK(a.chunk % a.block_size == 0, op, ": a row of ", a.chunk, " elements is not a whole number of blocks of ",
              a.block_size);
  a.row_bytes = wire_row_bytes(a.format, a.chunk, a.block_size);
  TORCH_CHECK(packed.size(1) == a.row_bytes, op, ": packed rows have ", packed.size(1), " bytes; ", a.chunk,
              " elements in format ", format_name(a.format), " with blocks of ", a.block_size, " need ", a.row_bytes);
  TORCH_CHECK(flat.numel() == 0 || !flat.storage().is_alias_of(packed.storage()), op, ": ", flat_name,
              " and packed share memory");
  a.flat = flat.view(-1);
  a.packed = packed;
  return a;
}

kernels::QuantizeParams wire_pack_params(const WireArgs& a, int64_t r) {
  kernels::QuantizeParams p;
  uint8_t* row = a.packed.data_ptr<uint8_t>() + r * a.row_bytes;
  p.input = static_cast<const char*>(a.flat.data_ptr()) + r * a.chunk * a.flat.element_size();
  p.input_type = elem_type(a.flat.scalar_type());
  p.n = a.chunk;
  p.block_size = a.block_size;
  p.format = a.format;
  p.codes = row;
  p.absmax = reinterpret_cast<float*>(row + code_bytes(a.format, a.chunk));
  return p;
}

kernels::DequantizeParams wire_unpack_params(const WireArgs& a, int64_t r) {
  kernels::DequantizeParams p;
  const uint8_t* row = a.packed.data_ptr<uint8_t>() + r * a.row_bytes;
  p.codes = row;
  p.absmax = reinterpret_cast<const float*>(row + code_bytes(a.format, a.chunk));
  p.n = a.chunk;
  p.block_size = a.block_size;
  p.format = a.format;
  p.output = a.flat.data_ptr<float>() + r * a.chunk;
  p.output_type = kernels::ElemType::F32;
  return p;
}

void wire_pack_reference(const at::Tensor& input, const at::Tensor& packed, std::string_view format,
                         int64_t block_size) {
  const WireArgs a = check_wire_args(input, packed, std::string(format), block_size, false, "lowbit::wire_pack_");
  const int64_t cb = code_bytes(a.format, a.chunk);
  for (int64_t r = 0; r < a.rows; ++r) {
    auto [codes, absmax] = quantize_reference_flagged(a.flat.narrow(0, r * a.chunk, a.chunk), format, a.block_size);
    a.packed[r].narrow(0, 0, cb).copy_(codes);
    a.packed[r].narrow(0, cb, a.row_bytes - cb).copy_(absmax.contiguous().view(at::kByte));
  }
}

void wire_unpack_reference(const at::Tensor& packed, const at::Tensor& output, std::string_view format,
                           int64_t block_size) {
  const WireArgs a = check_wire_args(output, packed, std::string(format), block_size, true, "lowbit::wire_unpack_");
  const int64_t cb = code_bytes(a.format, a.chunk), nb = a.chunk / a.block_size;
  for (int64_t r = 0; r < a.rows; ++r) {
    const at::Tensor codes = a.packed[r].narrow(0, 0, cb);
    const at::Tensor absmax = a.packed[r].narrow(0, cb, a.row_bytes - cb).clone().view(at::kFloat);
    const at::Tensor flagged = absmax.isnan();
    const at::Tensor values = dequantize_reference(codes, at::where(flagged, at::zeros_like(absmax), absmax), format,
                                                   a.block_size, {a.chunk}, at::kFloat);
    a.flat.narrow(0, r * a.chunk, a.chunk).copy_(values.view({nb, a.block_size}).masked_fill(flagged.unsqueeze(1), NAN).view(-1));
  }
}

void wire_pack_(const at::Tensor& input, const at::Tensor& packed, const std::string& format, int64_t block_size) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lowbit::wire_pack_", "")
                             .typed<void(const at::Tensor&, const at::Tensor&, c10::string_view, int64_t)>();
  op.call(input, packed, format, block_size);
}

void wire_unpack_(const at::Tensor& packed, const at::Tensor& output, const std::string& format, int64_t block_size) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lowbit::wire_unpack_", "")
                             .typed<void(const at::Tensor&, const at::Tensor&, c10::string_view, int64_t)>();
  op.call(packed, output, format, block_size);
}

namespace {

void wire_pack_meta(const at::Tensor& input, const at::Tensor& packed, std::string_view format, int64_t block_size) {
  check_wire_args(input, packed, std::string(format), block_size, false, "lowbit::wire_pack_");
}
void wire_unpack_meta(const at::Tensor& packed, const at::Tensor& output, std::string_view format,
                      int64_t block_size) {
  check_wire_args(output, packed, std::string(format), block_size, true, "lowbit::wire_unpack_");
}

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CompositeExplicitAutograd, m) {
  m.impl("wire_pack_", &lowbit::ops::wire_pack_reference);
  m.impl("wire_unpack_", &lowbit::ops::wire_unpack_reference);
}

TORCH_LIBRARY_IMPL(lowbit, Meta, m) {
  m.impl("wire_pack_", &lowbit::ops::wire_pack_meta);
  m.impl("wire_unpack_", &lowbit::ops::wire_unpack_meta);
}
