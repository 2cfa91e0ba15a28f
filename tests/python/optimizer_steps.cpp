// For the Python tests: runs a C++ lowbit optimizer over what a file written by torch.save describes and
// writes what it ends with, so Python can compare its optimizer classes (and raw op calls) with it bit for bit.
//   lowbit_optimizer_steps IN OUT
// IN (a dict):
//   rule     "Adam", "AdamW", "SGD", "Lion", "RMSprop", "Adagrad", "AdEMAMix" or "LAMB"
//   groups   per param group, a dict of options by their C++ (and torch.optim) names: lr, betas (a tuple),
//            eps, weight_decay, amsgrad, maximize, momentum, dampening, nesterov, alpha, centered, lr_decay,
//            initial_accumulator_value, t_alpha_beta3, state_format ("Q8", ...), block_size,
//            min_quant_numel, bf16_stochastic_round, max_grad_norm, skip_nonfinite, fp8_second_moment
//            ("FP8E4M3" / "FP8E5M2"), master_weight_bits; absent ones keep the Options' defaults
//   params   per group, the parameters' starting values
//   grads    per step, per group, per parameter: its gradient, or None (no gradient this step)
//   lrs      (optional) per step, per group: the lr set before that step (set_lr, as a scheduler does)
// OUT (a dict): params (flat, in group order), state (per parameter: the op's state list, codes then
// absmax per quantized slot; empty where no state was made), counters (per parameter; None where no
// state), skipped (steps skipped for non-finite gradients). IN may also be a list of such dicts: OUT is
// then the list of their results (one process, libtorch loaded once, for many small cases).
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include <lowbit/lowbit.h>
#include <lowbit/tools/program_args.h>

