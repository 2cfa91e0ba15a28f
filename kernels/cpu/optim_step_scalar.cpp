// The scalar loop of the CPU step (optim_step_parts.h), and the block I/O it is built from: a
// block's parameter, gradient and state slots to fp32 buffers and back. The AVX-512 loops reuse the
// block I/O for what they leave to it (quantized slots' codes, parameters stored through a buffer).
#include <algorithm>

#include "../common/encode.h"
#include "../common/float_convert.h"
#include "../common/master_weight.h"
#include "../common/optim_rules.h"
#include "../common/stochastic_round.h"
#include "block_ops.h"
#include "optim_step_parts.h"

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

}  // namespace

// ---- block I/O ----------------------------------------------------------------------------------

void load_block(const void* p, ElemType t, int64_t begin, int64_t len, float* out) {
  for (int64_t i = 0; i < len; ++i) out[i] = load(p, t, begin + i);
}

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
      const float amax = s.absmax[block];
      if (format_bits(s.format) == 4) {
        decode_codes4(*s.tables, s.codes + begin / 2, len, amax, out);
      } else {
        decode_codes8(*s.tables, s.codes + begin, len, amax, out);
      }
      return;
    }
  }
}

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

namespace {

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

}  // namespace

RangeFn scalar_range_fn(Rule rule) {
  return with_rule(rule, [](auto r) -> RangeFn { return &each_block<&step_block_scalar<decltype(r)::value>>; });
}

}  // namespace kernels
}  // namespace lowbit
