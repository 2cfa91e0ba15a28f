// Fused optimizer step on the CPU. Unit of work = one block of one parameter: its values are read
// once, updated by the rule of kernels/common/optim_rules.h, quantized state re-encoded with a
// fresh absmax, and written once. Blocks are independent, so results do not depend on the thread
// count or on how parameters are grouped. Each thread runs one contiguous share of all blocks.
//
// The element loops compute the same IEEE operations (no contraction; vector sqrt and div are
// correctly rounded): with AVX-512, a pipelined loop for fp32/bf16 parameters whose state is all
// 8-bit or all 4-bit codes and a per-block loop for the rest, 16 lanes at a time; a scalar loop
// elsewhere (OptimStep::vector_path = false forces it, for tests).
#include "optim_step_cpu.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "../common/code_tables.h"
#include "../common/encode.h"
#include "../common/float_convert.h"
#include "../common/master_weight.h"
#include "../common/optim_rules.h"
#include "../common/stochastic_round.h"
#include "block_ops.h"
#include "cpu_features.h"
#include "encode_avx512.h"
#include "format_tables.h"

namespace lowbit {
namespace kernels {
namespace {

float load(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::F32: return static_cast<const float*>(p)[i];
    case ElemType::BF16: return to_f32(static_cast<const bf16_t*>(p)[i]);
    case ElemType::F16: return to_f32(static_cast<const f16_t*>(p)[i]);
  }
  return 0.0f;
}

void load_block(const void* p, ElemType t, int64_t begin, int64_t len, float* out) {
  for (int64_t i = 0; i < len; ++i) out[i] = load(p, t, begin + i);
}

// absmax from the scan of the block's new values v, then the codes. Returns 1 when the new values
// were not representable (Inf or NaN: the absmax carries encode.h's flag), else 0.
int store_quantized_slot(const StateSlotRef& s, int64_t block, int64_t begin, int64_t len, const float* v,
                         uint32_t max_bits, uint32_t negative) {
  const int64_t offset = format_bits(s.format) == 4 ? begin / 2 : begin;
  const float am = encode_scanned_block(*s.tables, format_is_signed(s.format), v, len, max_bits, negative,
                                        s.codes + offset);
  s.absmax[block] = am;
  return am >= 0.0f ? 0 : 1;
}

void decode_slot(const StateSlotRef& s, int64_t block, int64_t begin, int64_t len, float* out) {
  switch (s.storage) {
    case SlotStorage::None:
    case SlotStorage::Int16:  // a master-weight correction: with the parameter (master_weight.h)
    case SlotStorage::Int8: return;
    case SlotStorage::F32: load_block(s.values, ElemType::F32, begin, len, out); return;
    case SlotStorage::BF16: load_block(s.values, ElemType::BF16, begin, len, out); return;
    case SlotStorage::Quant: {
      const float* cb = s.tables->codebook;
      const float amax = s.absmax[block];
      if (format_bits(s.format) == 4) {
        const uint8_t* c = s.codes + begin / 2;
        decode4(cb, c, len & ~int64_t(1), amax, out);
        if (len % 2) out[len - 1] = decode_value(cb, c[len / 2] & 0xF, amax);
      } else {
        decode_codes8(*s.tables, s.codes + begin, len, amax, out);
      }
      return;
    }
  }
}

// Quantized slots: scan the block's new values (in v) and encode them; dense slots: store.
int encode_slot(const StateSlotRef& s, int64_t block, int64_t begin, int64_t len, float* v) {
  switch (s.storage) {
    case SlotStorage::None:
    case SlotStorage::Int16:  // a master-weight correction: with the parameter (master_weight.h)
    case SlotStorage::Int8: return 0;
    case SlotStorage::F32: std::copy(v, v + len, static_cast<float*>(s.values) + begin); return 0;
    case SlotStorage::BF16: {
      bf16_t* out = static_cast<bf16_t*>(s.values) + begin;
      for (int64_t i = 0; i < len; ++i) out[i] = from_f32<bf16_t>(v[i]);
      return 0;
    }
    case SlotStorage::Quant: {
      uint32_t max_bits = 0, neg = 0;
      scan_block(v, len, &max_bits, &neg);
      return store_quantized_slot(s, block, begin, len, v, max_bits, neg);
    }
  }
  return 0;
}

// The parameter's values, or with a correction slot its master values (master_weight.h).
void load_param_block(const ParamTask& t, int64_t begin, int64_t len, float* out) {
  const StateSlotRef& c = t.slots[kCorrectionSlot];
  const uint16_t* b = static_cast<const uint16_t*>(t.param) + begin;
  if (c.storage == SlotStorage::Int16) {
    const int16_t* k = static_cast<const int16_t*>(c.values) + begin;
    for (int64_t i = 0; i < len; ++i) out[i] = master_from16(b[i], k[i]);
  } else if (c.storage == SlotStorage::Int8) {
    const int8_t* k = static_cast<const int8_t*>(c.values) + begin;
    for (int64_t i = 0; i < len; ++i) out[i] = master_from8(b[i], k[i]);
  } else {
    load_block(t.param, t.param_type, begin, len, out);
  }
}

void store_param(const ParamTask& t, int64_t begin, int64_t len, const float* v) {
  const StateSlotRef& c = t.slots[kCorrectionSlot];
  if (is_correction(c.storage)) {
    uint16_t* b = static_cast<uint16_t*>(t.param) + begin;
    if (c.storage == SlotStorage::Int16) {
      int16_t* k = static_cast<int16_t*>(c.values) + begin;
      for (int64_t i = 0; i < len; ++i) master_to16(v[i], b + i, k + i);
    } else {
      int8_t* k = static_cast<int8_t*>(c.values) + begin;
      for (int64_t i = 0; i < len; ++i) master_to8(v[i], b + i, k + i);
    }
    return;
  }
  switch (t.param_type) {
    case ElemType::F32: std::copy(v, v + len, static_cast<float*>(t.param) + begin); return;
    case ElemType::BF16: {
      bf16_t* out = static_cast<bf16_t*>(t.param) + begin;
      if (t.stochastic_round) {
        for (int64_t i = 0; i < len; ++i) out[i] = bf16_stochastic(v[i], t.seed, static_cast<uint64_t>(t.offset + begin + i));
      } else {
        for (int64_t i = 0; i < len; ++i) out[i] = from_f32<bf16_t>(v[i]);
      }
      return;
    }
    case ElemType::F16: {
      f16_t* out = static_cast<f16_t*>(t.param) + begin;
      for (int64_t i = 0; i < len; ++i) out[i] = from_f32<f16_t>(v[i]);
      return;
    }
  }
}

// ---- the scalar loop ----------------------------------------------------------------------------

template <Rule R>
void update_elements(const Hyper& h, int64_t len, float* p, const float* g, float* s0, float* s1, float* s2) {
  for (int64_t i = 0; i < len; ++i) {
    float st[kMomentSlots] = {s0[i], s1[i], s2[i]};
    apply_rule<R>(h, g[i], p[i], st);
    s0[i] = st[0];
    s1[i] = st[1];
    s2[i] = st[2];
  }
}

template <Rule R>
int step_block_scalar(const ParamTask& t, int64_t block, float grad_scale, float* buf) {
  const int64_t B = t.block_size;
  const int64_t begin = block * B;
  const int64_t len = std::min(B, t.numel - begin);
  float* p = buf;
  float* g = buf + B;
  float* s[kMomentSlots] = {buf + 2 * B, buf + 3 * B, buf + 4 * B};
  load_param_block(t, begin, len, p);
  load_block(t.grad, t.grad_type, begin, len, g);
  if (grad_scale != 1.0f)
    for (int64_t i = 0; i < len; ++i) g[i] = g[i] * grad_scale;
  for (int k = 0; k < t.num_slots; ++k) decode_slot(t.slots[k], block, begin, len, s[k]);
  update_elements<R>(t.hyper, len, p, g, s[0], s[1], s[2]);
  int bad = 0;
  for (int k = 0; k < t.num_slots; ++k) bad |= encode_slot(t.slots[k], block, begin, len, s[k]);
  store_param(t, begin, len, p);
  return bad;
}

// ---- the AVX-512 loop ---------------------------------------------------------------------------
#if defined(__x86_64__)
#define LOWBIT_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

// The lanes of a 16-lane chunk that lie before the end (remaining elements left).
LOWBIT_AVX512 inline __mmask16 lanes_below(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << remaining) - 1u);
}

