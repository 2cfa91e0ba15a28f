// Blockwise quantize / dequantize on the CPU. One OpenMP iteration owns one block: scan it for
// absmax, then encode; so the result does not depend on the number of threads.
#include "quantize_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <type_traits>
#include <vector>

#include "../common/encode.h"
#include "../common/float_convert.h"
#include "block_ops.h"

namespace lowbit {
namespace kernels {

namespace {


// Two passes over a block that stays in L1: the scan (vectorizes), then normalize-and-encode
// (format_tables.h); the next blocks' input is prefetched meanwhile.
template <typename T>
void quantize_impl(const QuantizeParams& p) {
  const T* x = static_cast<const T*>(p.input);
  const bool four_bit = format_bits(p.format) == 4;
  const int64_t nblocks = num_blocks(p.n, p.block_size);
  const FormatView fmt = format_tables(p.format);
  const bool format_signed = format_is_signed(p.format);
  if constexpr (std::is_same_v<T, float>) {
    // fp32 with AVX-512: each thread's share of blocks in one call (static split: any split gives
    // the same result, blocks being independent).
    bool done = true;
#pragma omp parallel reduction(&& : done)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      done = quantize_blocks_f32(fmt, format_signed, x, p.n, p.block_size, nblocks * t / nt, nblocks * (t + 1) / nt,
                                 p.codes, p.absmax);
    }
    if (done) return;
  }
#pragma omp parallel
  {
    std::vector<float> buf(p.block_size);
    float* v = buf.data();
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t begin = b * p.block_size;
      const int64_t len = std::min<int64_t>(p.block_size, p.n - begin);
      const int64_t ahead = begin + kPrefetchBlocks * p.block_size;
      if (ahead < p.n) prefetch_range(x + ahead, std::min<int64_t>(p.block_size, p.n - ahead) * sizeof(T));
      uint32_t max_bits = 0, neg = 0;
      // fp32 input is encoded where it lies (in L1 after the scan); 16-bit input is widened once.
      const float* values = v;
      if constexpr (std::is_same_v<T, float>) {
        scan_block(x + begin, len, &max_bits, &neg);
        values = x + begin;
      } else {
        scan_block(x + begin, len, v, &max_bits, &neg);
      }
      p.absmax[b] = encode_scanned_block(fmt, format_signed, values, len, max_bits, neg,
                                         p.codes + (four_bit ? begin / 2 : begin));
    }
  }
}

template <typename T>
void dequantize_impl(const DequantizeParams& p) {
  T* y = static_cast<T*>(p.output);
  const FormatView fmt = format_tables(p.format);
  const float* cb = fmt.codebook;
  const bool four_bit = format_bits(p.format) == 4;
  const int64_t nblocks = num_blocks(p.n, p.block_size);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t begin = b * p.block_size;
    const int64_t len = std::min<int64_t>(p.block_size, p.n - begin);
    const float amax = p.absmax[b];
    if (four_bit) {
      const uint8_t* in = p.codes + begin / 2;
      T* out = y + begin;
      if constexpr (sizeof(T) == 4) {
        decode_codes4(fmt, in, len, amax, reinterpret_cast<float*>(out));
      } else {
        for (int64_t i = 0; i + 1 < len; i += 2) {
          const uint8_t byte = in[i / 2];
          out[i] = from_f32<T>(decode_value(cb, byte & 0xF, amax));
          out[i + 1] = from_f32<T>(decode_value(cb, byte >> 4, amax));
        }
        if (len % 2) out[len - 1] = from_f32<T>(decode_value(cb, in[len / 2] & 0xF, amax));
      }
    } else {
      const uint8_t* in = p.codes + begin;
      if constexpr (sizeof(T) == 4) {
        decode_codes8(fmt, in, len, amax, reinterpret_cast<float*>(y + begin));
      } else {
        for (int64_t i = 0; i < len; ++i) y[begin + i] = from_f32<T>(decode_value(cb, in[i], amax));
      }
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
