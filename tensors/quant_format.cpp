// Format names, codebooks as tensors, block size validation.
#include "quant_format.h"

#include "../kernels/common/code_tables.h"

namespace lowbit {

QuantFormat format_from_name(const std::string& name) {
  QuantFormat f;
  TORCH_CHECK(parse_format(name, &f), "lowbit: unknown quantization format '", name, "'; expected one of ",
              all_format_names());
  return f;
}

at::Tensor codebook(QuantFormat format) {
  const std::vector<float> cb = kernels::make_codebook(format);
  return at::tensor(at::ArrayRef<float>(cb), at::kFloat);
}

int64_t resolve_block_size(QuantFormat format, int64_t block_size, const char* what) {
  if (block_size == 0) return default_block_size(format);
  TORCH_CHECK(is_valid_block_size(block_size), what, ": block_size must be 0 (the format's default) or a power of two in [",
              kMinBlockSize, ", ", kMaxBlockSize, "], got ", block_size);
  return block_size;
}

}  // namespace lowbit
