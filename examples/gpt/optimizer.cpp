// lowbit's optimizers and ATen's fused AdamW behind TrainOptimizer.
#include "optimizer.h"

#include <lowbit/lowbit.h>

#include <optional>
#include <sstream>

#include "parallel.h"

namespace gpt {

namespace {

namespace lo = lowbit::optim;

// ---- lowbit ---------------------------------------------------------------------------------------

// The archive bench_state_error --moments reads: "step", "beta1", "beta2", "eps" (float64 [1]),
// "count" (int64 [1]), then "m<i>" and "v<i>" (fp32, CPU) for every parameter with two moments.
void write_moments(const std::string& path, const lo::LowbitOptimizer& opt, const std::vector<at::Tensor>& params,
                   int64_t step, double beta1, double beta2, double eps) {
  torch::serialize::OutputArchive ar;
  const auto scalar = [](double x) { return at::full({1}, x, at::kDouble); };
  ar.write("step", scalar(static_cast<double>(step)));
  ar.write("beta1", scalar(beta1));
  ar.write("beta2", scalar(beta2));
  ar.write("eps", scalar(eps));
  int64_t count = 0;
  for (const at::Tensor& p : params) {
    const std::vector<at::Tensor> st = opt.export_state_fp32(p);
    if (st.size() < 2) continue;
    ar.write("m" + std::to_string(count), st[0].cpu().contiguous());
    ar.write("v" + std::to_string(count), st[1].cpu().contiguous());
    ++count;
  }
  TORCH_CHECK(count > 0, "--save-moments ", path, ": the optimizer keeps no first and second moments");
  ar.write("count", at::full({1}, count, at::kLong));
  ar.save_to(path);
}

class Lowbit : public TrainOptimizer {
 public:
  Lowbit(std::unique_ptr<lo::LowbitOptimizer> opt, std::string what, bool release,
         const std::optional<lo::HostOffloadOptions>& offload)
      : opt_(std::move(opt)), what_(std::move(what)) {
    if (release) release_ = std::make_unique<lo::GradientRelease>(*opt_);
    if (offload) offload_ = std::make_unique<lo::HostOffload>(*opt_, *offload);
  }
  void step() override {
    if (offload_) offload_->step();  // waits for the host's steps of what backward() released
    else if (!release_) opt_->step();  // with release, backward() has stepped every parameter already
  }
  void zero_grad() override { opt_->zero_grad(); }
  void set_lr(double lr) override {
    for (auto& g : opt_->param_groups()) g.options().set_lr(lr);
  }
  int64_t state_bytes() const override { return offload_ ? 0 : opt_->state_bytes(); }
  int64_t host_bytes() const override { return offload_ ? opt_->state_bytes() + offload_->host_bytes() : 0; }
  std::string memory_report() const override {
    std::string s = opt_->memory_report().to_string();
    if (!offload_) return s;
    return s + "host offload: all of the above on the host, beside the weights' host copies (none with "
               "--offload-stage-weights) and staging buffers (" +
           std::to_string(offload_->host_bytes()) + " B); device gradients in flight at most " +
           std::to_string(offload_->peak_gradients_in_flight()) + "\n";
  }
  std::string interval_report() override {
    if (!offload_) return "";
    const lo::HostOffloadStats st = offload_->stats();
    offload_->reset_stats();
    const double n = static_cast<double>(std::max<int64_t>(1, st.steps));
    char line[512];
    std::snprintf(line, sizeof line,
                  "  offload, per step (mean of %lld): host thread stepping %.1f ms, waiting for gradients' copies "
                  "%.1f ms; backward held up for a staging buffer %.1f ms; step() waiting after backward %.1f ms; "
                  "%.1f MB to the host, %.1f MB back",
                  (long long)st.steps, 1e3 * st.host_step_s / n, 1e3 * st.copy_wait_s / n, 1e3 * st.stall_s / n,
                  1e3 * st.step_wait_s / n, st.bytes_to_host / n / 1e6, st.bytes_to_device / n / 1e6);
    return line;
  }
  int64_t step_graph_replays() const override { return opt_->step_graph_replays(); }
  void save(const std::string& path) override { torch::save(*opt_, path); }
  void load(const std::string& path) override { lo::load_checkpoint(*opt_, path); }
  std::string describe() const override { return what_; }
  void save_moments(const std::string& path, const std::vector<at::Tensor>& params, int64_t step) const override {
    const auto& o = opt_->param_groups()[0].options();
    double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    if (const auto* a = dynamic_cast<const lo::AdamWOptions*>(&o)) {
      std::tie(b1, b2) = a->betas();
      eps = a->eps();
    } else if (const auto* a = dynamic_cast<const lo::AdamOptions*>(&o)) {
      std::tie(b1, b2) = a->betas();
      eps = a->eps();
    } else {
      TORCH_CHECK(false, "--save-moments needs --optimizer adamw or adam");
    }
    if (!offload_) return write_moments(path, *opt_, params, step, b1, b2, eps);
    std::vector<at::Tensor> host;  // the optimizer's parameters: the host copies
    for (const at::Tensor& p : params) host.push_back(offload_->host_param(p));
    write_moments(path, *opt_, host, step, b1, b2, eps);
  }