LOWBIT_AVX512 inline __m512 load16(const void* p, ElemType t, int64_t i, __mmask16 m) {
  switch (t) {
    case ElemType::F32: return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
    case ElemType::BF16: {
      const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case ElemType::F16:
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i));
  }
  return _mm512_setzero_ps();
}

// from_f32<bf16_t> on 16 lanes: round to nearest even on the bits, NaN to 0x7FC0.
LOWBIT_AVX512 inline void store16_bf16(uint16_t* out, __m512 x, __mmask16 m) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  _mm256_mask_storeu_epi16(out, m, _mm512_cvtepi32_epi16(r));
}

// sr_noise of stochastic_round.h on 16 lanes: elements index0 .. index0 + 15 (the low halves
// carry into the high ones where they wrap).
LOWBIT_AVX512 inline __m512i sr_noise16(uint64_t seed, uint64_t index0) {
  const __m512i lo0 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(index0)));
  const __m512i lo = _mm512_add_epi32(lo0, _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
  const __mmask16 carry = _mm512_cmplt_epu32_mask(lo, lo0);
  const __m512i hi0 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(index0 >> 32)));
  const __m512i hi = _mm512_mask_add_epi32(hi0, carry, hi0, _mm512_set1_epi32(1));
  const __m512i s_lo = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(seed)));
  const __m512i s_hi = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(seed >> 32)));
  __m512i x = _mm512_add_epi32(_mm512_xor_si512(lo, s_lo),
                               _mm512_mullo_epi32(_mm512_xor_si512(hi, s_hi), _mm512_set1_epi32(static_cast<int>(0x9E3779B9u))));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7FEB352D));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846CA68Bu)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  return _mm512_srli_epi32(x, 16);
}

