// The AVX2 loops of the CPU step (optim_step_parts.h), 8 lanes at a time, for x86-64 CPUs without
// AVX-512 (AMD Zen 1-3, Intel client cores): the AVX-512 file's two loops on half the lanes, a
// pipelined loop for fp32/bf16 parameters whose state is all 8-bit or all 4-bit codes, and a
// per-block loop for the rest (any parameter type, any state, master-weight corrections). They
// compute the scalar loop's IEEE operations in its order (no contraction, and the file is built
// without FMA; vector sqrt and div are correctly rounded), so all loops write the same bits. A
// block's last len % 8 elements (only a parameter's last block has them) take the scalar rule.
//
// Compiled with the AVX2 flags (CMakeLists.txt) and run only where the CPU has AVX2 and F16C; all
// here but the entry point has internal linkage (optim_step_avx512.cpp says why).
#include "vec8.h"  // first: the rules of optim_rules.h see its overloads

#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <utility>

#include "../../common/encode.h"
#include "../../common/master_weight.h"
#include "../../common/optim_rules.h"
#include "../../common/stochastic_round.h"
#include "../block_ops.h"
#include "../encode_linear4.h"
#include "../optim_step_parts.h"
#include "codes8.h"
#include "lanes8.h"

namespace lowbit {
namespace kernels {
namespace {

// ---- shared by both loops -----------------------------------------------------------------------

inline float load_one(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::F32: return static_cast<const float*>(p)[i];
    case ElemType::BF16: return to_f32(static_cast<const bf16_t*>(p)[i]);
    case ElemType::F16: return to_f32(static_cast<const f16_t*>(p)[i]);
  }
  return 0.0f;
}

// The scalar loop's code for elements [j0, len) of a block (fewer than 8): parameter and state as
// the scalar block I/O reads and writes them. Quantized slots' new values go to out[k][j] and into
// the scan (abs_bits, raw_bits); the parameter to pbuf[j] where pbuf is given, else to memory.
// Flattened: the shared inline functions it calls (bf16_stochastic, ...) must not be left as
// out-of-line copies compiled for AVX2 (the test x86_objects_isolated).
template <Rule R>
__attribute__((flatten)) void step_tail(const ParamTask& t, const Hyper& h, int64_t block, int64_t begin, int64_t j0, int64_t len,
               float grad_scale, float* const* out, uint32_t* abs_bits, uint32_t* raw_bits, float* pbuf) {
  const StateSlotRef& c = t.slots[kCorrectionSlot];
  for (int64_t j = j0; j < len; ++j) {
    const int64_t e = begin + j;
    float p;
    if (c.storage == SlotStorage::Int16) {
      p = master_from16(static_cast<const uint16_t*>(t.param)[e], static_cast<const int16_t*>(c.values)[e]);
    } else if (c.storage == SlotStorage::Int8) {
      p = master_from8(static_cast<const uint16_t*>(t.param)[e], static_cast<const int8_t*>(c.values)[e]);
    } else {
      p = load_one(t.param, t.param_type, e);
    }
    float g = load_one(t.grad, t.grad_type, e);
    if (grad_scale != 1.0f) g = g * grad_scale;
    float st[kMomentSlots] = {};
    for (int k = 0; k < t.num_slots; ++k) {
      const StateSlotRef& s = t.slots[k];
      switch (s.storage) {
        case SlotStorage::None:
        case SlotStorage::Int16:
        case SlotStorage::Int8: break;
        case SlotStorage::F32: st[k] = static_cast<const float*>(s.values)[e]; break;
        case SlotStorage::BF16: st[k] = to_f32(static_cast<const bf16_t*>(s.values)[e]); break;
        case SlotStorage::Quant: {
          const uint8_t code = format_bits(s.format) == 4 ? (s.codes[e / 2] >> (4 * (e & 1))) & 0xF : s.codes[e];
          st[k] = decode_value(s.tables->codebook, code, s.absmax[block]);
          break;
        }
      }
    }
    apply_rule<R>(h, g, p, st);
    for (int k = 0; k < t.num_slots; ++k) {
      const StateSlotRef& s = t.slots[k];
      switch (s.storage) {
        case SlotStorage::None:
        case SlotStorage::Int16:
        case SlotStorage::Int8: break;
        case SlotStorage::F32: static_cast<float*>(s.values)[e] = st[k]; break;
        case SlotStorage::BF16: static_cast<bf16_t*>(s.values)[e] = from_f32<bf16_t>(st[k]); break;
        case SlotStorage::Quant: {
          out[k][j] = st[k];
          const uint32_t u = f32_bits(st[k]);
          abs_bits[k] = std::max(abs_bits[k], u & 0x7FFFFFFFu);
          raw_bits[k] = std::max(raw_bits[k], u);
          break;
        }
      }
    }
    if (pbuf) {
      pbuf[j] = p;
    } else if (c.storage == SlotStorage::Int16) {
      master_to16(p, static_cast<uint16_t*>(t.param) + e, static_cast<int16_t*>(c.values) + e);
    } else if (c.storage == SlotStorage::Int8) {
      master_to8(p, static_cast<uint16_t*>(t.param) + e, static_cast<int8_t*>(c.values) + e);
    } else if (t.param_type == ElemType::F32) {
      static_cast<float*>(t.param)[e] = p;
    } else if (t.stochastic_round) {
      static_cast<bf16_t*>(t.param)[e] = bf16_stochastic(p, t.seed, static_cast<uint64_t>(t.offset + e));
    } else {
      static_cast<bf16_t*>(t.param)[e] = from_f32<bf16_t>(p);
    }
  }
}

// A quantized slot's block, scanned: its absmax (with encode.h's flags), then its codes.
// Returns 1 where the new values were not representable (store_quantized_slot's result).
inline int finish_quantized(const StateSlotRef& s, int64_t block, int64_t begin, int64_t len, const float* v,
                            uint32_t abs_bits, uint32_t raw_bits) {
  const float am = block_absmax_from_bits(abs_bits, raw_bits > 0x80000000u ? 1u : 0u, format_is_signed(s.format));
  s.absmax[block] = am;
  if (format_bits(s.format) == 4) {
    encode_block4_avx2(Tree4::make(*s.tables), make_normalizer(am), v, len, s.codes + begin / 2);
  } else {
    encode_block8_avx2(s.tables->key_entries, s.tables->key_flip, make_normalizer(am), v, len, s.codes + begin);
  }
  return am >= 0.0f ? 0 : 1;
}

// ---- the per-block loop -------------------------------------------------------------------------

// One state slot as the loop sees it.
struct VecSlot {
  SlotStorage storage;
  float* values;          // F32
  uint16_t* bf16;         // BF16
  const uint8_t* codes;   // Quant: the block's first code byte
  const float* codebook;  // Quant, 8-bit
  Table16 cb16;           // Quant, 4-bit: the codebook in registers
  __m256 amax;
  bool four_bit;
  float* out;             // Quant: the new values, encoded after the loop
  Scan8 scan;
};

inline __m256 decode8(const VecSlot& s, int64_t i) {
  return s.four_bit ? decode4x8(s.cb16, s.codes + i / 2, s.amax) : decode8x8(s.codebook, s.codes + i, s.amax);
}

// NS: the task's slot count (0 to 3), a constant so that the slots' vectors live in registers.
template <Rule R, int NS>
int step_block_avx2(const ParamTask& t, int64_t block, float grad_scale, float* buf) {
  const int64_t B = t.block_size;
  const int64_t begin = block * B;
  const int64_t len = std::min(B, t.numel - begin);
  const int64_t len8 = len & ~int64_t(7);
  const StateSlotRef& corr = t.slots[kCorrectionSlot];
  // fp16 parameters are stored through buf by the scalar conversion (store_param).
  const bool param_direct = t.param_type != ElemType::F16 || is_correction(corr.storage);
  float* pbuf = buf + 3 * B;
  VecSlot slot[kMomentSlots];
  float* out[kMomentSlots] = {buf, buf + B, buf + 2 * B};
  for (int k = 0; k < NS; ++k) {
    const StateSlotRef& r = t.slots[k];
    VecSlot& v = slot[k];
    v.storage = r.storage;
    v.values = static_cast<float*>(r.values);
    v.bf16 = static_cast<uint16_t*>(r.values);
    v.out = out[k];
    v.four_bit = false;
    if (r.storage == SlotStorage::Quant) {
      v.four_bit = format_bits(r.format) == 4;
      v.codebook = r.tables->codebook;
      if (v.four_bit) v.cb16 = Table16::load(r.tables->codebook);
      v.amax = _mm256_set1_ps(r.absmax[block]);
      v.codes = r.codes + (v.four_bit ? begin / 2 : begin);
    }
  }
  prefetch_ahead(t, begin + kPrefetchBlocks * B, B);
  const __m256 scale = _mm256_set1_ps(grad_scale);
  const Hyper h = t.hyper;  // a local: stores through the buffers cannot alias it
  for (int64_t i = 0; i < len8; i += 8) {
    const int64_t e = begin + i;
    __m256 pv;
    if (corr.storage == SlotStorage::Int16) {
      pv = master8_from16(static_cast<const uint16_t*>(t.param) + e, static_cast<const int16_t*>(corr.values) + e);
    } else if (corr.storage == SlotStorage::Int8) {
      pv = master8_from8(static_cast<const uint16_t*>(t.param) + e, static_cast<const int8_t*>(corr.values) + e);
    } else {
      pv = load8(t.param, t.param_type, e);
    }
    f32x8 p = (f32x8)pv;
    __m256 graw = load8(t.grad, t.grad_type, e);
    if (grad_scale != 1.0f) graw = _mm256_mul_ps(graw, scale);
    const f32x8 g = (f32x8)graw;
    f32x8 s[kMomentSlots] = {};
    for (int k = 0; k < NS; ++k) {
      const VecSlot& v = slot[k];
      switch (v.storage) {
        case SlotStorage::None:
        case SlotStorage::Int16:  // a master-weight correction: with the parameter (master_weight.h)
        case SlotStorage::Int8: break;
        case SlotStorage::F32: s[k] = (f32x8)_mm256_loadu_ps(v.values + e); break;
        case SlotStorage::BF16: s[k] = (f32x8)load8(v.bf16, ElemType::BF16, e); break;
        case SlotStorage::Quant: s[k] = (f32x8)decode8(v, i); break;
      }
    }
    apply_rule<R>(h, g, p, s);
    for (int k = 0; k < NS; ++k) {
      VecSlot& v = slot[k];
      switch (v.storage) {
        case SlotStorage::None:
        case SlotStorage::Int16:
        case SlotStorage::Int8: break;
        case SlotStorage::F32: _mm256_storeu_ps(v.values + e, (__m256)s[k]); break;
        case SlotStorage::BF16: store8_bf16(v.bf16 + e, (__m256)s[k]); break;
        case SlotStorage::Quant:
          _mm256_storeu_ps(v.out + i, (__m256)s[k]);
          v.scan.add((__m256)s[k]);
          break;
      }
    }
    if (corr.storage == SlotStorage::Int16) {
      master8_to16((__m256)p, static_cast<uint16_t*>(t.param) + e, static_cast<int16_t*>(corr.values) + e);
    } else if (corr.storage == SlotStorage::Int8) {
      master8_to8((__m256)p, static_cast<uint16_t*>(t.param) + e, static_cast<int8_t*>(corr.values) + e);
    } else if (t.param_type == ElemType::F32) {
      _mm256_storeu_ps(static_cast<float*>(t.param) + e, (__m256)p);
    } else if (!param_direct) {
      _mm256_storeu_ps(pbuf + i, (__m256)p);
    } else if (t.stochastic_round) {
      store8_bf16_stochastic(static_cast<uint16_t*>(t.param) + e, (__m256)p, t.seed, static_cast<uint64_t>(t.offset + e));
    } else {
      store8_bf16(static_cast<uint16_t*>(t.param) + e, (__m256)p);
    }
  }
  uint32_t abs_bits[kMomentSlots] = {}, raw_bits[kMomentSlots] = {};
  for (int k = 0; k < NS; ++k) {
    if (slot[k].storage != SlotStorage::Quant) continue;
    abs_bits[k] = slot[k].scan.abs_bits();
    raw_bits[k] = slot[k].scan.raw_bits();
  }
  if (len8 < len) step_tail<R>(t, h, block, begin, len8, len, grad_scale, out, abs_bits, raw_bits, param_direct ? nullptr : pbuf);
  int bad = 0;
  for (int k = 0; k < NS; ++k)
    if (slot[k].storage == SlotStorage::Quant)
      bad |= finish_quantized(t.slots[k], block, begin, len, out[k], abs_bits[k], raw_bits[k]);
  if (!param_direct) store_param(t, begin, len, pbuf);
  return bad;
}

// ---- the pipelined loop -------------------------------------------------------------------------

// 8-bit codecs of the pipelined loop: the key table and codebook (any format, gathers), or
// arithmetic where every slot's format allows it (codes8.h).
enum Codec8 { kTable8 = 0, kFloat8 = 1, kPow8 = 2 };

// The common case specialized: parameter and gradient both fp32 or both bf16 (rounded to nearest or
// stochastically, or bf16 with a master-weight correction: CORR Int8 or Int16), NS state slots all
// quantized with BITS-bit codes (Q8 / FP8 / C8: 8, Q4: 4), over a run of consecutive blocks of one
// parameter; CODEC: how 8-bit codes decode and encode. Software-pipelined by one block as the
// AVX-512 loop is: while block b is updated (decoding its codes as it goes), the new values of
// block b - 1 are encoded, its absmax being known by then (but see `split` below).
template <Rule R, int NS, ElemType PT, int BITS, int CODEC, SlotStorage CORR = SlotStorage::None>
void steps_quant_avx2(const ParamTask& t, int64_t b0, int64_t b1, float grad_scale, float* buf, uint8_t* bad) {
  static_assert(PT == ElemType::F32 || PT == ElemType::BF16, "fp32 or bf16 parameters");
  static_assert(BITS == 8 || BITS == 4, "8-bit or 4-bit codes");
  static_assert(CORR == SlotStorage::None || (PT == ElemType::BF16 && (CORR == SlotStorage::Int8 || CORR == SlotStorage::Int16)),
                "bf16's correction");
  using Elem = typename std::conditional<PT == ElemType::F32, float, uint16_t>::type;
  const int64_t B = t.block_size;
  const Hyper h = t.hyper;  // a local: stores through the buffers cannot alias it
  const __m256 scale = _mm256_set1_ps(grad_scale);
  const bool scaled = grad_scale != 1.0f;
  const bool stochastic = PT == ElemType::BF16 && t.stochastic_round;
  Elem* const param = static_cast<Elem*>(t.param);
  const Elem* const grad = static_cast<const Elem*>(t.grad);
  using Corr = typename std::conditional<CORR == SlotStorage::Int16, int16_t, int8_t>::type;
  Corr* const corr = static_cast<Corr*>(t.slots[kCorrectionSlot].values);
  uint8_t* codes[NS];
  float* absmax[NS];
  const uint32_t* keys[NS];  // 8-bit: the packed key table and its flip
  __m256i key_flip[NS];
  const float* cb[NS];       // 8-bit: the codebook
  Table16 cb16[NS];          // 4-bit: the codebook and the search tree in registers
  Tree4 tree[NS];
  bool linear4[NS];          // 4-bit: Linear4Unsigned, encoded by formula (encode8_linear4)
  Float8Decoder f8[NS];      // kFloat8
  Pow8Codec p8[NS];          // kPow8
  bool is_signed[NS];
  float* cur[NS];   // the block being updated: its new values
  float* prev[NS];  // the previous block's new values, encoded during this block's update
  for (int k = 0; k < NS; ++k) {
    const StateSlotRef& r = t.slots[k];
    codes[k] = r.codes;
    absmax[k] = r.absmax;
    keys[k] = r.tables->key_entries;
    key_flip[k] = _mm256_set1_epi32(static_cast<int>(r.tables->key_flip));
    cb[k] = r.tables->codebook;
    if (BITS == 4) {
      cb16[k] = Table16::load(r.tables->codebook);
      tree[k] = Tree4::make(*r.tables);
    }
    linear4[k] = BITS == 4 && r.tables->linear4;
    if (CODEC == kFloat8) f8[k] = Float8Decoder::make(*r.tables, r.format);
    if (CODEC == kPow8) p8[k] = Pow8Codec::make(*r.tables, r.format);
    is_signed[k] = format_is_signed(r.format);
    cur[k] = buf + k * B;
    prev[k] = buf + (NS + k) * B;
  }
  // Slot k's codes of the block at `begin` from its new values v.
  const auto encode_block = [&](int k, Normalizer nz, const float* v, int64_t begin, int64_t len) {
    if (BITS == 8 && CODEC == kPow8) {
      const Pow8Codec& p = p8[k];
      encode_block8_with([&p](__m256 n) { return p.encode(n); }, nz, v, len, codes[k] + begin);
    } else if (BITS == 8) {
      encode_block8_avx2(keys[k], t.slots[k].tables->key_flip, nz, v, len, codes[k] + begin);
    } else {
      encode_block4_avx2(tree[k], nz, v, len, codes[k] + begin / 2);
    }
  };
  __m256 pre[NS], inv[NS];  // the previous block's normalizer
  Normalizer last_nz[NS];
  int64_t prev_begin = 0, prev_len = 0;
  // Short blocks (C8's 64) and three slots (AdEMAMix) encode each block right after its own update
  // instead of during the next one's: on Zen 3, 2 threads, 2^25 parameters, C8 6 of 6 pairs faster
  // (about 6 %), AdEMAMix 5 of 6 (about 10 %); Q8 and Q4 at 256 / 128 and two slots gain nothing.
  const bool split = B <= 64 || NS == 3;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t begin = b * B;
    const int64_t len = std::min(B, t.numel - begin);
    const int64_t len8 = len & ~int64_t(7);
    prefetch_ahead(t, begin + kPrefetchBlocks * B, B);
    __m256 amax[NS];
    Scan8 scan[NS];
    for (int k = 0; k < NS; ++k) amax[k] = _mm256_set1_ps(absmax[k][b]);
    // The previous block is never a parameter's short last block (that one is encoded after the
    // loop), so it holds B elements, whole chunks of 8.
    const int64_t end = std::max(len8, prev_len);
    for (int64_t i = 0; i < end; i += 8) {
      if (i < len8) {
        const int64_t e = begin + i;
        __m256 pv;
        if constexpr (CORR == SlotStorage::Int8) {
          pv = master8_from8(reinterpret_cast<const uint16_t*>(param) + e, corr + e);
        } else if constexpr (CORR == SlotStorage::Int16) {
          pv = master8_from16(reinterpret_cast<const uint16_t*>(param) + e, corr + e);
        } else {
          pv = load8(param, PT, e);
        }
        f32x8 p = (f32x8)pv;
        __m256 g = load8(grad, PT, e);
        if (scaled) g = _mm256_mul_ps(g, scale);
        f32x8 st[kMomentSlots] = {};
        for (int k = 0; k < NS; ++k) {
          if (BITS == 4) {
            st[k] = (f32x8)decode4x8(cb16[k], codes[k] + e / 2, amax[k]);
          } else if (CODEC == kFloat8) {
            st[k] = (f32x8)_mm256_mul_ps(f8[k](code_lanes(codes[k] + e)), amax[k]);
          } else if (CODEC == kPow8) {
            st[k] = (f32x8)_mm256_mul_ps(p8[k].decode(code_lanes(codes[k] + e)), amax[k]);
          } else {
            st[k] = (f32x8)decode8x8(cb[k], codes[k] + e, amax[k]);
          }
        }
        apply_rule<R>(h, (f32x8)g, p, st);
        for (int k = 0; k < NS; ++k) {
          _mm256_storeu_ps(cur[k] + i, (__m256)st[k]);
          scan[k].add((__m256)st[k]);
        }
        if constexpr (CORR == SlotStorage::Int8) {
          master8_to8((__m256)p, reinterpret_cast<uint16_t*>(param) + e, corr + e);
        } else if constexpr (CORR == SlotStorage::Int16) {
          master8_to16((__m256)p, reinterpret_cast<uint16_t*>(param) + e, corr + e);
        } else if (PT == ElemType::F32) {
          _mm256_storeu_ps(reinterpret_cast<float*>(param) + e, (__m256)p);
        } else if (stochastic) {
          store8_bf16_stochastic(reinterpret_cast<uint16_t*>(param) + e, (__m256)p, t.seed, static_cast<uint64_t>(t.offset + e));
        } else {
          store8_bf16(reinterpret_cast<uint16_t*>(param) + e, (__m256)p);
        }
      }
      if (!split && i < prev_len) {
        for (int k = 0; k < NS; ++k) {
          const __m256 n = normalize8(_mm256_loadu_ps(prev[k] + i), pre[k], inv[k]);
          if (BITS == 8) {
            const uint64_t c = pack_bytes8(CODEC == kPow8 ? p8[k].encode(n) : encode8x8(keys[k], key_flip[k], n));
            std::memcpy(codes[k] + prev_begin + i, &c, 8);
          } else {
            const uint32_t c = pack_nibbles8(linear4[k] ? encode8_linear4(n) : tree[k].encode(n));
            std::memcpy(codes[k] + (prev_begin + i) / 2, &c, 4);
          }
        }
      }
    }
    uint32_t abs_bits[kMomentSlots] = {}, raw_bits[kMomentSlots] = {};
    for (int k = 0; k < NS; ++k) {
      abs_bits[k] = scan[k].abs_bits();
      raw_bits[k] = scan[k].raw_bits();
    }
    if (len8 < len) step_tail<R>(t, h, b, begin, len8, len, grad_scale, cur, abs_bits, raw_bits, nullptr);
    // Block b is updated: its absmax, then it becomes the block to encode.
    uint8_t flag = 0;
    for (int k = 0; k < NS; ++k) {
      const float am = block_absmax_from_bits(abs_bits[k], raw_bits[k] > 0x80000000u ? 1u : 0u, is_signed[k]);
      absmax[k][b] = am;
      flag |= am >= 0.0f ? 0 : 1;
      last_nz[k] = make_normalizer(am);
      pre[k] = _mm256_set1_ps(last_nz[k].pre);
      inv[k] = _mm256_set1_ps(last_nz[k].inv);
      if (split) {
        encode_block(k, last_nz[k], cur[k], begin, len);
      } else {
        std::swap(cur[k], prev[k]);
      }
    }
    bad[b - b0] = flag;
    if (!split) {
      prev_begin = begin;
      prev_len = len;
    }
  }
  if (prev_len == 0) return;
  for (int k = 0; k < NS; ++k) encode_block(k, last_nz[k], prev[k], prev_begin, prev_len);
}

// ---- the dense loop ----------------------------------------------------------------------------

// Dense state (every slot fp32 or every slot bf16) for fp32 or bf16 parameters and gradients of the
// same type, bf16 rounded to nearest or stochastically, no correction: the per-block loop without its per-chunk
// choices (optim_step_avx512.cpp's dense loop on 8 lanes). A parameter's last len % 8 elements take
// the scalar rule (step_tail). Dense slots never flag a block.
template <Rule R, int NS, ElemType PT, SlotStorage ST>
void steps_dense_avx2(const ParamTask& t, int64_t b0, int64_t b1, float grad_scale, float*, uint8_t* bad) {
  static_assert(PT == ElemType::F32 || PT == ElemType::BF16, "fp32 or bf16 parameters");
  static_assert(ST == SlotStorage::F32 || ST == SlotStorage::BF16, "dense state");
  using Elem = typename std::conditional<PT == ElemType::F32, float, uint16_t>::type;
  using State = typename std::conditional<ST == SlotStorage::F32, float, uint16_t>::type;
  const int64_t B = t.block_size;
  const Hyper h = t.hyper;  // a local: stores through the arrays cannot alias it
  const __m256 scale = _mm256_set1_ps(grad_scale);
  const bool scaled = grad_scale != 1.0f;
  const bool stochastic = PT == ElemType::BF16 && t.stochastic_round;
  Elem* const param = static_cast<Elem*>(t.param);
  const Elem* const grad = static_cast<const Elem*>(t.grad);
  State* st[NS];
  for (int k = 0; k < NS; ++k) st[k] = static_cast<State*>(t.slots[k].values);
  for (int64_t b = b0; b < b1; ++b) {
    bad[b - b0] = 0;
    const int64_t begin = b * B;
    const int64_t len = std::min(B, t.numel - begin);
    const int64_t len8 = len & ~int64_t(7);
    prefetch_ahead(t, begin + kPrefetchBlocks * B, B);
    for (int64_t e = begin; e < begin + len8; e += 8) {
      f32x8 p = (f32x8)load8(param, PT, e);
      __m256 g = load8(grad, PT, e);
      if (scaled) g = _mm256_mul_ps(g, scale);
      f32x8 s[kMomentSlots] = {};
      for (int k = 0; k < NS; ++k) s[k] = (f32x8)load8(st[k], ST == SlotStorage::F32 ? ElemType::F32 : ElemType::BF16, e);
      apply_rule<R>(h, (f32x8)g, p, s);
      for (int k = 0; k < NS; ++k) {
        if (ST == SlotStorage::F32) {
          _mm256_storeu_ps(reinterpret_cast<float*>(st[k]) + e, (__m256)s[k]);
        } else {
          store8_bf16(reinterpret_cast<uint16_t*>(st[k]) + e, (__m256)s[k]);
        }
      }
      if (PT == ElemType::F32) {
        _mm256_storeu_ps(reinterpret_cast<float*>(param) + e, (__m256)p);
      } else if (stochastic) {
        store8_bf16_stochastic(reinterpret_cast<uint16_t*>(param) + e, (__m256)p, t.seed, static_cast<uint64_t>(t.offset + e));
      } else {
        store8_bf16(reinterpret_cast<uint16_t*>(param) + e, (__m256)p);
      }
    }
    if (len8 < len) {
      float* none[kMomentSlots] = {};
      uint32_t abs_bits[kMomentSlots] = {}, raw_bits[kMomentSlots] = {};
      step_tail<R>(t, h, b, begin, len8, len, grad_scale, none, abs_bits, raw_bits, nullptr);
    }
  }
}

// ---- the choice ---------------------------------------------------------------------------------

// The specialized loops for rule R with NS moment slots (pick_for_slots): quant for quantized state.
template <Rule R, int NS>
struct Loops {
  static RangeFn quant(const TaskShape& s) {
    constexpr ElemType F = ElemType::F32, H = ElemType::BF16;
    constexpr SlotStorage kInt8 = SlotStorage::Int8, kInt16 = SlotStorage::Int16;
    // Quantized state: the pipelined loop, with the 8-bit codec every slot's format allows (with a
    // correction the table codec alone, which takes any format: half the instantiations).
    if (s.quant_bits == 4) {
      if (s.corr == kInt8) return &steps_quant_avx2<R, NS, H, 4, kTable8, kInt8>;
      if (s.corr == kInt16) return &steps_quant_avx2<R, NS, H, 4, kTable8, kInt16>;
      return s.f32 ? &steps_quant_avx2<R, NS, F, 4, kTable8> : &steps_quant_avx2<R, NS, H, 4, kTable8>;
    }
    if (s.quant_bits == 8) {
      if (s.corr == kInt8) return &steps_quant_avx2<R, NS, H, 8, kTable8, kInt8>;
      if (s.corr == kInt16) return &steps_quant_avx2<R, NS, H, 8, kTable8, kInt16>;
      if (s.float8) return s.f32 ? &steps_quant_avx2<R, NS, F, 8, kFloat8> : &steps_quant_avx2<R, NS, H, 8, kFloat8>;
      if (s.pow8) return s.f32 ? &steps_quant_avx2<R, NS, F, 8, kPow8> : &steps_quant_avx2<R, NS, H, 8, kPow8>;
      return s.f32 ? &steps_quant_avx2<R, NS, F, 8, kTable8> : &steps_quant_avx2<R, NS, H, 8, kTable8>;
    }
    return nullptr;
  }
  template <ElemType PT, SlotStorage ST>
  static constexpr RangeFn dense = &steps_dense_avx2<R, NS, PT, ST>;
};

template <Rule R>
RangeFn range_fn(const ParamTask& t) {
  if (const RangeFn fn = pick_specialized<Loops, R>(t)) return fn;
  switch (t.num_slots) {
    case 0: return &each_block<&step_block_avx2<R, 0>>;
    case 1: return &each_block<&step_block_avx2<R, 1>>;
    case 2: return &each_block<&step_block_avx2<R, 2>>;
    default: return &each_block<&step_block_avx2<R, 3>>;
  }
}

}  // namespace

RangeFn avx2_range_fn(Rule rule, const ParamTask& t) {
  return with_rule(rule, [&t](auto r) { return range_fn<decltype(r)::value>(t); });
}

}  // namespace kernels
}  // namespace lowbit
