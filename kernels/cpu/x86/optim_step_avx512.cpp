// The AVX-512 loops of the CPU step (optim_step_parts.h), 16 lanes at a time: a pipelined loop for
// fp32/bf16 parameters whose state is all 8-bit or all 4-bit codes, and a loop for dense state.
// The rest (fp16 parameters, a master-weight correction beside dense state, mixed state) takes the
// AVX2 file's per-block loop on 8 lanes: rare shapes, one per-block loop to keep. The loops compute the
// scalar loop's IEEE operations in its order (no contraction; vector sqrt and div are correctly
// rounded), so all write the same bits.
//
// Compiled with the AVX-512 flags (CMakeLists.txt) and run only where the CPU has AVX-512. So all
// here but the entry point has internal linkage: an inline function compiled for AVX-512 and shared
// with another object could be the copy the linker keeps for every caller (the test
// x86_objects_isolated holds this line).
#include "vec16.h"  // first: the rules of optim_rules.h see its overloads

#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <utility>

#include "../../common/compand.h"
#include "../../common/encode.h"
#include "../../common/optim_rules.h"
#include "../block_ops.h"
#include "../encode_avx512.h"
#include "../encode_linear4.h"
#include "../optim_step_parts.h"
#include "lanes16.h"

namespace lowbit {
namespace kernels {
namespace {

// ---- the pipelined loop -------------------------------------------------------------------------

// A block of 4-bit codes (two per byte, even element low) decoded to fp32 with the codebook held in
// a register: the 8-bit path's VBMI decode for 4-bit codes.
inline void decode4_block(__m512 cb16, const uint8_t* codes, int64_t len, float amax, float* out) {
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

// C8's decode (compand.h's pow8_decode, then times the block's absmax) on 16 lanes, in registers: a
// code c becomes the float (min(c, lim) - off), squared with its sign, times 1 / max^2; the
// unsigned format's lim 255 and off 0 change nothing, so one formula serves both. The same
// operations as the codebook's entries, so the same bits as the table decode.
struct Pow8Decode16 {
  __m512i lim;
  __m512 off, inv_sq;
  static Pow8Decode16 make(QuantFormat f) {
    const bool s = format_is_signed(f);
    return {_mm512_set1_epi32(s ? 254 : 255), _mm512_set1_ps(s ? 127.0f : 0.0f),
            _mm512_set1_ps(s ? kPow8SignedInvSq : kPow8UnsignedInvSq)};
  }
  __m512 operator()(__m128i bytes, __m512 amax) const {
    const __m512 c = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_min_epu32(_mm512_cvtepu8_epi32(bytes), lim)), off);
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(c, _mm512_abs_ps(c)), inv_sq), amax);
  }
};

