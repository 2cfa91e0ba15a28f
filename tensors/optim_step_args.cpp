// Argument checks of lowbit::optim_step_ (optim_ops.h): every list has the length its parameters
// need, and every tensor the dtype, size and device the kernels assume.
#include <c10/util/Exception.h>

#include "optim_ops.h"

namespace lowbit {
namespace ops {

std::vector<StepParam> parse_step_args(int64_t rule, at::TensorList params, at::TensorList grads,
                                       at::TensorList states, at::IntArrayRef slot_kinds,
                                       at::IntArrayRef block_sizes, at::ArrayRef<double> hyper,
                                       at::IntArrayRef seeds, at::IntArrayRef flags, const char* op) {
  const int64_t n = static_cast<int64_t>(params.size());
  TORCH_CHECK(rule >= 0 && rule <= static_cast<int64_t>(kernels::Rule::LAMB), op, ": unknown rule ", rule);
  const auto check_len = [&](int64_t got, int64_t want, const char* what) {
    TORCH_CHECK(got == want, op, ": ", what, " has ", got, " entries; ", n, " parameters need ", want);
  };
  check_len(static_cast<int64_t>(grads.size()), n, "grads");
  check_len(static_cast<int64_t>(slot_kinds.size()), 3 * n, "slot_kinds");
  check_len(static_cast<int64_t>(block_sizes.size()), n, "block_sizes");
  check_len(static_cast<int64_t>(hyper.size()), n * kernels::kHyperFields, "hyper");
  check_len(static_cast<int64_t>(seeds.size()), n, "seeds");
  check_len(static_cast<int64_t>(flags.size()), n, "flags");
  const auto float_type = [](at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; };
  std::vector<StepParam> out(n);
  size_t next_state = 0;
  for (int64_t i = 0; i < n; ++i) {
    StepParam& p = out[i];
    p.param = params[i];
    p.grad = grads[i];
    const int64_t numel = p.param.numel();
    TORCH_CHECK(float_type(p.param.scalar_type()), op, ": parameter ", i, " has dtype ", p.param.scalar_type(),
                "; supported: float32, bfloat16, float16");
    TORCH_CHECK(float_type(p.grad.scalar_type()), op, ": the gradient of parameter ", i, " has dtype ",
                p.grad.scalar_type(), "; supported: float32, bfloat16, float16");
    TORCH_CHECK(p.grad.sizes() == p.param.sizes(), op, ": parameter ", i, " has shape ", p.param.sizes(),
                " but its gradient ", p.grad.sizes());
    TORCH_CHECK(p.grad.device() == p.param.device(), op, ": parameter ", i, " is on ", p.param.device(),
                " but its gradient on ", p.grad.device());
    p.block_size = block_sizes[i];
    p.hyper = kernels::unpack_hyper(hyper.data() + i * kernels::kHyperFields);
    p.seed = static_cast<uint64_t>(seeds[i]);
    p.stochastic_round = (flags[i] & kFlagStochasticRound) != 0 && p.param.scalar_type() == at::kBFloat16;
    bool any_quantized = false;
    for (int k = 0; k < 3; ++k) {
      StepSlot& s = p.slots[k];
      s.kind = slot_kinds[3 * i + k];
      if (s.kind == kSlotNone) continue;
      p.num_slots = k + 1;
      const auto take = [&](const char* what) {
        TORCH_CHECK(next_state < states.size(), op, ": states ends before the ", what, " of slot ", k,
                    " of parameter ", i);
        const at::Tensor& t = states[next_state++];
        TORCH_CHECK(t.device() == p.param.device(), op, ": the state (slot ", k, ") of parameter ", i, " is on ",
                    t.device(), " but the parameter on ", p.param.device());
        TORCH_CHECK(t.is_contiguous(), op, ": the state (slot ", k, ") of parameter ", i, " is not contiguous");
        return t;
      };
      if (s.kind == kSlotF32 || s.kind == kSlotBF16) {
        s.values = take("values");
        const at::ScalarType want = s.kind == kSlotF32 ? at::kFloat : at::kBFloat16;
        TORCH_CHECK(s.values.scalar_type() == want && s.values.numel() == numel, op, ": slot ", k, " of parameter ", i,
                    " must be ", want, " with ", numel, " elements, got ", s.values.scalar_type(), " with ",
                    s.values.numel());
        continue;
      }
      const int64_t f = s.kind - kSlotQuantized;
      TORCH_CHECK(f >= 0 && f < kNumQuantFormats, op, ": slot ", k, " of parameter ", i, " has unknown kind ", s.kind);
      s.format = static_cast<QuantFormat>(f);
      any_quantized = true;
      s.codes = take("codes");
      s.absmax = take("absmax");
      TORCH_CHECK(s.codes.scalar_type() == at::kByte && s.codes.numel() == code_bytes(s.format, numel), op, ": slot ",
                  k, " of parameter ", i, " (", format_name(s.format), ") needs ", code_bytes(s.format, numel),
                  " uint8 codes, got ", s.codes.numel(), " of ", s.codes.scalar_type());
      TORCH_CHECK(is_valid_block_size(p.block_size), op, ": parameter ", i, " has block size ", p.block_size,
                  "; quantized state needs a power of two in [", kMinBlockSize, ", ", kMaxBlockSize, "]");
      TORCH_CHECK(s.absmax.scalar_type() == at::kFloat && s.absmax.numel() == num_blocks(numel, p.block_size), op,
                  ": slot ", k, " of parameter ", i, " needs ", num_blocks(numel, p.block_size),
                  " float32 absmax values, got ", s.absmax.numel(), " of ", s.absmax.scalar_type());
    }
    if (!any_quantized)
      TORCH_CHECK(p.block_size >= 16 && p.block_size % 16 == 0 && p.block_size <= (int64_t(1) << 20), op,
                  ": parameter ", i, " has work block ", p.block_size, "; dense state needs a multiple of 16");
  }
  TORCH_CHECK(next_state == states.size(), op, ": states has ", states.size(), " tensors; the slot kinds use ",
              next_state);
  return out;
}

}  // namespace ops
}  // namespace lowbit