// bf16_stochastic of stochastic_round.h on 16 lanes: elements index0 .. index0 + 15.
LOWBIT_AVX512 inline void store16_bf16_stochastic(uint16_t* out, __m512 x, __mmask16 m, uint64_t seed,
                                                  uint64_t index0) {
  const __m512i noise = sr_noise16(seed, index0);
  const __m512i u = _mm512_castps_si512(x);
  const __m512i exp = _mm512_set1_epi32(0x7F800000);
  const __m512i r = _mm512_add_epi32(u, noise);
  // Past the largest finite value: clamp to it, keeping the sign.
  __m512i b = _mm512_srli_epi32(r, 16);
  const __mmask16 over = _mm512_cmpeq_epi32_mask(_mm512_and_si512(r, exp), exp);
  b = _mm512_mask_mov_epi32(b, over, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x7F7F)));
  // Inf and NaN round to nearest, as from_f32 does.
  const __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exp), exp);
  if (special) {
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i nearest = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), exp);
    nearest = _mm512_mask_mov_epi32(nearest, nan, _mm512_set1_epi32(0x7FC0));
    b = _mm512_mask_mov_epi32(b, special, nearest);
  }
  _mm256_mask_storeu_epi16(out, m, _mm512_cvtepi32_epi16(b));
}

// One state slot as the loop sees it: where it lives and, for quantized slots, the block's
// decode constants and the running scan of the new values.
struct VecSlot {
  SlotStorage storage;
  float* values;          // F32
  uint16_t* bf16;         // BF16
  const uint8_t* codes;   // Quant: the block's first code byte
  __m512 cb16;            // Quant: 4-bit codebook, in a register
  __m512 amax;
  bool four_bit;
  float* out;             // Quant: decoded values (8-bit), then the new values, encoded after the loop
  __m512i max_bits;
  __mmask16 negative;
};

LOWBIT_AVX512 inline __m512 decode16(const VecSlot& s, int64_t i, __mmask16 m) {
  if (s.four_bit) {
    // Element 2j is the low nibble of byte j: unpack (low, high) nibbles to 16 bytes in order.
    const __mmask16 bytes = static_cast<__mmask16>((1u << ((__builtin_popcount(m) + 1) / 2)) - 1u);
    const __m128i b = _mm_maskz_loadu_epi8(bytes, s.codes + i / 2);
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
    return _mm512_mul_ps(_mm512_permutexvar_ps(idx, s.cb16), s.amax);
  }
  return _mm512_maskz_loadu_ps(m, s.out + i);  // 8-bit: decoded before the loop
}

// Software prefetch of a block further along each stream (param, grad, state): with every core
// streaming several arrays the hardware prefetchers fall behind.

inline void prefetch_ahead(const ParamTask& t, int64_t begin, int64_t len) {
  if (begin >= t.numel) return;
  len = std::min(len, t.numel - begin);
  const int64_t pe = t.param_type == ElemType::F32 ? 4 : 2, ge = t.grad_type == ElemType::F32 ? 4 : 2;
  prefetch_range(static_cast<const char*>(t.param) + begin * pe, len * pe);
  prefetch_range(static_cast<const char*>(t.grad) + begin * ge, len * ge);
  for (int k = 0; k < t.num_slots; ++k) {
    const StateSlotRef& s = t.slots[k];
    if (s.storage == SlotStorage::Quant) {
      const bool four = format_bits(s.format) == 4;
      prefetch_range(s.codes + (four ? begin / 2 : begin), four ? (len + 1) / 2 : len);
    } else if (s.storage != SlotStorage::None) {
      const int64_t se = s.storage == SlotStorage::F32 ? 4 : 2;
      prefetch_range(static_cast<const char*>(s.values) + begin * se, len * se);
    }
  }
}

