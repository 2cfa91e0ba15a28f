// Blockwise quantize / dequantize on the CPU. One OpenMP iteration owns one block: scan it for
// absmax, then encode; so the result does not depend on the number of threads.
#include "quantize_cpu.h"

#include <omp.h>

#include <algorithm>
#include <mutex>

#include "../common/encode.h"
#include "../common/float_convert.h"
#include "bucket_encoder.h"

namespace lowbit {
namespace kernels {

const BucketEncoder& bucket_encoder(QuantFormat fmt) {
  static const BucketEncoder* encoders[kNumQuantFormats] = {};
  static std::once_flag once[kNumQuantFormats];
  const int i = static_cast<int>(fmt);
  std::call_once(once[i], [&] { encoders[i] = new BucketEncoder(fmt); });
  return *encoders[i];
}

namespace {

template <typename T>
void quantize_impl(const QuantizeParams& p) {
  const T* x = static_cast<const T*>(p.input);
  const BucketEncoder& enc = bucket_encoder(p.format);
  const bool is_signed = format_is_signed(p.format);
  const bool four_bit = format_bits(p.format) == 4;
  const int64_t nblocks = num_blocks(p.n, p.block_size);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t begin = b * p.block_size;
    const int64_t len = std::min<int64_t>(p.block_size, p.n - begin);
    BlockScan scan;
    for (int64_t i = 0; i < len; ++i) scan_add(scan, to_f32(x[begin + i]));
    const float amax = block_absmax(scan, is_signed);
    p.absmax[b] = amax;
    if (four_bit) {
      // Blocks hold an even number of elements, so a byte never straddles two blocks.
      uint8_t* out = p.codes + begin / 2;
      for (int64_t i = 0; i < len; i += 2) {
        const uint8_t lo = enc.encode(normalize(to_f32(x[begin + i]), amax));
        const uint8_t hi = i + 1 < len ? enc.encode(normalize(to_f32(x[begin + i + 1]), amax)) : 0;
        out[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    } else {
      uint8_t* out = p.codes + begin;
      for (int64_t i = 0; i < len; ++i) out[i] = enc.encode(normalize(to_f32(x[begin + i]), amax));
    }
  }
}

template <typename T>
void dequantize_impl(const DequantizeParams& p) {
  T* y = static_cast<T*>(p.output);
  const std::vector<float> codebook = make_codebook(p.format);
  const float* cb = codebook.data();
  const bool four_bit = format_bits(p.format) == 4;
  const int64_t nblocks = num_blocks(p.n, p.block_size);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t begin = b * p.block_size;
    const int64_t len = std::min<int64_t>(p.block_size, p.n - begin);
    const float amax = p.absmax[b];
    if (four_bit) {
      const uint8_t* in = p.codes + begin / 2;
      for (int64_t i = 0; i < len; ++i) {
        const uint8_t byte = in[i / 2];
        const uint8_t code = (i & 1) ? (byte >> 4) : (byte & 0xF);
        y[begin + i] = from_f32<T>(decode_value(cb, code, amax));
      }
    } else {
      const uint8_t* in = p.codes + begin;
      for (int64_t i = 0; i < len; ++i) y[begin + i] = from_f32<T>(decode_value(cb, in[i], amax));
    }
  }
}

}  // namespace

void quantize_blockwise_cpu(const QuantizeParams& p) {
  if (p.n == 0) return;
  switch (p.input_type) {
    case ElemType::F32: return quantize_impl<float>(p);
    case ElemType::BF16: return quantize_impl<bf16_t>(p);
    case ElemType::F16: return quantize_impl<f16_t>(p);
  }
}

void dequantize_blockwise_cpu(const DequantizeParams& p) {
  if (p.n == 0) return;
  switch (p.output_type) {
    case ElemType::F32: return dequantize_impl<float>(p);
    case ElemType::BF16: return dequantize_impl<bf16_t>(p);
    case ElemType::F16: return dequantize_impl<f16_t>(p);
  }
}

}  // namespace kernels
}  // namespace lowbit
