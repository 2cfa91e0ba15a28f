// StepArgs <-> the dispatcher's stack, for optim_step_ / optim_lamb_norms (optim_step_boxed.h), and
// the calls through the dispatcher that the optimizers use (optim_ops.h).
#include "optim_step_boxed.h"

#include <c10/util/Exception.h>

namespace lowbit {
namespace ops {

namespace {

// The schema's spelling of a hyper-parameter's type and of its default (the table's C++ literal).
const char* schema_type(double) { return "float"; }
const char* schema_type(int64_t) { return "int"; }
const char* schema_type(bool) { return "bool"; }
std::string schema_literal(const char* cpp) {
  const std::string s = cpp;
  return s == "false" ? "False" : s == "true" ? "True" : s;
}

}  // namespace

std::string step_arguments() {
  std::string hyper;
#define LOWBIT_SCHEMA_ARG(type, name, default_value, range) \
  hyper += std::string(", ") + schema_type(type{}) + " " #name "=" + schema_literal(#default_value);
  LOWBIT_STEP_HYPER_PARAMETERS(LOWBIT_SCHEMA_ARG)
#undef LOWBIT_SCHEMA_ARG
  return "(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] state, Tensor(c!)[] counters, Tensor lr, *, str rule, "
         "str[] slots, int block_size=0" +
         hyper +
         ", int[] offsets=[], int[] rng_keys=[], int seed=0, bool stochastic_round=False, Tensor? found_inf=None, "
         "Tensor? grad_sumsq=None, float max_grad_norm=0.0, Tensor? grad_scale=None, Tensor? lamb_norms=None, "
         "bool scalar_loop=False)";
}

std::vector<std::string> hyper_parameter_names() {
  return {
#define LOWBIT_HYPER_NAME(type, name, default_value, range) #name,
      LOWBIT_STEP_HYPER_PARAMETERS(LOWBIT_HYPER_NAME)
#undef LOWBIT_HYPER_NAME
  };
}

namespace {

kernels::Rule parse_rule(const std::string& name) {
  for (int i = 0; i < kernels::kNumRules; ++i) {
    const auto r = static_cast<kernels::Rule>(i);
    if (ascii_lower(kernels::rule_name(r)) == ascii_lower(name)) return r;
  }
  std::string all;
  for (int i = 0; i < kernels::kNumRules; ++i) all += std::string(i ? ", " : "") + kernels::rule_name(static_cast<kernels::Rule>(i));
  TORCH_CHECK(false, "lowbit::optim_step_: unknown rule '", name, "'; expected one of ", all);
}

// The list's tensors, moved out where the stack holds the only reference to the list (the
// optimizers' calls: no reference count touched per tensor), copied otherwise.
std::vector<at::Tensor> take_tensors(c10::IValue& v) {
  c10::List<at::Tensor> list = std::move(v).toTensorList();
  if (list.use_count() != 1) return list.vec();
  std::vector<at::Tensor> out;
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) out.push_back(list.extract(i));
  return out;
}

}  // namespace

StepArgs pop_step_args(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  const size_t base = stack->size() - n;
  const auto arg = [&](const char* name) -> c10::IValue& {
    const auto i = schema.argumentIndexWithName(name);
    TORCH_INTERNAL_ASSERT(i.has_value(), "lowbit: no argument ", name, " in ", schema.name());
    return (*stack)[base + *i];
  };
  StepArgs a;
  a.params = take_tensors(arg("params"));
  a.grads = take_tensors(arg("grads"));
  a.state = take_tensors(arg("state"));
  a.counters = take_tensors(arg("counters"));
  a.lr = arg("lr").toTensor();
  kernels::StepConfig& c = a.config;
  c.rule = parse_rule(arg("rule").toStringRef());
  for (const c10::IValue& s : arg("slots").toListRef()) {
    kernels::SlotType t;
    TORCH_CHECK(parse_slot_type(s.toStringRef(), &t), "lowbit::optim_step_: unknown slot storage '",
                s.toStringRef(), "' in slots; expected none, fp32, bf16 or one of ", all_format_names());
    a.slots.push_back(t);
  }
  a.block_size = arg("block_size").toInt();
#define LOWBIT_PARSE_ARG(type, name, default_value, range) c.name = arg(#name).to<type>();
  LOWBIT_STEP_HYPER_PARAMETERS(LOWBIT_PARSE_ARG)
#undef LOWBIT_PARSE_ARG
  a.offsets = arg("offsets").toIntVector();
  a.rng_keys = arg("rng_keys").toIntVector();
  a.seed = static_cast<uint64_t>(arg("seed").toInt());
  a.stochastic_round = arg("stochastic_round").toBool();
  a.found_inf = arg("found_inf").toOptional<at::Tensor>();
  a.grad_sumsq = arg("grad_sumsq").toOptional<at::Tensor>();
  a.max_grad_norm = arg("max_grad_norm").toDouble();
  a.grad_scale = arg("grad_scale").toOptional<at::Tensor>();
  a.lamb_norms = arg("lamb_norms").toOptional<at::Tensor>();
  a.scalar_loop = arg("scalar_loop").toBool();
  torch::jit::drop(*stack, n);
  return a;
}

namespace {

// Pushes a's values in the schema's order, moving its tensor lists.
torch::jit::Stack step_stack(const c10::OperatorHandle& op, StepArgs&& a) {
  const c10::FunctionSchema& schema = op.schema();
  torch::jit::Stack stack(schema.arguments().size());
  const auto set = [&](const char* name, c10::IValue v) { stack[*schema.argumentIndexWithName(name)] = std::move(v); };
  const auto opt = [](const std::optional<at::Tensor>& t) { return t ? c10::IValue(*t) : c10::IValue(); };
  const kernels::StepConfig& c = a.config;
  std::vector<std::string> slots;
  for (const auto& t : a.slots) slots.push_back(slot_type_name(t));
  set("params", std::move(a.params));
  set("grads", std::move(a.grads));
  set("state", std::move(a.state));
  set("counters", std::move(a.counters));
  set("lr", a.lr);
  set("rule", std::string(kernels::rule_name(c.rule)));
  set("slots", c10::List<std::string>(slots));
  set("block_size", a.block_size);
#define LOWBIT_PUSH_ARG(type, name, default_value, range) set(#name, c.name);
  LOWBIT_STEP_HYPER_PARAMETERS(LOWBIT_PUSH_ARG)
#undef LOWBIT_PUSH_ARG
  set("offsets", a.offsets);
  set("rng_keys", a.rng_keys);
  set("seed", static_cast<int64_t>(a.seed));
  set("stochastic_round", a.stochastic_round);
  set("found_inf", opt(a.found_inf));
  set("grad_sumsq", opt(a.grad_sumsq));
  set("max_grad_norm", a.max_grad_norm);
  set("grad_scale", opt(a.grad_scale));
  set("lamb_norms", opt(a.lamb_norms));
  set("scalar_loop", a.scalar_loop);
  return stack;
}

c10::OperatorHandle find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

}  // namespace

void optim_step(StepArgs a, bool reference) {
  static const c10::OperatorHandle fused = find_op("lowbit::optim_step_");
  static const c10::OperatorHandle oracle = find_op("lowbit::optim_step_reference_");
  const c10::OperatorHandle& op = reference ? oracle : fused;
  torch::jit::Stack stack = step_stack(op, std::move(a));
  op.callBoxed(&stack);
}

at::Tensor optim_lamb_norms(StepArgs a, bool reference) {
  static const c10::OperatorHandle fused = find_op("lowbit::optim_lamb_norms");
  static const c10::OperatorHandle oracle = find_op("lowbit::optim_lamb_norms_reference");
  const c10::OperatorHandle& op = reference ? oracle : fused;
  torch::jit::Stack stack = step_stack(op, std::move(a));
  op.callBoxed(&stack);
  return stack.back().toTensor();
}

at::Tensor lamb_add_block_sums(const at::Tensor& block_sums, at::IntArrayRef first, at::IntArrayRef count) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lowbit::lamb_add_block_sums", "")
                             .typed<at::Tensor(const at::Tensor&, at::IntArrayRef, at::IntArrayRef)>();
  return op.call(block_sums, first, count);
}

std::tuple<at::Tensor, at::Tensor> grad_check(at::TensorList grads, at::IntArrayRef groups, int64_t num_groups,
                                              bool want_sumsq) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lowbit::grad_check", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(at::TensorList, at::IntArrayRef, int64_t, bool)>();
  return op.call(grads, groups, num_groups, want_sumsq);
}

}  // namespace ops
}  // namespace lowbit