template <Rule R>
LOWBIT_AVX512 int step_block_avx512(const ParamTask& t, int64_t block, float grad_scale, float* buf) {
  const int64_t B = t.block_size;
  const int64_t begin = block * B;
  const int64_t len = std::min(B, t.numel - begin);
  // Params stored through the scalar conversions (f16, stochastic bf16) go via buf.
  const bool param_direct =
      t.param_type == ElemType::F32 || (t.param_type == ElemType::BF16 && !t.stochastic_round);
  float* pbuf = buf + 3 * B;
  VecSlot slot[kMomentSlots];
  for (int k = 0; k < t.num_slots; ++k) {
    const StateSlotRef& r = t.slots[k];
    VecSlot& v = slot[k];
    v.storage = r.storage;
    v.values = static_cast<float*>(r.values);
    v.bf16 = static_cast<uint16_t*>(r.values);
    v.out = buf + k * B;
    v.max_bits = _mm512_setzero_si512();
    v.negative = 0;
    if (r.storage == SlotStorage::Quant) {
      v.four_bit = format_bits(r.format) == 4;
      v.cb16 = v.four_bit ? _mm512_loadu_ps(r.tables->codebook) : _mm512_setzero_ps();
      v.amax = _mm512_set1_ps(r.absmax[block]);
      v.codes = r.codes + (v.four_bit ? begin / 2 : begin);
      // 8-bit codes are decoded for the whole block first (64 at a time, no gathers); the loop
      // reads them back from L1 and writes the new values over them.
      if (!v.four_bit) decode_codes8(*r.tables, v.codes, len, r.absmax[block], v.out);
    }
  }
  prefetch_ahead(t, begin + kPrefetchBlocks * B, B);
  const __m512 scale = _mm512_set1_ps(grad_scale);
  const Hyper h = t.hyper;  // a local: stores through the buffers cannot alias it
  for (int64_t i = 0; i < len; i += 16) {
    const __mmask16 m = lanes_below(len - i);
    f32x16 p = (f32x16)load16(t.param, t.param_type, begin + i, m);
    __m512 graw = load16(t.grad, t.grad_type, begin + i, m);
    if (grad_scale != 1.0f) graw = _mm512_mul_ps(graw, scale);
    const f32x16 g = (f32x16)graw;
    f32x16 s[kMomentSlots] = {};
    for (int k = 0; k < t.num_slots; ++k) {
      const VecSlot& v = slot[k];
      switch (v.storage) {
        case SlotStorage::None:
        case SlotStorage::Int16:  // a master-weight correction: with the parameter (master_weight.h)
        case SlotStorage::Int8: break;
        case SlotStorage::F32: s[k] = (f32x16)_mm512_maskz_loadu_ps(m, v.values + begin + i); break;
        case SlotStorage::BF16: s[k] = (f32x16)load16(v.bf16, ElemType::BF16, begin + i, m); break;
        case SlotStorage::Quant: s[k] = (f32x16)decode16(v, i, m); break;
      }
    }
    apply_rule<R>(h, g, p, s);
    for (int k = 0; k < t.num_slots; ++k) {
      VecSlot& v = slot[k];
      switch (v.storage) {
        case SlotStorage::None:
        case SlotStorage::Int16:  // a master-weight correction: with the parameter (master_weight.h)
        case SlotStorage::Int8: break;
        case SlotStorage::F32: _mm512_mask_storeu_ps(v.values + begin + i, m, (__m512)s[k]); break;
        case SlotStorage::BF16: store16_bf16(v.bf16 + begin + i, (__m512)s[k], m); break;
        case SlotStorage::Quant:
          _mm512_storeu_ps(v.out + i, (__m512)s[k]);
          scan16((__m512)s[k], m, v.max_bits, v.negative);
          break;
      }
    }
    if (t.param_type == ElemType::F32) {
      _mm512_mask_storeu_ps(static_cast<float*>(t.param) + begin + i, m, (__m512)p);
    } else if (param_direct) {
      store16_bf16(static_cast<uint16_t*>(t.param) + begin + i, (__m512)p, m);
    } else {
      _mm512_storeu_ps(pbuf + i, (__m512)p);
    }
  }
  int bad = 0;
  for (int k = 0; k < t.num_slots; ++k) {
    const VecSlot& v = slot[k];
    if (v.storage != SlotStorage::Quant) continue;
    const uint32_t max_bits = _mm512_reduce_max_epu32(v.max_bits);
    bad |= store_quantized_slot(t.slots[k], block, begin, len, v.out, max_bits, v.negative != 0);
  }
  if (!param_direct) store_param(t, begin, len, pbuf);
  return bad;
}

// A block of 4-bit codes (two per byte, even element low) decoded to fp32 with the codebook held in
// a register: the 8-bit path's VBMI decode for 4-bit codes.
LOWBIT_AVX512 inline void decode4_block(__m512 cb16, const uint8_t* codes, int64_t len, float amax, float* out) {
  const __m512 a = _mm512_set1_ps(amax);
  for (int64_t i = 0; i < len; i += 16) {
    const int64_t n = std::min<int64_t>(16, len - i);
    const __m128i b = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << ((n + 1) / 2)) - 1u), codes + i / 2);
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_permutexvar_ps(idx, cb16), a));
  }
}