// The common case specialized: parameter and gradient both fp32 or both bf16 (rounded to nearest or
// stochastically, or bf16 with a master-weight correction: CORR Int8 or Int16), NS state slots all
// quantized with BITS-bit codes (Q8 / FP8 / C8: 8, Q4: 4), over a run of consecutive blocks of one
// parameter. No branch on storage kinds; all in registers. POW8: every slot is C8, whose codes
// decode by arithmetic inside the loop (Pow8Decode16) instead of into the buffer first: C8's blocks
// are 64 elements, so a per-block decode call weighs four times what it does for Q8.
//
// Software-pipelined by one block: while the update of block b runs (bound by the divider and the
// multipliers), the codes of block b - 1 are encoded in the same loop (bound by the 8-bit encode's
// gathers, or the 4-bit encode's permutes), so the two kinds of work overlap instead of taking
// turns. A block's codes can only be encoded once its new absmax is known, after its whole update.
template <Rule R, int NS, ElemType PT, int BITS, SlotStorage CORR = SlotStorage::None, bool POW8 = false>
void steps_quant_avx512(const ParamTask& t, int64_t b0, int64_t b1, float grad_scale, float* buf,
                                      uint8_t* bad) {
  static_assert(PT == ElemType::F32 || PT == ElemType::BF16, "fp32 or bf16 parameters");
  static_assert(BITS == 8 || BITS == 4, "8-bit or 4-bit codes");
  static_assert(CORR == SlotStorage::None || (PT == ElemType::BF16 && (CORR == SlotStorage::Int8 || CORR == SlotStorage::Int16)),
                "bf16's correction");
  static_assert(!POW8 || BITS == 8, "C8 codes are 8-bit");
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
  using Corr = typename std::conditional<CORR == SlotStorage::Int16, int16_t, int8_t>::type;
  Corr* const corr = static_cast<Corr*>(t.slots[kCorrectionSlot].values);
  uint8_t* codes[NS];
  float* absmax[NS];
  const uint32_t* keys[NS];   // 8-bit: the packed key table and its flip
  __m512i key_flip[NS];
  __m512i tree[NS];           // 4-bit: the thresholds' search tree (keys), their rank search (floats),
  Rank4 rank4[NS];            // the codebook, the codes by rank
  __m512 cb16[NS];
  __m512i rank_codes[NS];
  bool linear4[NS];            // 4-bit: Linear4Unsigned, encoded by formula (encode16_linear4)
  Pow8Decode16 pow8[NS];      // POW8
  bool is_signed[NS];
  float* cur[NS];   // the block being updated: decoded state (but for POW8), then its new values
  float* prev[NS];  // the previous block's new values, encoded during this block's update
  for (int k = 0; k < NS; ++k) {
    const StateSlotRef& r = t.slots[k];
    codes[k] = r.codes;
    absmax[k] = r.absmax;
    keys[k] = r.tables->key_entries;
    key_flip[k] = _mm512_set1_epi32(static_cast<int>(r.tables->key_flip));
    if (BITS == 4) {
      tree[k] = tree4_keys(r.tables->eytzinger);
      rank4[k] = rank4_tables(r.tables->thresholds);
      cb16[k] = _mm512_loadu_ps(r.tables->codebook);
      rank_codes[k] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r.tables->sorted_codes)));
    }
    linear4[k] = BITS == 4 && r.tables->linear4;
    if (POW8) pow8[k] = Pow8Decode16::make(r.format);
    is_signed[k] = format_is_signed(r.format);
    cur[k] = buf + k * B;
    prev[k] = buf + (NS + k) * B;
  }
  const bool vbmi = BITS == 4 && decode_codes4_fast();  // 4-bit blocks decoded by byte permutes
  __m512 pre[NS], inv[NS];  // the previous block's normalizers
  bool finite[NS] = {};     // the previous block's new values are finite (its absmax is) ...
  bool unit[NS] = {};       // ... and its normalizer's pre is 1
  int64_t prev_begin = 0, prev_len = 0;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t begin = b * B;
    const int64_t len = std::min(B, t.numel - begin);
    prefetch_ahead(t, begin + kPrefetchBlocks * B, B);
    __m512 amax[NS];
    for (int k = 0; k < NS; ++k) {
      if (POW8) {
        amax[k] = _mm512_set1_ps(absmax[k][b]);
      } else if (BITS == 8) {
        decode_codes8(*t.slots[k].tables, codes[k] + begin, len, absmax[k][b], cur[k]);
      } else if (vbmi) {
        decode_codes4(*t.slots[k].tables, codes[k] + begin / 2, len, absmax[k][b], cur[k]);
      } else {
        decode4_block(cb16[k], codes[k] + begin / 2, len, absmax[k][b], cur[k]);
      }
    }
    // Per slot: the largest bit pattern as a signed integer (the largest positive value's, or 0:
    // every negative float is a negative integer), and the largest as unsigned (above 0x80000000
    // exactly when some lane held a negative value, -0.0 not one, and then the most negative
    // value's). The larger of the first and the second without its sign is the largest |x|.
    __m512i max_pos[NS], max_raw[NS];
    for (int k = 0; k < NS; ++k) max_pos[k] = max_raw[k] = _mm512_setzero_si512();
    // Whole blocks on both sides (all but a parameter's first and last block here): no masks.
    const bool whole = len == B && prev_len == B;
    const int64_t chunks = (std::max(len, prev_len) + 15) / 16;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t i = 16 * c;
      if (whole || i < len) {
        const __mmask16 m = whole ? __mmask16(0xFFFF) : lanes_below(len - i);
        __m512 pv;
        if constexpr (CORR == SlotStorage::Int8) {
          pv = master16_from8(reinterpret_cast<const uint16_t*>(param) + begin + i, corr + begin + i, m);
        } else if constexpr (CORR == SlotStorage::Int16) {
          pv = master16_from16(reinterpret_cast<const uint16_t*>(param) + begin + i, corr + begin + i, m);
        } else {
          pv = load16(param, PT, begin + i, m);
        }
        f32x16 p = (f32x16)pv;
        const __m512 g = _mm512_mul_ps(load16(grad, PT, begin + i, m), gmul);
        f32x16 st[kMomentSlots] = {};
        for (int k = 0; k < NS; ++k) {
          if (POW8) {
            st[k] = (f32x16)pow8[k](load16_epi8(codes[k] + begin + i, m), amax[k]);
          } else {
            st[k] = (f32x16)_mm512_loadu_ps(cur[k] + i);
          }
        }
        apply_rule<R>(h, (f32x16)g, p, st);
        for (int k = 0; k < NS; ++k) {
          const __m512i u = _mm512_castps_si512((__m512)st[k]);
          _mm512_storeu_ps(cur[k] + i, (__m512)st[k]);
          max_pos[k] = _mm512_mask_max_epi32(max_pos[k], m, max_pos[k], u);
          max_raw[k] = _mm512_mask_max_epu32(max_raw[k], m, max_raw[k], u);
        }
        if constexpr (CORR == SlotStorage::Int8) {
          master16_to8((__m512)p, reinterpret_cast<uint16_t*>(param) + begin + i, corr + begin + i, m);
        } else if constexpr (CORR == SlotStorage::Int16) {
          master16_to16((__m512)p, reinterpret_cast<uint16_t*>(param) + begin + i, corr + begin + i, m);
        } else if (PT == ElemType::F32) {
          _mm512_mask_storeu_ps(reinterpret_cast<float*>(param) + begin + i, m, (__m512)p);
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
          // x * 1 == x for finite x: one multiply saved where the block's pre is 1 (the rule).
          const __m512 n = unit[k] ? _mm512_mul_ps(x, inv[k]) : normalize16(x, pre[k], inv[k]);
          if (BITS == 8) {
            _mm_storeu_si128(reinterpret_cast<__m128i*>(codes[k] + prev_begin + i), encode16(keys[k], key_flip[k], n));
          } else {
            const __m128i c = linear4[k] ? encode16_linear4(n)
                              : finite[k]  ? encode16_rank4_finite(rank4[k], rank_codes[k], n)
                                           : encode16_tree4(tree[k], rank_codes[k], n);
            _mm_storel_epi64(reinterpret_cast<__m128i*>(codes[k] + (prev_begin + i) / 2), pack_nibbles(c));
          }
        }
      }
    }
    // Block b is updated: its absmax, then it becomes the block to encode.
    uint8_t flag = 0;
    for (int k = 0; k < NS; ++k) {
      const uint32_t raw = _mm512_reduce_max_epu32(max_raw[k]);
      const uint32_t negative = raw > 0x80000000u ? 1u : 0u;
      const uint32_t max_abs = std::max(static_cast<uint32_t>(_mm512_reduce_max_epi32(max_pos[k])), raw & 0x7FFFFFFFu);
      const float am = block_absmax_from_bits(max_abs, negative, is_signed[k]);
      absmax[k][b] = am;
      finite[k] = am >= 0.0f;
      flag |= finite[k] ? 0 : 1;
      const Normalizer nz = make_normalizer(am);
      unit[k] = finite[k] && nz.pre == 1.0f;
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
      encode_block8(keys[k], t.slots[k].tables->key_flip, nz, prev[k], prev_len, codes[k] + prev_begin);
    } else {
      encode_block4_packed(tree[k], rank_codes[k], nz, prev[k], prev_len, codes[k] + prev_begin / 2);
    }
  }
}

