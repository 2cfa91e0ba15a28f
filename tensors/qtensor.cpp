// QTensor and the quantize/dequantize entry points, which go through the dispatcher so each
// device gets its own kernel.
#include "qtensor.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include "blockwise_ops.h"

namespace lowbit {

QTensor::QTensor(at::Tensor codes, at::Tensor absmax, std::vector<int64_t> shape, QuantFormat format,
                 int64_t block_size)
    : codes_(std::move(codes)), absmax_(std::move(absmax)), shape_(std::move(shape)), format_(format) {
  block_size_ = resolve_block_size(format, block_size, "lowbit::QTensor");
  // Same rules as the dequantize op: sizes, dtypes and devices must agree.
  ops::check_dequantize_args(codes_, absmax_, format_name(format_), block_size_, shape_, at::kFloat,
                             "lowbit::QTensor");
}

int64_t QTensor::numel() const {
  int64_t n = 1;
  for (const int64_t s : shape_) n *= s;
  return n;
}

at::Tensor QTensor::dequantize(at::ScalarType dtype) const {
  TORCH_CHECK(defined(), "lowbit::QTensor::dequantize: the QTensor is empty (default-constructed)");
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::dequantize_blockwise", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, std::string_view, int64_t,
                                         at::IntArrayRef, std::optional<at::ScalarType>)>();
  return op.call(codes_, absmax_, format_name(format_), block_size_, shape_, dtype);
}

int64_t QTensor::nbytes() const {
  if (!defined()) return 0;
  return static_cast<int64_t>(codes_.nbytes() + absmax_.nbytes());
}

QTensor QTensor::to(at::Device device) const {
  TORCH_CHECK(defined(), "lowbit::QTensor::to: the QTensor is empty (default-constructed)");
  return QTensor(codes_.to(device), absmax_.to(device), shape_, format_, block_size_);
}

QTensor quantize(const at::Tensor& input, QuantFormat format, int64_t block_size) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::quantize_blockwise", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, std::string_view, int64_t)>();
  const int64_t block = resolve_block_size(format, block_size, "lowbit::quantize");
  auto [codes, absmax] = op.call(input, format_name(format), block);
  return QTensor(codes, absmax, input.sizes().vec(), format, block);
}

at::Tensor dequantize(const QTensor& q, at::ScalarType dtype) { return q.dequantize(dtype); }

}  // namespace lowbit
