// One lane's part of a step: 8 elements loaded, decoded, updated by the rule (optim_rules.h) in
// registers, then encoded and stored.
#pragma once

#include <type_traits>

#include "speculative_arith.cuh"
#include "step_element_access.cuh"
#include "step_tables.cuh"
#include "step_tuning.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

// 8 elements starting at element i of parameter P: load, decode, update in registers. NS slots
// are carried (the highest used slot + 1); FULL: the 8 elements are in range and aligned.
template <Rule R, typename T, int FAMILY, int NS, int C>
struct Lane {
  using K = Known<T, C>;
  // Elements past the parameter's end load as 0 (p, g and state) and update to 0: they change no
  // block's absmax and are never stored, so every loop runs all 8 without a bound.
  float p[8], s[NS][8];
  // Bit k: slot k's new values cannot be negative (Args::nonneg_mask, and the block's old absmax
  // is valid, so its decoded values are >= 0): its block needs no search for negative values.
  // Set from the old absmax every lane of a block reads, so it is the same across the block.
  uint32_t no_negative = 0;

  // Slot k's block, whose old scale is `old_amax`, needs no search when the rule cannot make its
  // values negative and the old scale is valid (not flagged negative).
  __device__ __forceinline__ void note_no_negative(const Args& a, int k, float old_amax) {
    if (((a.nonneg_mask >> k) & 1) && old_amax >= 0.0f) no_negative |= 1u << k;
  }

  template <bool FULL>
  __device__ __forceinline__ void load_update(const StepParamRef& P, const Args& a, const Hyper& h, float grad_mult,
                                              const SharedFormat* sh, int64_t i, bool vec) {
    float g[8];
    load<FULL>(P, a, sh, i, vec, g);
    if constexpr (kSpeculates<R, FAMILY>) {
      SpeculativeArith ar;
      update(h, grad_mult, g, ar);
      if (ar.ok) return;
      // An operand outside the short sequences' range (speculative_arith.cuh): load again (the
      // update replaced p and s; the barrier keeps nvcc from holding the loaded bytes in
      // registers through the update instead) and redo the 8 elements with the IEEE operations.
      asm volatile("" ::: "memory");
      load<FULL>(P, a, sh, i, vec, g);
    }
    if constexpr (kBatches<R, FAMILY, C>) update_batch(h, grad_mult, g);
    else update(h, grad_mult, g, ExactArith{});
  }

  template <bool FULL>
  __device__ __forceinline__ void load(const StepParamRef& P, const Args& a, const SharedFormat* sh, int64_t i,
                                       bool vec, float (&g)[8]) {
    if constexpr (FULL) {
      load_full(P, a, sh, i, g);
    } else {
      const int64_t n = P.numel;
      load8(static_cast<const T*>(P.param), i, n, vec, p);
      if constexpr (std::is_same<T, bf16_t>::value) {
        if (K::correction_bits(a) != 0) add_corrections<false>(P, K::correction_bits(a), i, n, vec, p);
      }
      load_grad8(P.grad, K::grad_type(P), i, n, vec, g);
      load_slots(P, a, sh, i, vec);
    }
  }

  // A whole, aligned unit: the raw bytes first (UnitBytes), then converted and decoded.
  __device__ __forceinline__ void load_full(const StepParamRef& P, const Args& a, const SharedFormat* sh, int64_t i,
                                            float (&g)[8]) {
    UnitBytes<T, FAMILY, NS, C> b;
    b.load(P, a, i);
    b.param_grad(a, K::grad_type(P), p, g);
#pragma unroll
    for (int k = 0; k < NS; ++k) {
      if (FAMILY == kF32) {
        convert8<float>(b.slot[k], s[k]);
      } else if (FAMILY == kBF16) {
        convert8<bf16_t>(b.slot[k], s[k]);
      } else {
        uint8_t c[8];
        b.codes(k, c);
        decode8(sh, a, k, c, b.amax[k], s[k]);
        note_no_negative(a, k, b.amax[k]);
      }
      // An unused slot loaded nothing (its values, whatever they decode to, are neither read by
      // the rule nor stored).
    }
  }

  // 8 values of slot k from their codes and the block's scale.
  __device__ __forceinline__ void decode8(const SharedFormat* sh, const Args& a, int k, const uint8_t (&c)[8],
                                          float amax, float (&out)[8]) const {
    const float* cb = sh[a.format_of_slot[k]].codebook;
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = decode_value(cb, c[e], amax);
  }

  // The bounded path's state: element by element past the end (0 there, and for unused slots).
  __device__ __forceinline__ void load_slots(const StepParamRef& P, const Args& a, const SharedFormat* sh, int64_t i,
                                             bool vec) {
    const int64_t n = P.numel;
#pragma unroll
    for (int k = 0; k < NS; ++k) {
#pragma unroll
      for (int e = 0; e < 8; ++e) s[k][e] = 0.0f;
      if (!(a.used_mask & (1 << k))) continue;
      if (FAMILY == kF32) {
        load8(static_cast<const float*>(P.slot[k]), i, n, vec, s[k]);
      } else if (FAMILY == kBF16) {
        load8(static_cast<const bf16_t*>(P.slot[k]), i, n, vec, s[k]);
      } else {
        // The old scale, read by every lane of a block that exists (lanes past the end too), so
        // that no_negative is the same across the block's lanes.
        const int64_t block = i >> a.block_shift;
        const float old = (block << a.block_shift) < n ? P.absmax[k][block] : 0.0f;
        note_no_negative(a, k, old);
        if (i >= n) continue;
        uint8_t c[8];
        load_codes8<code_bits(FAMILY), false>(static_cast<const uint8_t*>(P.slot[k]), i, n, vec, c);
        decode8(sh, a, k, c, old, s[k]);
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (i + e >= n) s[k][e] = 0.0f;  // code 0 is not 0
      }
    }
  }