// The common case specialized: parameter and gradient both fp32 or both bf16 (rounded to nearest or
// stochastically), NS state slots all quantized with BITS-bit codes (Q8 / FP8: 8, Q4: 4), over a
// run of consecutive blocks of one parameter. No branch on storage kinds; all in registers.
//
// Software-pipelined by one block: while the update of block b runs (bound by the divider and the
// multipliers), the codes of block b - 1 are encoded in the same loop (bound by the 8-bit encode's
// gathers, or the 4-bit encode's permutes), so the two kinds of work overlap instead of taking
// turns. A block's codes can only be encoded once its new absmax is known, after its whole update.
template <Rule R, int NS, ElemType PT, int BITS>
LOWBIT_AVX512 void steps_quant_avx512(const ParamTask& t, int64_t b0, int64_t b1, float grad_scale, float* buf,
                                      uint8_t* bad) {
  static_assert(PT == ElemType::F32 || PT == ElemType::BF16, "fp32 or bf16 parameters");
  static_assert(BITS == 8 || BITS == 4, "8-bit or 4-bit codes");
  using Elem = typename std::conditional<PT == ElemType::F32, float, uint16_t>::type;
  const int64_t B = t.block_size;
  // A local copy (stores through the buffers cannot alias it) with two flags made constant: the
  // gradient's sign flip (maximize) joins the clipping factor in one multiply (-(g * s) == g * -s
  // and g * 1 == g exactly), and Adam's amsgrad is what its slot count says.
  Hyper h = t.hyper;
  const __m512 gmul = _mm512_set1_ps(h.maximize ? -grad_scale : grad_scale);
  h.maximize = false;
  if (R == Rule::Adam || R == Rule::AdamW) h.amsgrad = NS == 3;
  const bool stochastic = PT == ElemType::BF16 && t.stochastic_round;
  Elem* const param = static_cast<Elem*>(t.param);
  const Elem* const grad = static_cast<const Elem*>(t.grad);
  uint8_t* codes[NS];
  float* absmax[NS];
  const uint32_t* keys[NS];   // 8-bit: the packed key table
  __m512 tree[NS];            // 4-bit: the thresholds' search tree, the codebook, the codes by rank
  __m512 cb16[NS];
  __m512i rank_codes[NS];
  bool is_signed[NS];
  float* cur[NS];   // the block being updated: decoded state, then its new values
  float* prev[NS];  // the previous block's new values, encoded during this block's update
  for (int k = 0; k < NS; ++k) {
    const StateSlotRef& r = t.slots[k];
    codes[k] = r.codes;
    absmax[k] = r.absmax;
    keys[k] = r.tables->key_entries;
    if (BITS == 4) {
      tree[k] = _mm512_loadu_ps(r.tables->eytzinger);
      cb16[k] = _mm512_loadu_ps(r.tables->codebook);
      rank_codes[k] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r.tables->sorted_codes)));
    }
    is_signed[k] = format_is_signed(r.format);
    cur[k] = buf + k * B;
    prev[k] = buf + (NS + k) * B;
  }
  __m512 pre[NS], inv[NS];  // the previous block's normalizers
  int64_t prev_begin = 0, prev_len = 0;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t begin = b * B;
    const int64_t len = std::min(B, t.numel - begin);
    for (int k = 0; k < NS; ++k) {
      if (BITS == 8) {
        decode_codes8(*t.slots[k].tables, codes[k] + begin, len, absmax[k][b], cur[k]);
      } else {
        decode4_block(cb16[k], codes[k] + begin / 2, len, absmax[k][b], cur[k]);
      }
    }
    prefetch_ahead(t, begin + kPrefetchBlocks * B, B);
    // Per slot: the largest |x| bit pattern, and the largest raw bit pattern (above 0x80000000
    // exactly when some lane held a negative value; -0.0 is not one).
    __m512i max_abs[NS], max_raw[NS];
    for (int k = 0; k < NS; ++k) max_abs[k] = max_raw[k] = _mm512_setzero_si512();
    // Whole blocks on both sides (all but a parameter's first and last block here): no masks.
    const bool whole = len == B && prev_len == B;
    const int64_t chunks = (std::max(len, prev_len) + 15) / 16;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t i = 16 * c;
      if (whole || i < len) {
        const __mmask16 m = whole ? __mmask16(0xFFFF) : lanes_below(len - i);
        f32x16 p = (f32x16)load16(param, PT, begin + i, m);
        const __m512 g = _mm512_mul_ps(load16(grad, PT, begin + i, m), gmul);
        f32x16 st[kMomentSlots] = {};
        for (int k = 0; k < NS; ++k) st[k] = (f32x16)_mm512_loadu_ps(cur[k] + i);
        apply_rule<R>(h, (f32x16)g, p, st);
        for (int k = 0; k < NS; ++k) {
          const __m512i u = _mm512_castps_si512((__m512)st[k]);
          _mm512_storeu_ps(cur[k] + i, (__m512)st[k]);
          max_abs[k] = _mm512_mask_max_epu32(max_abs[k], m, max_abs[k], _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)));
          max_raw[k] = _mm512_mask_max_epu32(max_raw[k], m, max_raw[k], u);
        }
        if (PT == ElemType::F32) {
          _mm512_mask_storeu_ps(param + begin + i, m, (__m512)p);
        } else {
          uint16_t* out = reinterpret_cast<uint16_t*>(param) + begin + i;
          if (stochastic) {
            store16_bf16_stochastic(out, (__m512)p, m, t.seed, static_cast<uint64_t>(t.offset + begin + i));
          } else {
            store16_bf16(out, (__m512)p, m);
          }
        }
      }
      // The previous block is never a parameter's short last block (that one is encoded after
      // the loop), so it holds B elements, whole chunks of 16.
      if (whole || i < prev_len) {
        for (int k = 0; k < NS; ++k) {
          const __m512 x = _mm512_loadu_ps(prev[k] + i);
          if (BITS == 8) {
            _mm_storeu_si128(reinterpret_cast<__m128i*>(codes[k] + prev_begin + i), encode16(keys[k], x, pre[k], inv[k]));
          } else {
            _mm_storel_epi64(reinterpret_cast<__m128i*>(codes[k] + (prev_begin + i) / 2),
                             pack_nibbles(encode16_tree4(tree[k], rank_codes[k], x, pre[k], inv[k])));
          }
        }
      }
    }
    // Block b is updated: its absmax, then it becomes the block to encode.
    uint8_t flag = 0;
    for (int k = 0; k < NS; ++k) {
      const uint32_t negative = _mm512_reduce_max_epu32(max_raw[k]) > 0x80000000u ? 1u : 0u;
      const float am = block_absmax_from_bits(_mm512_reduce_max_epu32(max_abs[k]), negative, is_signed[k]);
      absmax[k][b] = am;
      flag |= am >= 0.0f ? 0 : 1;
      const Normalizer nz = make_normalizer(am);
      pre[k] = _mm512_set1_ps(nz.pre);
      inv[k] = _mm512_set1_ps(nz.inv);
      std::swap(cur[k], prev[k]);
    }
    bad[b - b0] = flag;
    prev_begin = begin;
    prev_len = len;
  }
  if (prev_len == 0) return;
  for (int k = 0; k < NS; ++k) {
    const Normalizer nz{_mm512_cvtss_f32(pre[k]), _mm512_cvtss_f32(inv[k])};
    if (BITS == 8) {
      encode_block8(keys[k], nz, prev[k], prev_len, codes[k] + prev_begin);
    } else {
      encode_block4_packed(tree[k], rank_codes[k], nz, prev[k], prev_len, codes[k] + prev_begin / 2);
    }
  }
}

