// Argument checks of lowbit::optim_step_ / optim_lamb_norms (optim_ops.h): every list has the
// length its parameters need, every tensor the dtype, size and device the kernels assume, and the
// per-step scalars are where the step reads them. Errors name the op, the argument, the parameter.
#include <c10/util/Exception.h>

#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "blockwise_ops.h"
#include "optim_ops.h"

namespace lowbit {
namespace ops {

namespace {

bool is_float_type(at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; }

// A one-element tensor of one of `types` on `device`.
void check_scalar(const at::Tensor& t, const char* what, at::Device device, std::initializer_list<at::ScalarType> types,
                  const char* op) {
  bool ok = false;
  for (auto s : types) ok |= t.scalar_type() == s;
  TORCH_CHECK(ok, op, ": ", what, " has dtype ", t.scalar_type(), "; expected ", *types.begin());
  TORCH_CHECK(t.numel() == 1, op, ": ", what, " must hold one value, got ", t.numel());
  TORCH_CHECK(t.device() == device, op, ": ", what, " is on ", t.device(), " but the parameters on ", device);
}

std::string slot_list(const std::vector<kernels::SlotType>& slots) {
  std::string s;
  for (size_t k = 0; k < slots.size(); ++k) s += (k ? ", " : "") + slot_type_name(slots[k]);
  return s;
}

// What the step writes (parameters, counters, state) must not share memory: not between two
// tensors (a parameter passed twice, a state aliasing a parameter) and not within one (an expanded
// tensor), or elements would be updated twice or from a half-written state. Each tensor's range is
// taken while check_step_call has it at hand (thousands of small tensors: a second pass over their
// metadata costs cache misses), and its name is only built for an error.
class OutputRanges {
 public:
  enum Kind { kParam, kCounters, kValues, kCodes, kAbsmax };

  OutputRanges(bool enabled, size_t tensors, const char* op) : enabled_(enabled), op_(op) {
    if (enabled_) ranges_.reserve(tensors);
  }

  // The address of an output of the step, materialized where it is copy-on-write (the step writes
  // it); optim_lamb_norms only reads.
  void* address(const at::Tensor& t) const {
    if (!t.defined() || t.is_meta() || t.numel() == 0) return nullptr;
    return enabled_ ? t.mutable_data_ptr() : const_cast<void*>(t.const_data_ptr());
  }

  // Records t (at address `data`, from address()).
  void add(const at::Tensor& t, const void* data, Kind kind, int param, int slot = 0) {
    if (!enabled_ || !t.defined() || t.numel() == 0 || t.is_meta()) return;
    const Range r{0, 0, kind, param, slot};
    if (!t.is_contiguous())
      TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, op_, ": ", describe(r),
                  " has elements that share memory (e.g. an expanded tensor); the step writes it");
    const auto lo = reinterpret_cast<uintptr_t>(data);
    ranges_.push_back({lo, lo + bytes_spanned(t), kind, param, slot});
  }

  // After check(): a gradient, which the step reads while it writes the outputs, must not share
  // their memory (a gradient that is a state tensor would be read half-updated).
  void check_gradient(const at::Tensor& g, int param) const {
    if (!enabled_ || !g.defined() || g.numel() == 0 || g.is_meta()) return;
    const auto lo = reinterpret_cast<uintptr_t>(g.const_data_ptr());
    const uintptr_t hi = lo + bytes_spanned(g);
    // The outputs are apart, so their ends ascend with their starts: the first that ends past lo
    // is the only one that can overlap.
    const auto it = std::partition_point(sorted_->begin(), sorted_->end(), [&](const Range& x) { return x.hi <= lo; });
    TORCH_CHECK(it == sorted_->end() || it->lo >= hi, op_, ": the gradient of parameter ", param, " shares memory with ",
                describe(*it), ", which the step writes");
  }

  bool enabled() const { return enabled_; }

