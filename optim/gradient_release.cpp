// GradientRelease (gradient_release.h): libtorch's post-accumulate-grad hook on each parameter.
#include "gradient_release.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace lowbit {
namespace optim {

struct GradientRelease::Shared {
  LowbitOptimizer* opt = nullptr;
  bool accumulating = false;
  int64_t released = 0;
};

namespace {

struct ReleaseHook : torch::autograd::PostAccumulateGradHook {
  explicit ReleaseHook(std::shared_ptr<GradientRelease::Shared> s) : shared(std::move(s)) {}
  void operator()(const torch::autograd::Variable& param) override {
    if (shared->accumulating || !param.grad().defined()) return;
    shared->opt->step_parameters({param});
    param.mutable_grad().reset();  // released: the next backward starts from nothing
    ++shared->released;
  }
  std::shared_ptr<GradientRelease::Shared> shared;
};

}  // namespace

GradientRelease::GradientRelease(LowbitOptimizer& opt) : shared_(std::make_shared<Shared>()) {
  shared_->opt = &opt;
  TORCH_CHECK(!opt.clips_gradients(), "GradientRelease: a param group has max_grad_norm > 0; global-norm clipping "
              "needs every gradient at once, which gradient release frees as it goes. Clip without release, or "
              "set max_grad_norm to 0");
  for (size_t gi = 0; gi < opt.param_groups().size(); ++gi) {
    const auto& params = opt.param_groups()[gi].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      TORCH_CHECK(p.requires_grad() && p.is_leaf(), "GradientRelease: parameter ", i, " of group ", gi,
                  " is not a leaf tensor that requires grad; only those receive their gradient in backward()");
      TORCH_CHECK(!torch::autograd::impl::post_acc_grad_hooks(p), "GradientRelease: parameter ", i, " of group ", gi,
                  " already has a post-accumulate-grad hook (another GradientRelease, or one from Python)");
    }
  }
  for (const auto& g : opt.param_groups())
    for (const at::Tensor& p : g.params()) {
      torch::autograd::impl::set_post_acc_grad_hooks(p, std::make_unique<ReleaseHook>(shared_));
      params_.push_back(p);
    }
}

GradientRelease::~GradientRelease() {
  for (const at::Tensor& p : params_) {
    auto& hook = torch::autograd::impl::post_acc_grad_hooks(p);
    auto* ours = dynamic_cast<ReleaseHook*>(hook.get());
    if (ours && ours->shared == shared_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }
}

void GradientRelease::set_accumulating(bool on) { shared_->accumulating = on; }
bool GradientRelease::accumulating() const { return shared_->accumulating; }
int64_t GradientRelease::released() const { return shared_->released; }

}  // namespace optim
}  // namespace lowbit