// ---- the dense loop ----------------------------------------------------------------------------

// Dense state (every slot fp32 or every slot bf16) for fp32 or bf16 parameters and gradients of the
// same type, bf16 rounded to nearest or stochastically: no codes, so no block structure to keep. The run of blocks is
// one stream of 16-lane chunks, a mask only on a parameter's last chunk, nothing decided per chunk;
// per block only the prefetch of the block kPrefetchBlocks ahead. Dense slots never flag a block.
template <Rule R, int NS, ElemType PT, SlotStorage ST>
void steps_dense_avx512(const ParamTask& t, int64_t b0, int64_t b1, float grad_scale, float*, uint8_t* bad) {
  static_assert(PT == ElemType::F32 || PT == ElemType::BF16, "fp32 or bf16 parameters");
  static_assert(ST == SlotStorage::F32 || ST == SlotStorage::BF16, "dense state");
  using Elem = typename std::conditional<PT == ElemType::F32, float, uint16_t>::type;
  using State = typename std::conditional<ST == SlotStorage::F32, float, uint16_t>::type;
  const int64_t B = t.block_size;
  const Hyper h = t.hyper;  // a local: stores through the arrays cannot alias it
  const __m512 scale = _mm512_set1_ps(grad_scale);
  const bool scaled = grad_scale != 1.0f;
  const bool stochastic = PT == ElemType::BF16 && t.stochastic_round;
  Elem* const param = static_cast<Elem*>(t.param);
  const Elem* const grad = static_cast<const Elem*>(t.grad);
  State* st[NS];
  for (int k = 0; k < NS; ++k) st[k] = static_cast<State*>(t.slots[k].values);
  const int64_t end = std::min(b1 * B, t.numel);
  for (int64_t b = b0; b < b1; ++b) {
    bad[b - b0] = 0;
    const int64_t begin = b * B;
    const int64_t stop = std::min(begin + B, end);
    prefetch_ahead(t, begin + kPrefetchBlocks * B, B);
    for (int64_t i = begin; i < stop; i += 16) {
      const __mmask16 m = lanes_below(stop - i);
      f32x16 p = (f32x16)load16(param, PT, i, m);
      __m512 graw = load16(grad, PT, i, m);
      if (scaled) graw = _mm512_mul_ps(graw, scale);
      f32x16 s[kMomentSlots] = {};
      for (int k = 0; k < NS; ++k)
        s[k] = ST == SlotStorage::F32 ? (f32x16)load16_ps(reinterpret_cast<const float*>(st[k]) + i, m)
                                      : (f32x16)load16(st[k], ElemType::BF16, i, m);
      apply_rule<R>(h, (f32x16)graw, p, s);
      for (int k = 0; k < NS; ++k) {
        if (ST == SlotStorage::F32) {
          _mm512_mask_storeu_ps(reinterpret_cast<float*>(st[k]) + i, m, (__m512)s[k]);
        } else {
          store16_bf16(reinterpret_cast<uint16_t*>(st[k]) + i, (__m512)s[k], m);
        }
      }
      if (PT == ElemType::F32) {
        _mm512_mask_storeu_ps(reinterpret_cast<float*>(param) + i, m, (__m512)p);
      } else if (stochastic) {
        store16_bf16_stochastic(reinterpret_cast<uint16_t*>(param) + i, (__m512)p, m, t.seed, static_cast<uint64_t>(t.offset + i));
      } else {
        store16_bf16(reinterpret_cast<uint16_t*>(param) + i, (__m512)p, m);
      }
    }
  }
}

