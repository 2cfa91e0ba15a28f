// The dispatcher ops of a low-bit collective: what distributed/ puts on the wire and takes off it.
// A flat tensor is cut into rows (one per rank); each row is quantized blockwise into one byte row,
// its codes then its float32 absmax, so a single all-to-all or all-gather carries both.
//
// Schema (TORCH_LIBRARY(lowbit)):
//   wire_pack_(Tensor input, Tensor(a!) packed, str format, int block_size=0) -> ()
//     input: float32, bfloat16 or float16, contiguous, rows * chunk elements, rows = packed.size(0);
//     packed: uint8 [rows, wire_row_bytes(format, chunk, block_size)]. Row r holds
//     quantize_blockwise(input[r * chunk, (r + 1) * chunk)): code bytes, then the absmax values.
//     A block with Inf or NaN is not an error: its absmax is NaN (kernels/common/encode.h's flag), so
//     the receiver decodes NaN there and the step's non-finite check sees it, as it would the
//     uncompressed value.
//   wire_unpack_(Tensor packed, Tensor(a!) output, str format, int block_size=0) -> ()
//     output: float32, contiguous, rows * chunk elements: each row dequantized (a flagged block:
//     NaN).
// The format must be signed (gradients and updates are); block_size (0: the format's default) a
// power of two in [32, 4096] that divides chunk.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "../kernels/common/quantize_params.h"

#include "quant_format.h"

namespace lowbit {
namespace ops {

// Bytes of one packed row of `chunk` elements: its codes, then num_blocks float32 absmax.
inline int64_t wire_row_bytes(QuantFormat format, int64_t chunk, int64_t block_size) {
  return code_bytes(format, chunk) + 4 * num_blocks(chunk, block_size);
}

struct WireArgs {
  at::Tensor flat;    // the unpacked side: input of pack, output of unpack (contiguous, 1-D)
  at::Tensor packed;  // uint8 [rows, row_bytes]
  QuantFormat format;
  int64_t block_size = 0, rows = 0, chunk = 0, row_bytes = 0;
};

// Shared by every backend (one set of messages); `unpacking` names output instead of input.
WireArgs check_wire_args(const at::Tensor& flat, const at::Tensor& packed, const std::string& format,
                         int64_t block_size, bool unpacking, const char* op);

// Kernel parameters for row r of checked arguments.
kernels::QuantizeParams wire_pack_params(const WireArgs& a, int64_t r);
kernels::DequantizeParams wire_unpack_params(const WireArgs& a, int64_t r);

// The ops' bodies on a backend with its own kernels, as quantize_blockwise_op's (blockwise_ops.h):
// row by row (one kernel run per row, in order); a flagged block is carried, not refused.
template <typename B>
void wire_pack_op(const at::Tensor& input, const at::Tensor& packed, std::string_view format, int64_t block_size) {
  const char* op = "lowbit::wire_pack_";
  const WireArgs a = check_wire_args(input, packed, std::string(format), block_size, false, op);
  const typename B::Guard guard(a.flat.device());
  for (int64_t r = 0; r < a.rows; ++r) B::run(wire_pack_params(a, r), op);
}

template <typename B>
void wire_unpack_op(const at::Tensor& packed, const at::Tensor& output, std::string_view format, int64_t block_size) {
  const char* op = "lowbit::wire_unpack_";
  const WireArgs a = check_wire_args(output, packed, std::string(format), block_size, true, op);
  const typename B::Guard guard(a.flat.device());
  for (int64_t r = 0; r < a.rows; ++r) B::run(wire_unpack_params(a, r), op);
}

// The ATen-only references (the CompositeExplicitAutograd kernels, the tests' oracle).
void wire_pack_reference(const at::Tensor& input, const at::Tensor& packed, std::string_view format,
                         int64_t block_size);
void wire_unpack_reference(const at::Tensor& packed, const at::Tensor& output, std::string_view format,
                           int64_t block_size);

// Through the dispatcher (what distributed/ calls).
void wire_pack_(const at::Tensor& input, const at::Tensor& packed, const std::string& format, int64_t block_size);
void wire_unpack_(const at::Tensor& packed, const at::Tensor& output, const std::string& format, int64_t block_size);

}  // namespace ops
}  // namespace lowbit
