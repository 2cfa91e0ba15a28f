// One post-accumulate-grad hook on each of a set of parameters, set together and removed together:
// the mechanism GradientRelease (gradient_release.h) and the ShardedOptimizer's overlapped
// reduce-scatter (distributed/sharded_optimizer.h) share. Internal: not an installed header.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace lowbit {
namespace optim {

class GradHooks {
 public:
  // fn(k, param): backward() has finished summing params[k]'s gradient into .grad.
  using Fn = std::function<void(size_t k, const at::Tensor& param)>;
  // Checks every parameter before setting any hook: a leaf that requires grad (only those receive
  // their gradient in backward()) with no post-accumulate-grad hook yet (libtorch keeps one per
  // tensor; a second owner would silently replace the first). Errors start with `who` and name the
  // parameter as name(k).
  GradHooks(const std::string& who, std::vector<at::Tensor> params, const std::function<std::string(size_t)>& name,
            Fn fn);
  ~GradHooks();  // removes the hooks it set (a hook someone set since is left alone)
  GradHooks(const GradHooks&) = delete;
  GradHooks& operator=(const GradHooks&) = delete;

 private:
  std::shared_ptr<const Fn> fn_;  // identifies our hooks at removal
  std::vector<at::Tensor> params_;
};

}  // namespace optim
}  // namespace lowbit
