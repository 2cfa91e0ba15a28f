// GradientRelease (gradient_release.h): a post-accumulate-grad hook on each parameter (grad_hooks.h).
#include "gradient_release.h"

#include "grad_hooks.h"

namespace lowbit {
namespace optim {

struct GradientRelease::Shared {
  LowbitOptimizer* opt = nullptr;
  bool accumulating = false;
  int64_t released = 0;
};

GradientRelease::GradientRelease(LowbitOptimizer& opt) : shared_(std::make_shared<Shared>()) {
  shared_->opt = &opt;
  TORCH_CHECK(!opt.clips_gradients(), "GradientRelease: a param group has max_grad_norm > 0; global-norm clipping "
              "needs every gradient at once, which gradient release frees as it goes. Clip without release, or "
              "set max_grad_norm to 0");
  std::vector<at::Tensor> params;
  std::vector<std::pair<size_t, size_t>> where;  // (group, index) of each, for errors
  for (size_t gi = 0; gi < opt.param_groups().size(); ++gi) {
    const auto& ps = opt.param_groups()[gi].params();
    for (size_t i = 0; i < ps.size(); ++i) {
      params.push_back(ps[i]);
      where.emplace_back(gi, i);
    }
  }
  const auto name = [&where](size_t k) { return c10::str("parameter ", where[k].second, " of group ", where[k].first); };
  hooks_ = std::make_unique<GradHooks>("GradientRelease", std::move(params), name,
                                       [shared = shared_](size_t, const at::Tensor& param) {
    if (shared->accumulating || !param.grad().defined()) return;
    TORCH_CHECK(!shared->opt->clips_gradients(), "GradientRelease: a param group has max_grad_norm > 0 (set after the "
                "release was made); global-norm clipping needs every gradient at once. Set max_grad_norm to 0");
    shared->opt->step_parameters({param});
    param.mutable_grad().reset();  // released: the next backward starts from nothing
    ++shared->released;
  });
}

GradientRelease::~GradientRelease() = default;  // hooks_ removes the hooks

void GradientRelease::set_accumulating(bool on) { shared_->accumulating = on; }
bool GradientRelease::accumulating() const { return shared_->accumulating; }
int64_t GradientRelease::released() const { return shared_->released; }

}  // namespace optim
}  // namespace lowbit