  // The rule on the 8 elements, in registers, with division and square root by `ar`.
  template <typename Ar>
  __device__ __forceinline__ void update(const Hyper& h, float grad_mult, const float (&g)[8], Ar&& ar) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      // The clipping / unscaling factor, with maximize's sign flip folded in by the prologue
      // (g * -m == -(g * m) exactly; g * 1 == g): one multiply, no branch.
      const float ge = g[e] * grad_mult;
      float st[RuleMaxSlots<R>::value];
#pragma unroll
      for (int k = 0; k < RuleMaxSlots<R>::value; ++k) st[k] = k < NS ? s[k < NS ? k : 0][e] : 0.0f;
      float pe = p[e];
      apply_rule<R, float, (NS >= 3)>(h, ge, pe, st, ar);  // Adam's amsgrad test only where slot 2 is carried
      p[e] = pe;
#pragma unroll
      for (int k = 0; k < NS; ++k) s[k][e] = st[k];
    }
  }

  // The same update on the 8 elements as one f32x8 value (kBatches).
  __device__ __forceinline__ void update_batch(const Hyper& h, float grad_mult, const float (&g)[8]) {
    constexpr int kSlots = RuleMaxSlots<R>::value;
    f32x8 ge, pe, st[kSlots];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      ge.v[e] = g[e] * grad_mult;  // as in update
      pe.v[e] = p[e];
#pragma unroll
      for (int k = 0; k < kSlots; ++k) st[k].v[e] = k < NS ? s[k < NS ? k : 0][e] : 0.0f;
    }
    apply_rule<R, f32x8, (NS >= 3)>(h, ge, pe, st, BatchArith{});
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      p[e] = pe.v[e];
#pragma unroll
      for (int k = 0; k < NS; ++k) s[k][e] = st[k].v[e];
    }
  }

  __device__ __forceinline__ BitScan scan(int k) const {
    BitScan sc;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const uint32_t u = __float_as_uint(s[k][e]);
      const uint32_t a = u & 0x7FFFFFFFu;
      sc.max_abs = a > sc.max_abs ? a : sc.max_abs;
      sc.max_raw = u > sc.max_raw ? u : sc.max_raw;
    }
    return sc;
  }

  // Dense slots and the parameter.
  template <bool FULL>
  __device__ __forceinline__ void store_dense(const StepParamRef& P, const Args& a, uint64_t seed, int64_t i,
                                              bool vec) const {
    const int64_t n = P.numel;
    if (FAMILY == kF32 || FAMILY == kBF16) {
#pragma unroll
      for (int k = 0; k < NS; ++k) {
        if (!(a.used_mask & (1 << k))) continue;
        if (FAMILY == kF32) store8<FULL>(static_cast<float*>(P.slot[k]), i, n, vec, s[k]);
        else store8<FULL>(static_cast<bf16_t*>(P.slot[k]), i, n, vec, s[k]);
      }
    }
    if constexpr (std::is_same<T, bf16_t>::value) {
      if (K::correction_bits(a) != 0) {
        store_corrected<FULL>(P, K::correction_bits(a), i, n, FULL || vec, p);
        return;
      }
    }
    store_param8<FULL>(static_cast<T*>(P.param), i, n, vec, p, K::stochastic(a), seed, P.offset);
  }

  template <bool FULL>
  __device__ __forceinline__ void encode_slot(const StepParamRef& P, const Args& a, const SharedFormat* sh, int k,
                                              float amax, int64_t i, bool vec) const {
    const Normalizer nz = kShortNormalizer<C> ? step_normalizer(amax) : make_normalizer(amax);
    uint8_t c[8];
    // pre == 1 (absmax within 2^-64..2^64: every block in practice): (x * 1) * inv is x * inv, one
    // multiply. The test is the same for the lanes of a block, so the branch rarely diverges.
    const bool one_multiply = nz.pre == 1.0f;
    const SharedFormat& f = sh[a.format_of_slot[k]];
    if (!(amax >= 0.0f)) {
      // A block flagged NaN or negative (encode.h: block_absmax): encode_value's clamps.
#pragma unroll
      for (int e = 0; e < 8; ++e) c[e] = encode_value(f, normalize(nz, s[k][e]));
    } else if (one_multiply) {
#pragma unroll
      for (int e = 0; e < 8; ++e) c[e] = encode_valid(f, s[k][e] * nz.inv);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) c[e] = encode_valid(f, normalize(nz, s[k][e]));
    }
    store_codes8<code_bits(FAMILY), FULL>(static_cast<uint8_t*>(P.slot[k]), i, P.numel, vec, c);
  }
};

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