#endif

// Returns 1 when a quantized slot of the block became non-finite.
using BlockFn = int (*)(const ParamTask&, int64_t, float, float*);
// Blocks [b0, b1) of one parameter; bad[b - b0] = 1 where a quantized slot became non-finite.
using RangeFn = void (*)(const ParamTask&, int64_t, int64_t, float, float*, uint8_t*);

template <BlockFn F>
void each_block(const ParamTask& t, int64_t b0, int64_t b1, float grad_scale, float* buf, uint8_t* bad) {
  for (int64_t b = b0; b < b1; ++b) bad[b - b0] = static_cast<uint8_t>(F(t, b, grad_scale, buf));
}

// A parameter with a master-weight correction takes the scalar loop (its vector loops are not
// written yet).
bool has_correction(const ParamTask& t) { return is_correction(t.slots[kCorrectionSlot].storage); }

template <Rule R>
RangeFn range_fn(const ParamTask& t, bool vector_path) {
#if defined(__x86_64__)
  if (vector_path && cpu_has_avx512() && !has_correction(t)) {
    const bool f32 = t.param_type == ElemType::F32 && t.grad_type == ElemType::F32;
    const bool bf16 = t.param_type == ElemType::BF16 && t.grad_type == ElemType::BF16;
    // All slots quantized with one code width: the pipelined loop.
    const int bits = t.num_slots >= 1 && t.slots[0].storage == SlotStorage::Quant ? format_bits(t.slots[0].format) : 0;
    bool uniform = (f32 || bf16) && bits != 0;
    for (int k = 0; k < t.num_slots; ++k)
      uniform &= t.slots[k].storage == SlotStorage::Quant && format_bits(t.slots[k].format) == bits;
    if (uniform) {
      const bool four = bits == 4;
      switch (t.num_slots * 4 + (bf16 ? 2 : 0) + (four ? 1 : 0)) {
        case 4: return &steps_quant_avx512<R, 1, ElemType::F32, 8>;
        case 5: return &steps_quant_avx512<R, 1, ElemType::F32, 4>;
        case 6: return &steps_quant_avx512<R, 1, ElemType::BF16, 8>;
        case 7: return &steps_quant_avx512<R, 1, ElemType::BF16, 4>;
        case 8: return &steps_quant_avx512<R, 2, ElemType::F32, 8>;
        case 9: return &steps_quant_avx512<R, 2, ElemType::F32, 4>;
        case 10: return &steps_quant_avx512<R, 2, ElemType::BF16, 8>;
        case 11: return &steps_quant_avx512<R, 2, ElemType::BF16, 4>;
        case 12: return &steps_quant_avx512<R, 3, ElemType::F32, 8>;
        case 13: return &steps_quant_avx512<R, 3, ElemType::F32, 4>;
        case 14: return &steps_quant_avx512<R, 3, ElemType::BF16, 8>;
        case 15: return &steps_quant_avx512<R, 3, ElemType::BF16, 4>;
      }
    }
    return &each_block<&step_block_avx512<R>>;
  }
#endif
  return &each_block<&step_block_scalar<R>>;
}

RangeFn pick_range_fn(Rule rule, const ParamTask& t, bool vector_path) {
  switch (rule) {
    case Rule::Adam: return range_fn<Rule::Adam>(t, vector_path);
    case Rule::AdamW: return range_fn<Rule::AdamW>(t, vector_path);
    case Rule::SGD: return range_fn<Rule::SGD>(t, vector_path);
    case Rule::Lion: return range_fn<Rule::Lion>(t, vector_path);
    case Rule::RMSprop: return range_fn<Rule::RMSprop>(t, vector_path);
    case Rule::Adagrad: return range_fn<Rule::Adagrad>(t, vector_path);
    case Rule::AdEMAMix: return range_fn<Rule::AdEMAMix>(t, vector_path);
    case Rule::LAMB: return range_fn<Rule::LAMB>(t, vector_path);
  }
  return nullptr;
}