// ---- the choice ---------------------------------------------------------------------------------

// The specialized loops for rule R with NS moment slots (pick_for_slots): quant for quantized state.
template <Rule R, int NS>
struct Loops {
  static RangeFn quant(const TaskShape& s) {
    constexpr ElemType F = ElemType::F32, H = ElemType::BF16;
    constexpr SlotStorage kInt8 = SlotStorage::Int8, kInt16 = SlotStorage::Int16, kNone = SlotStorage::None;
    // Quantized state: the pipelined loop; C8 in every slot decodes in registers.
    if (s.quant_bits == 4) {
      if (s.corr == kInt8) return &steps_quant_avx512<R, NS, H, 4, kInt8>;
      if (s.corr == kInt16) return &steps_quant_avx512<R, NS, H, 4, kInt16>;
      return s.f32 ? &steps_quant_avx512<R, NS, F, 4> : &steps_quant_avx512<R, NS, H, 4>;
    }
    if (s.quant_bits == 8) {
      if (s.corr == kInt8) return &steps_quant_avx512<R, NS, H, 8, kInt8>;
      if (s.corr == kInt16) return &steps_quant_avx512<R, NS, H, 8, kInt16>;
      if (s.pow8) {
        return s.f32 ? &steps_quant_avx512<R, NS, F, 8, kNone, true> : &steps_quant_avx512<R, NS, H, 8, kNone, true>;
      }
      return s.f32 ? &steps_quant_avx512<R, NS, F, 8> : &steps_quant_avx512<R, NS, H, 8>;
    }
    return nullptr;
  }
  template <ElemType PT, SlotStorage ST>
  static constexpr RangeFn dense = &steps_dense_avx512<R, NS, PT, ST>;
};

}  // namespace

RangeFn avx512_range_fn(Rule rule, const ParamTask& t) {
  return with_rule(rule, [&t](auto r) { return pick_specialized<Loops, decltype(r)::value>(t); });
}

}  // namespace kernels
}  // namespace lowbit
