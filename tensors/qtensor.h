// QTensor: a tensor stored as blockwise-quantized codes plus one fp32 absmax per block.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "quant_format.h"

namespace lowbit {

class QTensor {
 public:
  QTensor() = default;
  // Wraps existing codes and absmax (e.g. loaded from a checkpoint); checks they fit together.
  QTensor(at::Tensor codes, at::Tensor absmax, std::vector<int64_t> shape, QuantFormat format, int64_t block_size);

  bool defined() const { return codes_.defined(); }
  const at::Tensor& codes() const { return codes_; }    // uint8; 4-bit formats pack 2 per byte
  const at::Tensor& absmax() const { return absmax_; }  // float32, one per block
  const std::vector<int64_t>& sizes() const { return shape_; }
  int64_t numel() const;
  QuantFormat format() const { return format_; }
  int64_t block_size() const { return block_size_; }
  at::Device device() const { return codes_.device(); }

  at::Tensor dequantize(at::ScalarType dtype = at::kFloat) const;
  // Bytes held: codes plus absmax.
  int64_t nbytes() const;
  QTensor to(at::Device device) const;

 private:
  at::Tensor codes_;
  at::Tensor absmax_;
  std::vector<int64_t> shape_;
  QuantFormat format_ = QuantFormat::Dyn8Signed;
  int64_t block_size_ = 0;
};

// Quantizes any float32/bfloat16/float16 tensor on any device (block_size 0 = the format's default).
QTensor quantize(const at::Tensor& input, QuantFormat format, int64_t block_size = 0);
at::Tensor dequantize(const QTensor& q, at::ScalarType dtype = at::kFloat);

}  // namespace lowbit