// LAMB's first pass over a block: sums of p^2 and r^2 in double, state untouched. Element i of the
// block goes to partial sum i mod 16 (in element order); a block's sum is partials 0..15 added in
// order. Both loops and the ATen reference add in exactly this order.
constexpr int kLambLanes = 16;

void lamb_norms_block(const ParamTask& t, int64_t block, float grad_scale, float* buf, double* sums) {
  const int64_t B = t.block_size;
  const int64_t begin = block * B;
  const int64_t len = std::min(B, t.numel - begin);
  float* p = buf;
  float* g = buf + B;
  float* s[2] = {buf + 2 * B, buf + 3 * B};
  load_param_block(t, begin, len, p);
  load_block(t.grad, t.grad_type, begin, len, g);
  for (int k = 0; k < 2; ++k) decode_slot(t.slots[k], block, begin, len, s[k]);
  double pp[kLambLanes] = {}, rr[kLambLanes] = {};
  for (int64_t i = 0; i < len; ++i) {
    float gi = grad_scale != 1.0f ? g[i] * grad_scale : g[i];
    if (t.hyper.maximize) gi = -gi;
    const float st[2] = {s[0][i], s[1][i]};
    float m, v;
    const float r = lamb_direction(t.hyper, gi, p[i], st, &m, &v);
    pp[i % kLambLanes] += static_cast<double>(p[i]) * p[i];
    rr[i % kLambLanes] += static_cast<double>(r) * r;
  }
  sums[0] = sums[1] = 0.0;
  for (int j = 0; j < kLambLanes; ++j) {
    sums[0] += pp[j];
    sums[1] += rr[j];
  }
}

#if defined(__x86_64__)
// The same on 16 lanes: lane j of the two double registers per sum is partial sum j. Lanes past
// the block's end hold p = g = state = 0 and r is masked to 0 (its 0 / eps is NaN with eps 0), so
// they add +0.0 (a no-op on these sums).
LOWBIT_AVX512 void lamb_norms_block_avx512(const ParamTask& t, int64_t block, float grad_scale, float* buf,
                                           double* sums) {
  const int64_t B = t.block_size;
  const int64_t begin = block * B;
  const int64_t len = std::min(B, t.numel - begin);
  float* s[2] = {buf, buf + B};
  for (int k = 0; k < 2; ++k) decode_slot(t.slots[k], block, begin, len, s[k]);
  const Hyper h = t.hyper;
  const __m512 scale = _mm512_set1_ps(grad_scale);
  __m512d pp_lo = _mm512_setzero_pd(), pp_hi = pp_lo, rr_lo = pp_lo, rr_hi = pp_lo;
  for (int64_t i = 0; i < len; i += 16) {
    const __mmask16 m = lanes_below(len - i);
    const __m512 p = load16(t.param, t.param_type, begin + i, m);
    __m512 g = load16(t.grad, t.grad_type, begin + i, m);
    if (grad_scale != 1.0f) g = _mm512_mul_ps(g, scale);
    f32x16 gv = (f32x16)g;
    if (h.maximize) gv = -gv;
    const f32x16 st[2] = {(f32x16)_mm512_maskz_loadu_ps(m, s[0] + i), (f32x16)_mm512_maskz_loadu_ps(m, s[1] + i)};
    f32x16 mn, vn;
    const __m512 r = _mm512_maskz_mov_ps(m, (__m512)lamb_direction(h, gv, (f32x16)p, st, &mn, &vn));
    const __m512d p_lo = _mm512_cvtps_pd(_mm512_castps512_ps256(p));
    const __m512d p_hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1)));
    const __m512d r_lo = _mm512_cvtps_pd(_mm512_castps512_ps256(r));
    const __m512d r_hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(r), 1)));
    pp_lo = _mm512_add_pd(pp_lo, _mm512_mul_pd(p_lo, p_lo));
    pp_hi = _mm512_add_pd(pp_hi, _mm512_mul_pd(p_hi, p_hi));
    rr_lo = _mm512_add_pd(rr_lo, _mm512_mul_pd(r_lo, r_lo));
    rr_hi = _mm512_add_pd(rr_hi, _mm512_mul_pd(r_hi, r_hi));
  }
  alignas(64) double pp[kLambLanes], rr[kLambLanes];
  _mm512_store_pd(pp, pp_lo);
  _mm512_store_pd(pp + 8, pp_hi);
  _mm512_store_pd(rr, rr_lo);
  _mm512_store_pd(rr + 8, rr_hi);
  sums[0] = sums[1] = 0.0;
  for (int j = 0; j < kLambLanes; ++j) {
    sums[0] += pp[j];
    sums[1] += rr[j];
  }
}
#endif

}  // namespace