 private:
  std::unique_ptr<lo::LowbitOptimizer> opt_;
  std::string what_;
  std::unique_ptr<lo::GradientRelease> release_;  // declared after opt_: removed (its hooks) first
  std::unique_ptr<lo::HostOffload> offload_;      // likewise
};

template <typename Opt, typename Options>
std::unique_ptr<TrainOptimizer> lowbit_opt(const Flags& f, const std::vector<at::Tensor>& params, Options o,
                                           GPTImpl* model) {
  o.state_format(f.state_format)
      .fp8_second_moment(f.fp8_second_moment)
      .block_size(f.block_size)
      .bf16_stochastic_round(f.stochastic_round)
      .master_weight_bits(f.master_weight_bits)
      .max_grad_norm(f.clip);
  std::ostringstream s;
  s << "lowbit " << f.optimizer << ", " << lowbit::state_format_name(f.state_format) << " state";
  if (f.state_format == lowbit::StateFormat::FP8) s << " (second moments " << lowbit::format_name(f.fp8_second_moment) << ")";
  if (f.stochastic_round) s << ", bf16 stochastic rounding";
  if (f.master_weight_bits) s << ", " << f.master_weight_bits << "-bit master weights";
  if (f.gradient_release) s << ", gradient release";
  if (f.offload) s << ", state offloaded to the host";
  auto opt = std::make_unique<Opt>(params, o);
  opt->set_step_graphs(f.step_graphs);
  if (!f.step_graphs) s << ", no step graphs";
  if (f.sharded) return make_sharded(f, std::move(opt), s.str(), model);
  std::optional<lo::HostOffloadOptions> offload;
  if (f.offload) offload = lo::HostOffloadOptions().host_threads(f.offload_threads).stage_weights(f.offload_stage_weights);
  return std::make_unique<Lowbit>(std::move(opt), s.str(), f.gradient_release, offload);
}

// ---- ATen's fused AdamW ---------------------------------------------------------------------------
// The state has the parameters' dtype (fp32 or bf16), like torch.optim.AdamW(fused=True).

class TorchFusedAdamW : public TrainOptimizer {
 public:
  TorchFusedAdamW(const Flags& f, std::vector<at::Tensor> params) : f_(f), params_(std::move(params)), lr_(f.lr) {}