namespace {

using Dict = c10::Dict<c10::IValue, c10::IValue>;

bool has(const Dict& d, const char* key) { return d.contains(key); }
double real(const Dict& d, const char* key) { return d.at(key).toScalar().toDouble(); }
int64_t integer(const Dict& d, const char* key) { return d.at(key).toInt(); }
bool boolean(const Dict& d, const char* key) { return d.at(key).toBool(); }
std::vector<double> tuple(const Dict& d, const char* key) {
  std::vector<double> out;
  for (const auto& v : d.at(key).toTupleRef().elements()) out.push_back(v.toScalar().toDouble());
  return out;
}

// The options every lowbit optimizer shares (optim/options.h LOWBIT_COMMON_ARGS).
template <typename O>
void common(O& o, const Dict& d) {
  if (has(d, "lr")) o.lr(real(d, "lr"));
  if (has(d, "state_format")) {
    lowbit::StateFormat f;
    TORCH_CHECK(lowbit::parse_state_format(d.at("state_format").toStringRef(), &f), "bad state_format");
    o.state_format(f);
  }
  if (has(d, "block_size")) o.block_size(integer(d, "block_size"));
  if (has(d, "min_quant_numel")) o.min_quant_numel(integer(d, "min_quant_numel"));
  if (has(d, "bf16_stochastic_round")) o.bf16_stochastic_round(boolean(d, "bf16_stochastic_round"));
  if (has(d, "max_grad_norm")) o.max_grad_norm(real(d, "max_grad_norm"));
  if (has(d, "skip_nonfinite")) o.skip_nonfinite(boolean(d, "skip_nonfinite"));
  if (has(d, "fp8_second_moment")) o.fp8_second_moment(lowbit::format_from_name(d.at("fp8_second_moment").toStringRef()));
  if (has(d, "master_weight_bits")) o.master_weight_bits(integer(d, "master_weight_bits"));
}

template <typename O>
void eps(O& o, const Dict& d) {
  if (has(d, "eps")) o.eps(real(d, "eps"));
}

template <typename O>
void weight_decay_and_maximize(O& o, const Dict& d) {
  if (has(d, "weight_decay")) o.weight_decay(real(d, "weight_decay"));
  if (has(d, "maximize")) o.maximize(boolean(d, "maximize"));
}

template <typename O>
void two_betas(O& o, const Dict& d) {
  if (has(d, "betas")) {
    const auto b = tuple(d, "betas");
    o.betas(std::make_tuple(b.at(0), b.at(1)));
  }
}

std::unique_ptr<torch::optim::OptimizerOptions> options(const std::string& rule, const Dict& d) {
  namespace lo = lowbit::optim;
  if (rule == "Adam" || rule == "AdamW") {
    auto make = [&](auto o) -> std::unique_ptr<torch::optim::OptimizerOptions> {
      common(o, d);
      eps(o, d);
      two_betas(o, d);
      weight_decay_and_maximize(o, d);
      if (has(d, "amsgrad")) o.amsgrad(boolean(d, "amsgrad"));
      return std::make_unique<decltype(o)>(o);
    };
    return rule == "Adam" ? make(lo::AdamOptions()) : make(lo::AdamWOptions());
  }
  if (rule == "SGD") {
    lo::SGDOptions o(1e-3);
    common(o, d);
    if (has(d, "momentum")) o.momentum(real(d, "momentum"));
    if (has(d, "dampening")) o.dampening(real(d, "dampening"));
    if (has(d, "nesterov")) o.nesterov(boolean(d, "nesterov"));
    weight_decay_and_maximize(o, d);
    return std::make_unique<lo::SGDOptions>(o);
  }
  if (rule == "Lion") {
    lo::LionOptions o;
    common(o, d);
    two_betas(o, d);
    weight_decay_and_maximize(o, d);
    return std::make_unique<lo::LionOptions>(o);
  }
  if (rule == "RMSprop") {
    lo::RMSpropOptions o;
    common(o, d);
    eps(o, d);
    weight_decay_and_maximize(o, d);
    if (has(d, "alpha")) o.alpha(real(d, "alpha"));
    if (has(d, "momentum")) o.momentum(real(d, "momentum"));
    if (has(d, "centered")) o.centered(boolean(d, "centered"));
    return std::make_unique<lo::RMSpropOptions>(o);
  }
  if (rule == "Adagrad") {
    lo::AdagradOptions o;
    common(o, d);
    eps(o, d);
    weight_decay_and_maximize(o, d);
    if (has(d, "lr_decay")) o.lr_decay(real(d, "lr_decay"));
    if (has(d, "initial_accumulator_value")) o.initial_accumulator_value(real(d, "initial_accumulator_value"));
    return std::make_unique<lo::AdagradOptions>(o);
  }
  if (rule == "AdEMAMix") {
    lo::AdEMAMixOptions o;
    common(o, d);
    eps(o, d);
    weight_decay_and_maximize(o, d);
    if (has(d, "betas")) {
      const auto b = tuple(d, "betas");
      o.betas(std::make_tuple(b.at(0), b.at(1), b.at(2)));
    }
    if (has(d, "alpha")) o.alpha(real(d, "alpha"));
    if (has(d, "t_alpha_beta3")) o.t_alpha_beta3(integer(d, "t_alpha_beta3"));
    return std::make_unique<lo::AdEMAMixOptions>(o);
  }
  if (rule == "LAMB") {
    lo::LAMBOptions o;
    common(o, d);
    eps(o, d);
    two_betas(o, d);
    weight_decay_and_maximize(o, d);
    return std::make_unique<lo::LAMBOptions>(o);
  }
  TORCH_CHECK(false, "lowbit_optimizer_steps: unknown rule ", rule);
}

std::unique_ptr<lowbit::optim::LowbitOptimizer> make(const std::string& rule,
                                                     std::vector<torch::optim::OptimizerParamGroup> groups) {
  namespace lo = lowbit::optim;
  // The constructors want defaults; every group carries its own options, so they only fill the gaps.
  if (rule == "Adam") return std::make_unique<lo::Adam>(std::move(groups));
  if (rule == "AdamW") return std::make_unique<lo::AdamW>(std::move(groups));
  if (rule == "SGD") return std::make_unique<lo::SGD>(std::move(groups), lo::SGDOptions(1e-3));
  if (rule == "Lion") return std::make_unique<lo::Lion>(std::move(groups));
  if (rule == "RMSprop") return std::make_unique<lo::RMSprop>(std::move(groups));
  if (rule == "Adagrad") return std::make_unique<lo::Adagrad>(std::move(groups));
  if (rule == "AdEMAMix") return std::make_unique<lo::AdEMAMix>(std::move(groups));
  if (rule == "LAMB") return std::make_unique<lo::LAMB>(std::move(groups));
  TORCH_CHECK(false, "lowbit_optimizer_steps: unknown rule ", rule);
}

// Runs one spec (a dict, as the header says) and returns its results.
c10::IValue run(const Dict& spec) {
  const std::string rule = spec.at("rule").toStringRef();
  const auto group_options = spec.at("groups").toList();
  const auto group_params = spec.at("params").toList();

  std::vector<torch::optim::OptimizerParamGroup> groups;
  std::vector<std::vector<at::Tensor>> params;
  for (size_t g = 0; g < group_options.size(); ++g) {
    std::vector<at::Tensor> ps;
    for (const c10::IValue& p : group_params.get(g).toList().vec()) ps.push_back(p.toTensor().clone());
    params.push_back(ps);
    groups.emplace_back(ps, options(rule, group_options.get(g).toGenericDict()));
  }
  auto opt = make(rule, std::move(groups));

  const auto steps = spec.at("grads").toList();
  const bool with_lrs = spec.contains("lrs");
  for (size_t s = 0; s < steps.size(); ++s) {
    const auto step_grads = steps.get(s).toList();
    for (size_t g = 0; g < params.size(); ++g) {
      if (with_lrs) opt->param_groups()[g].options().set_lr(spec.at("lrs").toList().get(s).toList().get(g).toDouble());
      const auto grads = step_grads.get(g).toList();
      for (size_t i = 0; i < params[g].size(); ++i) {
        const c10::IValue grad = grads.get(i);
        params[g][i].mutable_grad() = grad.isNone() ? at::Tensor() : grad.toTensor();
      }
    }
    opt->step();
  }

  c10::List<at::Tensor> out_params;
  c10::impl::GenericList out_state(c10::ListType::ofTensors());
  c10::impl::GenericList out_counters(c10::OptionalType::ofTensor());
  for (const auto& ps : params) {
    for (const at::Tensor& p : ps) {
      out_params.push_back(p);
      c10::List<at::Tensor> state;
      const lowbit::optim::ParamState* st = opt->state_of(p);
      if (st) {
        for (const auto& slot : st->slots) {
          if (slot.type.storage == lowbit::kernels::SlotStorage::Quant) {
            state.push_back(slot.quantized.codes());
            state.push_back(slot.quantized.absmax());
          } else if (slot.defined()) {
            state.push_back(slot.dense);
          }
        }
      }
      out_counters.push_back(st ? c10::IValue(st->counters) : c10::IValue());
      out_state.push_back(state);
    }
  }
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  out.insert(std::string("params"), out_params);
  out.insert(std::string("state"), out_state);
  out.insert(std::string("counters"), out_counters);
  out.insert(std::string("skipped"), opt->skipped_steps());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage =
      "usage: lowbit_optimizer_steps IN OUT\n"
      "Runs the optimizer steps IN describes (tests/python) and writes the results to OUT.\n";
  if (lowbit_tools::wants_help(argc, argv, usage)) return 0;
  if (argc != 3) {
    std::cerr << usage;
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const c10::IValue specs = torch::pickle_load(bytes);
  c10::IValue out;
  if (specs.isList()) {  // many specs in one process: the tests' many small cases load libtorch once
    c10::impl::GenericList results(c10::AnyType::get());
    for (const c10::IValue& spec : specs.toList().vec()) results.push_back(run(spec.toGenericDict()));
    out = results;
  } else {
    out = run(specs.toGenericDict());
  }
  const std::vector<char> data = torch::pickle_save(out);
  std::ofstream(argv[2], std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  return 0;
}