namespace {

// What both passes need: (task, block) pairs flattened so one parallel loop covers every block of
// every parameter, and a copy of the tasks with each quantized slot's tables resolved once.
struct StepPlan {
  std::vector<int64_t> first_item;
  int64_t items = 0;
  int64_t max_block = 1;
  FormatView views[kNumQuantFormats];
  std::vector<ParamTask> tasks;

  explicit StepPlan(const OptimStep& step) : first_item(step.num_tasks + 1, 0), tasks(step.tasks, step.tasks + step.num_tasks) {
    for (int64_t t = 0; t < step.num_tasks; ++t) {
      first_item[t + 1] = first_item[t] + num_blocks(tasks[t].numel, tasks[t].block_size);
      max_block = std::max(max_block, tasks[t].block_size);
    }
    items = first_item[step.num_tasks];
    if (items == 0) return;
    for (int f = 0; f < kNumQuantFormats; ++f) views[f] = format_tables(static_cast<QuantFormat>(f));
    for (auto& t : tasks)
      for (int k = 0; k < t.num_slots; ++k) t.slots[k].tables = &views[static_cast<int>(t.slots[k].format)];
  }
  StepPlan(const StepPlan&) = delete;
  StepPlan& operator=(const StepPlan&) = delete;

  int64_t task_of(int64_t item) const {
    return std::upper_bound(first_item.begin(), first_item.end(), item) - first_item.begin() - 1;
  }
};

// LAMB's pass 1: per parameter, the block sums added in LAMB's order (lamb_add_block_sums:
// independent of threads).
void lamb_norms(const StepPlan& plan, const OptimStep& step, double* out) {
  std::vector<double> sums(2 * plan.items);
  const bool vector = step.vector_path && cpu_has_avx512();
#pragma omp parallel
  {
    std::vector<float> buf(4 * plan.max_block, 0.0f);
#pragma omp for schedule(static)
    for (int64_t item = 0; item < plan.items; ++item) {
      const int64_t t = plan.task_of(item);
      const int64_t block = item - plan.first_item[t];
#if defined(__x86_64__)
      if (vector && !has_correction(plan.tasks[t])) {
        lamb_norms_block_avx512(plan.tasks[t], block, step.grad_scale, buf.data(), &sums[2 * item]);
        continue;
      }
#endif
      lamb_norms_block(plan.tasks[t], block, step.grad_scale, buf.data(), &sums[2 * item]);
    }
  }
  (void)vector;
  for (int64_t t = 0; t < step.num_tasks; ++t) {
    lamb_add_block_sum_pairs(&sums[2 * plan.first_item[t]], plan.first_item[t + 1] - plan.first_item[t], &out[2 * t]);
  }
}

}  // namespace

void lamb_norms_cpu(const OptimStep& step, double* out) {
  const StepPlan plan(step);
  std::fill(out, out + 2 * step.num_tasks, 0.0);
  if (plan.items > 0) lamb_norms(plan, step, out);
}

void optim_step_cpu(const OptimStep& step) {
  StepPlan plan(step);
  if (step.nonfinite_blocks) std::fill(step.nonfinite_blocks, step.nonfinite_blocks + step.num_tasks, 0);
  if (plan.items == 0) return;
  if (step.rule == Rule::LAMB && !step.trust_given) {
    // Pass 1 gives each parameter's trust ratio; pass 2 below is the ordinary fused update.
    std::vector<double> norms(2 * step.num_tasks);
    lamb_norms(plan, step, norms.data());
    for (int64_t t = 0; t < step.num_tasks; ++t) plan.tasks[t].hyper.trust = lamb_trust(norms[2 * t], norms[2 * t + 1]);
  }
  std::vector<RangeFn> fns(plan.tasks.size());
  for (size_t t = 0; t < plan.tasks.size(); ++t) fns[t] = pick_range_fn(step.rule, plan.tasks[t], step.vector_path);
  std::vector<uint8_t> bad(plan.items, 0);
#pragma omp parallel
  {
    // Each thread takes one contiguous share of the blocks and runs it parameter by parameter
    // (the pipelined loop carries one block into the next). Buffers: p, g and three state slots
    // for the per-block loops, two blocks of three slots for the pipelined one; zeroed so unused
    // slots hold defined values.
    std::vector<float> buf(6 * plan.max_block, 0.0f);
    const int64_t nt = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t lo = plan.items * me / nt, hi = plan.items * (me + 1) / nt;
    for (int64_t item = lo; item < hi;) {
      const int64_t t = plan.task_of(item);
      const int64_t end = std::min(hi, plan.first_item[t + 1]);
      fns[t](plan.tasks[t], item - plan.first_item[t], end - plan.first_item[t], step.grad_scale, buf.data(),
             &bad[item]);
      item = end;
    }
  }
  if (step.nonfinite_blocks)
    for (int64_t t = 0; t < step.num_tasks; ++t) {
      int64_t count = 0;
      for (int64_t item = plan.first_item[t]; item < plan.first_item[t + 1]; ++item) count += bad[item];
      step.nonfinite_blocks[t] = count;
    }
}

}  // namespace kernels
}  // namespace lowbit