  void step() override {
    torch::NoGradGuard ng;
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : params_) {
      TORCH_CHECK(p.grad().defined(), "torch-adamw: a parameter has no gradient");
      grads.push_back(p.grad());
    }
    if (exp_avg_.empty()) {
      for (const at::Tensor& p : params_) {
        exp_avg_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
        exp_avg_sq_.push_back(at::zeros_like(p, at::MemoryFormat::Contiguous));
        steps_.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
      }
    }
    if (f_.clip > 0) {  // global L2 norm on the device, as torch.nn.utils.clip_grad_norm_(foreach=True)
      const std::vector<at::Tensor> norms = at::_foreach_norm(grads, 2, at::kFloat);
      const at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2);
      const at::Tensor coef = at::clamp_max(f_.clip / (total + 1e-6), 1.0);
      at::_foreach_mul_(grads, coef);
    }
    at::_foreach_add_(steps_, 1);
    at::_fused_adamw_(params_, grads, exp_avg_, exp_avg_sq_, {}, steps_, lr_, f_.beta1, f_.beta2, f_.weight_decay,
                      f_.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
  void zero_grad() override {
    for (at::Tensor& p : params_) p.mutable_grad().reset();
  }
  void set_lr(double lr) override { lr_ = lr; }
  int64_t state_bytes() const override {
    int64_t n = 0;
    for (const auto* v : {&exp_avg_, &exp_avg_sq_, &steps_})
      for (const at::Tensor& t : *v) n += static_cast<int64_t>(t.nbytes());
    return n;
  }
  void save(const std::string& path) override {
    torch::serialize::OutputArchive a;
    a.write("count", at::tensor(static_cast<int64_t>(exp_avg_.size())));
    for (size_t i = 0; i < exp_avg_.size(); ++i) {
      a.write("exp_avg_" + std::to_string(i), exp_avg_[i]);
      a.write("exp_avg_sq_" + std::to_string(i), exp_avg_sq_[i]);
      a.write("step_" + std::to_string(i), steps_[i]);
    }
    a.save_to(path);
  }
  void load(const std::string& path) override {
    torch::serialize::InputArchive a;
    a.load_from(path);
    at::Tensor count;
    a.read("count", count);
    const int64_t n = count.item<int64_t>();
    TORCH_CHECK(n == 0 || n == static_cast<int64_t>(params_.size()), "--resume: ", path, " holds the state of ", n,
                " parameters, the model has ", params_.size());
    exp_avg_.clear(), exp_avg_sq_.clear(), steps_.clear();
    for (int64_t i = 0; i < n; ++i) {
      at::Tensor m, v, s;
      a.read("exp_avg_" + std::to_string(i), m);
      a.read("exp_avg_sq_" + std::to_string(i), v);
      a.read("step_" + std::to_string(i), s);
      const at::Tensor& p = params_[i];
      TORCH_CHECK(m.sizes() == p.sizes() && m.scalar_type() == p.scalar_type(), "--resume: ", path, ": state ", i,
                  " does not match its parameter");
      exp_avg_.push_back(m.to(p.device()));
      exp_avg_sq_.push_back(v.to(p.device()));
      steps_.push_back(s.to(p.device()));
    }
  }
  std::string describe() const override { return "ATen fused AdamW (at::_fused_adamw_), state in the parameters' dtype"; }

 private:
  Flags f_;
  std::vector<at::Tensor> params_, exp_avg_, exp_avg_sq_, steps_;
  double lr_;
};

}  // namespace

std::unique_ptr<TrainOptimizer> make_optimizer(const Flags& f, const std::vector<at::Tensor>& params, GPTImpl* model) {
  const auto betas = std::make_tuple(f.beta1, f.beta2);
  const std::string& o = f.optimizer;
  if (o == "torch-adamw") return std::make_unique<TorchFusedAdamW>(f, params);
  if (o == "adamw")
    return lowbit_opt<lo::AdamW>(f, params, lo::AdamWOptions(f.lr).betas(betas).eps(f.eps).weight_decay(f.weight_decay), model);
  if (o == "adam")
    return lowbit_opt<lo::Adam>(f, params, lo::AdamOptions(f.lr).betas(betas).eps(f.eps).weight_decay(f.weight_decay), model);
  if (o == "lion") return lowbit_opt<lo::Lion>(f, params, lo::LionOptions(f.lr).betas(betas).weight_decay(f.weight_decay), model);
  if (o == "sgd")
    return lowbit_opt<lo::SGD>(f, params, lo::SGDOptions(f.lr).momentum(f.beta1).weight_decay(f.weight_decay), model);
  if (o == "rmsprop")
    return lowbit_opt<lo::RMSprop>(f, params, lo::RMSpropOptions(f.lr).alpha(f.beta2).eps(f.eps).weight_decay(f.weight_decay), model);
  if (o == "adagrad")
    return lowbit_opt<lo::Adagrad>(f, params, lo::AdagradOptions(f.lr).eps(f.eps).weight_decay(f.weight_decay), model);
  if (o == "ademamix")
    return lowbit_opt<lo::AdEMAMix>(
        f, params, lo::AdEMAMixOptions(f.lr).betas(std::make_tuple(f.beta1, f.beta2, 0.9999)).eps(f.eps).weight_decay(f.weight_decay), model);
  if (o == "lamb")
    return lowbit_opt<lo::LAMB>(f, params, lo::LAMBOptions(f.lr).betas(betas).eps(f.eps).weight_decay(f.weight_decay), model);
  throw std::invalid_argument("--optimizer " + o + ": unknown");
}

int64_t TrainOptimizer::weight_bytes(const std::vector<at::Tensor>& params) const {
  int64_t n = 0;
  for (const at::Tensor& p : params) n += static_cast<int64_t>(p.nbytes());
  return n;
}

int64_t TrainOptimizer::gradient_bytes(const std::vector<at::Tensor>& params) const {
  int64_t n = 0;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) n += static_cast<int64_t>(p.grad().nbytes());
  return n;
}

void TrainOptimizer::save_moments(const std::string& path, const std::vector<at::Tensor>&, int64_t) const {
  TORCH_CHECK(false, "--save-moments ", path, ": needs a lowbit optimizer (its state decoded to fp32)");
}

}  // namespace gpt
