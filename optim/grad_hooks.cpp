// GradHooks (grad_hooks.h): libtorch's post-accumulate-grad hook slot of each parameter.
#include "grad_hooks.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace lowbit {
namespace optim {

namespace {

struct Hook : torch::autograd::PostAccumulateGradHook {
  Hook(std::shared_ptr<const GradHooks::Fn> f, size_t i) : fn(std::move(f)), k(i) {}
  void operator()(const torch::autograd::Variable& param) override { (*fn)(k, param); }
  std::shared_ptr<const GradHooks::Fn> fn;
  size_t k;
};

}  // namespace

GradHooks::GradHooks(const std::string& who, std::vector<at::Tensor> params,
                     const std::function<std::string(size_t)>& name, Fn fn)
    : fn_(std::make_shared<const Fn>(std::move(fn))) {
  for (size_t k = 0; k < params.size(); ++k) {
    const at::Tensor& p = params[k];
    TORCH_CHECK(p.requires_grad() && p.is_leaf(), who, ": ", name(k),
                " is not a leaf tensor that requires grad; only those receive their gradient in backward()");
    TORCH_CHECK(!torch::autograd::impl::post_acc_grad_hooks(p), who, ": ", name(k),
                " already has a post-accumulate-grad hook (a GradientRelease, a ShardedOptimizer with overlap, or "
                "one from Python)");
  }
  for (size_t k = 0; k < params.size(); ++k)
    torch::autograd::impl::set_post_acc_grad_hooks(params[k], std::make_unique<Hook>(fn_, k));
  params_ = std::move(params);
}

GradHooks::~GradHooks() {
  for (const at::Tensor& p : params_) {
    auto& hook = torch::autograd::impl::post_acc_grad_hooks(p);
    auto* ours = dynamic_cast<Hook*>(hook.get());
    if (ours && ours->fn == fn_) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }
}

}  // namespace optim
}  // namespace lowbit