  void check() {
    // An optimizer passes the same outputs at every step: ranges equal, in order, to the last call
    // this thread found apart are still apart, and the sort (the check's largest cost over
    // thousands of tensors) is skipped.
    thread_local std::vector<std::pair<uintptr_t, uintptr_t>> last_apart;
    thread_local std::vector<Range> last_sorted;
    sorted_ = &last_sorted;
    const auto same_as_last = [&] {
      if (last_apart.size() != ranges_.size()) return false;
      for (size_t k = 0; k < ranges_.size(); ++k)
        if (last_apart[k].first != ranges_[k].lo || last_apart[k].second != ranges_[k].hi) return false;
      return true;
    };
    if (!enabled_ || same_as_last()) return;
    std::vector<std::pair<uintptr_t, uintptr_t>> in_order(ranges_.size());
    for (size_t k = 0; k < ranges_.size(); ++k) in_order[k] = {ranges_[k].lo, ranges_[k].hi};
    std::sort(ranges_.begin(), ranges_.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
    for (size_t k = 1, widest = 0; k < ranges_.size(); ++k) {
      TORCH_CHECK(ranges_[k].lo >= ranges_[widest].hi, op_, ": ", describe(ranges_[k]), " and ",
                  describe(ranges_[widest]), " share memory; the step writes both (overlapping outputs)");
      if (ranges_[k].hi > ranges_[widest].hi) widest = k;
    }
    last_apart = std::move(in_order);
    last_sorted = ranges_;
  }

 private:
  struct Range {
    uintptr_t lo, hi;
    int kind, param, slot;
  };
  // The bytes from t's first element to the end of its last (a contiguous tensor: its elements).
  static uintptr_t bytes_spanned(const at::Tensor& t) {
    int64_t extent = t.numel();
    if (!t.is_contiguous()) {
      extent = 1;
      for (int64_t d = 0; d < t.dim(); ++d) extent += (t.size(d) - 1) * t.stride(d);
    }
    return static_cast<uintptr_t>(extent * t.element_size());
  }
  static std::string describe(const Range& r) {
    static const char* const kSlotPart[] = {"", "", "the values", "the codes", "the absmax"};
    const std::string pi = "parameter " + std::to_string(r.param);
    if (r.kind == kParam) return pi;
    if (r.kind == kCounters) return "counters[" + std::to_string(r.param) + "]";
    return std::string(kSlotPart[r.kind]) + " of slot " + std::to_string(r.slot) + " of " + pi;
  }

  bool enabled_;
  const char* op_;
  std::vector<Range> ranges_;
  const std::vector<Range>* sorted_ = nullptr;  // the outputs by address, from check()
};

// A per-step value read where its tensor lies on the CPU: elsewhere the step reads it on the
// device and the host never waits for it (optim_ops.h).
void check_value(double v, kernels::HyperRange r, const char* op, const char* what, const char* hint = "") {
  TORCH_CHECK(kernels::in_range(r, v), op, ": ", what, " must be ", kernels::range_text(r), ", got ", v, hint);
}

// Every tensor the step writes, as an in-place op of torch does: a graph that saved one of them
// then refuses to use it in backward ("modified by an inplace operation") instead of reading the
// stepped values.
void bump_versions(const StepArgs& a) {
  for (const auto* list : {&a.params, &a.counters, &a.state})
    for (const at::Tensor& t : *list)
      if (t.defined()) t.unsafeGetTensorImpl()->bump_version();
}

}  // namespace

void check_lr(double lr, const char* who) { check_value(lr, kernels::kLrRange, who, "lr"); }

void check_step_config(const kernels::StepConfig& c, const char* who) {
#define LOWBIT_CHECK_RANGE(type, name, default_value, range)                                               \
  TORCH_CHECK(kernels::in_range(kernels::HyperRange::range, static_cast<double>(c.name)), who, ": " #name " must be ", \
              kernels::range_text(kernels::HyperRange::range), ", got ", c.name);
  LOWBIT_STEP_HYPER_PARAMETERS(LOWBIT_CHECK_RANGE)
#undef LOWBIT_CHECK_RANGE
  // torch.optim.SGD's rule: Nesterov's look-ahead needs a momentum buffer that is not dampened.
  TORCH_CHECK(!c.nesterov || (c.momentum > 0 && c.dampening == 0), who,
              ": nesterov needs momentum > 0 and dampening 0, got momentum ", c.momentum, " and dampening ", c.dampening);
}

StepCall check_step_call(const StepArgs& a, const char* op) {
  StepCall c;
  static_cast<StepScalars&>(c) = a;
  const kernels::StepConfig& k = a.config;
  check_step_config(k, op);

  const int64_t n = static_cast<int64_t>(a.params.size());
  const auto check_len = [&](size_t got, const char* what) {
    TORCH_CHECK(static_cast<int64_t>(got) == n, op, ": ", what, " has ", got, " entries for ", n, " parameters");
  };
  check_len(a.grads.size(), "grads");
  check_len(a.counters.size(), "counters");
  if (!a.offsets.empty()) check_len(a.offsets.size(), "offsets");
  if (!a.rng_keys.empty()) check_len(a.rng_keys.size(), "rng_keys");

  // The state layout.
  TORCH_CHECK(a.slots.size() <= static_cast<size_t>(kernels::kMaxSlots), op, ": slots has ", a.slots.size(),
              " entries; at most ", kernels::kMaxSlots);
  const kernels::RuleSlots rs = kernels::rule_slots(k);
  int tensors_per_param = 0;
  const kernels::SlotType* first_quant = nullptr;
  bool correction = false;
  for (size_t s = 0; s < a.slots.size(); ++s) {
    c.slots[s] = a.slots[s];
    if (a.slots[s].storage == kernels::SlotStorage::None) continue;
    // The master-weight correction: only in its own slot, and nothing else there.
    const bool corr_slot = static_cast<int>(s) == kernels::kCorrectionSlot;
    TORCH_CHECK(corr_slot == kernels::is_correction(a.slots[s].storage), op, ": slot ", s, " is ",
                slot_type_name(a.slots[s]), "; ",
                corr_slot ? "the last slot holds only a master-weight correction (int16_correction or int8_correction)"
                          : "a master-weight correction goes in the last slot only");
    if (corr_slot) {
      correction = true;
      c.num_slots = static_cast<int>(s) + 1;
      tensors_per_param += 1;
      continue;
    }
    TORCH_CHECK(static_cast<int>(s) < rs.count && rs.used[s], op, ": slot ", s, " (", slot_type_name(a.slots[s]),
                ") is not a state of ", kernels::rule_name(k.rule), " with these options");
    TORCH_CHECK(a.slots[s].storage != kernels::SlotStorage::Quant || !rs.is_signed[s] ||
                    format_is_signed(a.slots[s].format),
                op, ": slot ", s, " (", rs.names[s], ") of ", kernels::rule_name(k.rule), " holds signed values; ",
                slot_type_name(a.slots[s]), " is an unsigned format");
    c.num_slots = static_cast<int>(s) + 1;
    const bool quant = a.slots[s].storage == kernels::SlotStorage::Quant;
    tensors_per_param += quant ? 2 : 1;
    if (quant && !first_quant) first_quant = &c.slots[s];
  }
  for (int s = 0; s < rs.count; ++s)
    TORCH_CHECK(!rs.used[s] || (static_cast<size_t>(s) < a.slots.size() && c.slots[s].storage != kernels::SlotStorage::None),
                op, ": ", kernels::rule_name(k.rule), " needs slot ", s, " (", rs.names[s], "); slots has ",
                s < static_cast<int>(a.slots.size()) ? "none" : "no entry", " there");
  TORCH_CHECK(static_cast<int64_t>(a.state.size()) == n * tensors_per_param, op, ": state has ", a.state.size(),
              " tensors; ", n, " parameter(s) with ", tensors_per_param, " state tensors each (slots ",
              slot_list(a.slots), ") need ", n * tensors_per_param);
  c.block_size = a.block_size;
  if (first_quant) {
    if (c.block_size == 0) c.block_size = default_block_size(first_quant->format);
    TORCH_CHECK(is_valid_block_size(c.block_size), op, ": block_size is ", a.block_size,
                "; quantized state needs 0 (the format's default) or a power of two in [", kMinBlockSize, ", ",
                kMaxBlockSize, "]");
  } else {
    if (c.block_size == 0) c.block_size = 1024;
    TORCH_CHECK(c.block_size >= 16 && c.block_size % 16 == 0 && c.block_size <= (int64_t(1) << 20), op,
                ": block_size is ", a.block_size, "; dense state needs 0 or a multiple of 16 up to 2^20");
  }

  TORCH_CHECK(!(correction && a.stochastic_round), op, ": stochastic_round and a master-weight correction (",
              slot_type_name(c.slots[kernels::kCorrectionSlot]),
              ") exclude each other: the correction keeps what rounding to bf16 drops");
  if (n == 0) return c;

  const at::Device device = a.params[0].device();
  check_scalar(a.lr, "lr", device, {at::kDouble, at::kFloat}, op);
  if (a.found_inf) check_scalar(*a.found_inf, "found_inf", device, {at::kFloat}, op);
  if (a.grad_sumsq) check_scalar(*a.grad_sumsq, "grad_sumsq", device, {at::kDouble}, op);
  if (a.grad_scale) check_scalar(*a.grad_scale, "grad_scale", device, {at::kFloat}, op);
  TORCH_CHECK(std::isfinite(a.max_grad_norm) && a.max_grad_norm >= 0, op, ": max_grad_norm must be finite and >= 0, got ",
              a.max_grad_norm);
  TORCH_CHECK(a.max_grad_norm == 0 || a.grad_sumsq, op, ": max_grad_norm ", a.max_grad_norm,
              " needs grad_sumsq (the squared norm of the gradients to clip)");
  if (a.lamb_norms) {
    const at::Tensor& t = *a.lamb_norms;
    TORCH_CHECK(t.scalar_type() == at::kDouble && t.dim() == 2 && t.size(0) == n && t.size(1) == 2, op,
                ": lamb_norms must be float64 [", n, ", 2], got ", t.scalar_type(), " ", t.sizes());
    TORCH_CHECK(t.device() == device, op, ": lamb_norms is on ", t.device(), " but the parameters on ", device);
  }
  if (device.is_cpu()) {
    check_value(a.lr.item<double>(), kernels::kLrRange, op, "lr");
    // A skipped call reads no other value (the sums of non-finite gradients are NaN).
    if (!a.found_inf || a.found_inf->item<float>() == 0.0f) {
      if (a.grad_scale) check_value(a.grad_scale->item<double>(), kernels::kGradScaleRange, op, "grad_scale");
      if (a.grad_sumsq)
        check_value(a.grad_sumsq->item<double>(), kernels::kGradSumsqRange, op, "grad_sumsq",
                    " (to skip the step of non-finite gradients, pass found_inf)");
      if (a.lamb_norms) {
        const at::Tensor norms = a.lamb_norms->contiguous();
        const double* v = norms.const_data_ptr<double>();
        for (int64_t k = 0; k < 2 * n; ++k)
          TORCH_CHECK(kernels::in_range(kernels::kLambNormRange, v[k]), op, ": lamb_norms[", k / 2, "][", k % 2,
                      "] must be ", kernels::range_text(kernels::kLambNormRange), ", got ", v[k]);
      }
    }
  }

  c.params.resize(n);
  c.refs.resize(n);
  size_t next = 0;
  // Only the step writes; optim_lamb_norms reads (the sharded optimizer passes it one scratch
  // counter for every parameter).
  OutputRanges outputs(std::string(op) != "lowbit::optim_lamb_norms", a.params.size() * 2 + a.state.size(), op);
  for (int64_t i = 0; i < n; ++i) {
    StepParam& p = c.params[i];
    kernels::StepParamRef& r = c.refs[i];
    const at::Tensor& param = a.params[i];
    const at::Tensor& grad = a.grads[i];
    const at::Tensor& counters = a.counters[i];
    p.param = &param;
    p.grad = &grad;
    p.counters = &counters;
    const int64_t numel = param.numel();
    r.numel = numel;
    p.param_type = param.scalar_type();
    p.grad_type = grad.scalar_type();
    p.param_contiguous = param.is_contiguous();
    TORCH_CHECK(param.device() == device, op, ": parameter ", i, " is on ", param.device(), ", parameter 0 on ",
                device, "; one call steps parameters of one device");
    TORCH_CHECK(param.layout() == at::kStrided && grad.layout() == at::kStrided, op, ": parameter ", i,
                " has layout ", param.layout(), " and its gradient ", grad.layout(),
                "; the step needs dense (strided) tensors");
    TORCH_CHECK(is_float_type(p.param_type), op, ": parameter ", i, " has dtype ", p.param_type,
                "; supported: float32, bfloat16, float16");
    TORCH_CHECK(is_float_type(p.grad_type), op, ": the gradient of parameter ", i, " has dtype ", p.grad_type,
                "; supported: float32, bfloat16, float16");
    TORCH_CHECK(grad.sizes() == param.sizes(), op, ": parameter ", i, " has shape ", param.sizes(),
                " but its gradient ", grad.sizes());
    TORCH_CHECK(grad.device() == device, op, ": parameter ", i, " is on ", device, " but its gradient on ",
                grad.device());
    TORCH_CHECK(counters.scalar_type() == at::kLong && counters.numel() == 2 && counters.is_contiguous(), op,
                ": counters[", i, "] must be a contiguous int64 tensor of 2 elements (steps, overflowed blocks), got ",
                counters.scalar_type(), " ", counters.sizes());
    TORCH_CHECK(counters.device() == device, op, ": counters[", i, "] is on ", counters.device(),
                " but the parameter on ", device);
    if (device.is_cpu()) {
      const int64_t* cv = counters.const_data_ptr<int64_t>();
      TORCH_CHECK(cv[0] >= 0 && cv[0] < kernels::kMaxStepCount - 1, op, ": counters[", i, "][0] (steps taken) is ",
                  cv[0], "; must be in [0, 2^53 - 1)");
      TORCH_CHECK(cv[1] >= 0, op, ": counters[", i, "][1] (state blocks that overflowed) is ", cv[1],
                  "; must be >= 0");
    }
    TORCH_CHECK(!param.requires_grad() || param.is_leaf(), op, ": parameter ", i,
                " is not a leaf of the autograd graph (it is computed from other tensors); step the tensor it "
                "comes from");
    r.param = outputs.address(param);
    r.counters = static_cast<int64_t*>(outputs.address(counters));
    if (!grad.is_meta() && numel > 0 && grad.is_contiguous()) r.grad = grad.const_data_ptr();
    r.grad_type = elem_type(p.grad_type);
    outputs.add(param, r.param, OutputRanges::kParam, static_cast<int>(i));
    outputs.add(counters, r.counters, OutputRanges::kCounters, static_cast<int>(i));
    r.offset = a.offsets.empty() ? 0 : a.offsets[i];
    r.rng_key = a.rng_keys.empty() ? 0 : a.rng_keys[i];
    TORCH_CHECK(r.offset >= 0 && r.offset <= std::numeric_limits<int64_t>::max() - numel, op, ": offsets[", i,
                "] is ", r.offset, "; must be >= 0, and the parameter's last element (offset + ", numel,
                ") an int64");
    TORCH_CHECK(!first_quant || r.offset % c.block_size == 0, op, ": offsets[", i, "] is ", r.offset,
                ", not a multiple of block_size ", c.block_size, ": a shard must start on a quantization block");
    for (int s = 0; s < c.num_slots; ++s) {
      const kernels::SlotType& t = c.slots[s];
      if (t.storage == kernels::SlotStorage::None) continue;
      void** data_of_slot = s < kernels::kMomentSlots ? &r.slot[s] : &r.correction;
      const auto take = [&](const char* what, OutputRanges::Kind kind, void** data) -> const at::Tensor* {
        const at::Tensor& x = a.state[next++];
        TORCH_CHECK(x.device() == device, op, ": the ", what, " of slot ", s, " of parameter ", i, " is on ",
                    x.device(), " but the parameter on ", device);
        TORCH_CHECK(x.layout() == at::kStrided, op, ": the ", what, " of slot ", s, " of parameter ", i, " has layout ",
                    x.layout(), "; state tensors are dense");
        TORCH_CHECK(x.is_contiguous(), op, ": the ", what, " of slot ", s, " of parameter ", i, " is not contiguous");
        *data = outputs.address(x);
        outputs.add(x, *data, kind, static_cast<int>(i), s);
        return &x;
      };
      if (t.storage != kernels::SlotStorage::Quant) {  // dense values or a master-weight correction
        const bool corr = kernels::is_correction(t.storage);
        p.values[s] = take(corr ? "correction" : "values", OutputRanges::kValues, data_of_slot);
        const at::ScalarType want = corr ? (t.storage == kernels::SlotStorage::Int16 ? at::kShort : at::kChar)
                                         : (t.storage == kernels::SlotStorage::F32 ? at::kFloat : at::kBFloat16);
        TORCH_CHECK(!corr || p.param_type == at::kBFloat16, op, ": parameter ", i, " has dtype ", p.param_type,
                    "; a master-weight correction (", slot_type_name(t), ") needs bfloat16 parameters");
        const at::Tensor& v = *p.values[s];
        TORCH_CHECK(v.scalar_type() == want && v.numel() == numel, op, ": ",
                    corr ? std::string("the correction") : "slot " + std::to_string(s), " of parameter ", i, " (",
                    slot_type_name(t), ") must be ", want, " with ", numel, " elements, got ", v.scalar_type(),
                    " with ", v.numel());
        continue;
      }
      p.codes[s] = take("codes", OutputRanges::kCodes, data_of_slot);
      void* absmax = nullptr;
      p.absmax[s] = take("absmax", OutputRanges::kAbsmax, &absmax);
      if (s < kernels::kMomentSlots) r.absmax[s] = static_cast<float*>(absmax);
      const at::Tensor& codes = *p.codes[s];
      const at::Tensor& scales = *p.absmax[s];
      TORCH_CHECK(codes.scalar_type() == at::kByte && codes.numel() == code_bytes(t.format, numel), op, ": slot ", s,
                  " of parameter ", i, " (", format_name(t.format), ") needs ", code_bytes(t.format, numel),
                  " uint8 codes, got ", codes.numel(), " of ", codes.scalar_type());
      TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.numel() == num_blocks(numel, c.block_size), op,
                  ": slot ", s, " of parameter ", i, " needs ", num_blocks(numel, c.block_size),
                  " float32 absmax values (block ", c.block_size, "), got ", scales.numel(), " of ",
                  scales.scalar_type());
    }
  }
  outputs.check();
  for (int64_t i = 0; i < n; ++i) outputs.check_gradient(a.grads[i], static_cast<int>(i));
  if (outputs.enabled()) bump_versions(a);
  return c;
}

void check_grad_check_args(at::TensorList grads, at::IntArrayRef groups, int64_t num_groups) {
  const char* op = "lowbit::grad_check";
  TORCH_CHECK(groups.size() == grads.size(), op, ": groups has ", groups.size(), " entries for ", grads.size(),
              " gradients");
  TORCH_CHECK(num_groups >= 0, op, ": num_groups must be >= 0, got ", num_groups);
  for (size_t i = 0; i < grads.size(); ++i) {
    TORCH_CHECK(grads[i].device() == grads[0].device(), op, ": gradient ", i, " is on ", grads[i].device(),
                ", gradient 0 on ", grads[0].device());
    TORCH_CHECK(is_float_type(grads[i].scalar_type()), op, ": gradient ", i, " has dtype ", grads[i].scalar_type(),
                "; supported: float32, bfloat16, float16");
    TORCH_CHECK(groups[i] >= 0 && groups[i] < num_groups, op, ": groups[", i, "] is ", groups[i], "; must be in [0, ",
                num_groups, ")");
  }
}

void check_lamb_add_block_sums_args(const at::Tensor& block_sums, at::IntArrayRef first, at::IntArrayRef count) {
  const char* op = "lowbit::lamb_add_block_sums";
  TORCH_CHECK(block_sums.defined() && block_sums.scalar_type() == at::kDouble && block_sums.dim() == 2 &&
                  block_sums.size(1) == 2 && block_sums.is_contiguous(),
              op, ": block_sums must be a contiguous float64 tensor [blocks, 2], got ",
              block_sums.defined() ? c10::str(block_sums.scalar_type(), " ", block_sums.sizes()) : "undefined");
  TORCH_CHECK(first.size() == count.size(), op, ": first has ", first.size(), " entries, count ", count.size());
  const int64_t blocks = block_sums.size(0);
  for (size_t i = 0; i < first.size(); ++i)
    TORCH_CHECK(first[i] >= 0 && count[i] >= 0 && first[i] <= blocks - count[i], op, ": range ", i, " (first ",
                first[i], ", count ", count[i], ") is not inside the ", blocks, " blocks");
}

at::Tensor lamb_add_block_sums_host(const at::Tensor& block_sums, at::IntArrayRef first, at::IntArrayRef count) {
  check_lamb_add_block_sums_args(block_sums, first, count);
  const at::Tensor host = block_sums.cpu();
  const double* s = host.const_data_ptr<double>();
  at::Tensor out = at::empty({static_cast<int64_t>(first.size()), 2}, at::kDouble);
  double* o = out.data_ptr<double>();
  for (size_t i = 0; i < first.size(); ++i) kernels::lamb_add_block_sum_pairs(s + 2 * first[i], count[i], o + 2 * i);
  return out.to(block_sums.device());
}

bool call_skipped(const StepCall& c) { return c.found_inf && c.found_inf->item<float>() != 0.0f; }

float call_grad_multiplier(const StepCall& c) {
  const double sumsq = c.grad_sumsq ? c.grad_sumsq->item<double>() : 0.0;
  const double scale = c.grad_scale ? static_cast<double>(c.grad_scale->item<float>()) : 1.0;
  return kernels::grad_multiplier(c.grad_sumsq ? c.max_grad_norm : 0.0, sumsq, scale);
}

double call_lr(const StepCall& c) {
  return c.lr.scalar_type() == at::kDouble ? c.lr.item<double>() : static_cast<double>(c.lr.item<float>());
}

}  // namespace ops
}  // namespace lowbit
