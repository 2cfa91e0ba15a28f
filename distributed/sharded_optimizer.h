// ShardedOptimizer (ZeRO-2, ZeRO-1 as an option): wraps any lowbit optimizer and keeps on each rank
// only the optimizer state of the range of the parameters it owns. Parameters become views of flat
// per-(device, dtype) buffers (flat_layout.h). Per step: the gradients are copied into the flat
// buffer and reduce-scattered (average) -> one small all_reduce decides the non-finite skip and
// gives the clipping norms -> the owned range steps through the same step op as one process, with
// each piece's element offset in its parameter (quantization blocks, state formats and
// stochastic-rounding indices are those of the whole parameter) -> the parameters are all-gathered.
// Results do not depend on the number of ranks: 1, 2 or 3 ranks give the same bits as one
// unsharded optimizer fed the averaged gradients (see the note on clipping at step()).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <lowbit/optim/lowbit_optimizer.h>
#include <lowbit/optim/state_layout.h>

#include "communicator.h"
#include "flat_layout.h"

namespace lowbit {
namespace distributed {

struct ShardedOptions {
  // ZeRO-1: gradients all-reduced (every rank holds the whole averaged gradient) instead of
  // reduce-scattered; the state is sharded either way.
  bool zero1 = false;
  // Copy rank 0's parameters to every rank when constructed (ranks then start identical).
  bool broadcast_parameters = true;
};

// One rank's piece of one parameter: elements [offset, offset + numel) of parameter `index` of
// group `group`, and the optimizer state of exactly those elements.
struct Fragment {
  size_t group = 0, index = 0;
  int64_t offset = 0, numel = 0;
  int64_t param_numel = 0;  // the whole parameter's
  optim::ParamState state;
};

class ShardedOptimizer {
 public:
  using LossClosure = std::function<at::Tensor()>;

  // `optimizer` must not have stepped yet (load a checkpoint into the ShardedOptimizer instead).
  // All parameters must be on one device; the communicator carries that device's tensors.
  ShardedOptimizer(std::shared_ptr<optim::LowbitOptimizer> optimizer, std::shared_ptr<Communicator> comm,
                   ShardedOptions options = {});

  // One step of every parameter; every rank calls it, and every parameter needs a gradient on every
  // rank. The averaged gradient is computed as sum / world_size. Clipping's norm adds the ranks'
  // partial sums of squares (one scalar per group): it equals one process's norm where those sums
  // are exact, and may differ from it in the last bit otherwise (as for parameters on several
  // devices in one optimizer).
  at::Tensor step(LossClosure closure = nullptr);
  void zero_grad(bool set_to_none = true);

  // Bytes of optimizer state this rank holds (its fragments only).
  int64_t state_bytes() const;
  int64_t skipped_steps() const;

  optim::LowbitOptimizer& optimizer() { return *optimizer_; }  // param groups, lr (schedulers)
  Communicator& communicator() { return *comm_; }
  // This rank's fragments, in (group, index) order; state undefined before the first step.
  const std::vector<Fragment>& fragments() const { return fragments_; }

  // Checkpoints (sharded_checkpoint.cpp): every rank writes `prefix`.rank-R-of-N; load() reads the
  // files of any number of ranks, checks them whole, then takes the pieces this rank owns.
  void save(const std::string& prefix) const;
  void load(const std::string& prefix);

 private:
  struct Buffer {
    at::ScalarType dtype;
    FlatLayout layout;
    std::vector<size_t> members;  // indices into params_
    at::Tensor flat_param, flat_grad, grad_shard;
  };
  struct Param {
    size_t group, index;
    at::Tensor param;
    size_t buffer;
    int64_t flat_offset;
    int fragment = -1;  // index into fragments_ (this rank owns a piece), or -1
    optim::StateLayout layout;
  };
  void ensure_states();
  // LAMB: each piece's sums of p^2 and r^2 over its whole parameter, added block by block in the
  // order one process adds them (per-block sums all-reduced), as float64 [pieces, 2].
  at::Tensor lamb_norms(size_t group, const std::vector<size_t>& frags, const at::Tensor& found_inf,
                        const at::Tensor& sumsq);

  std::shared_ptr<optim::LowbitOptimizer> optimizer_;
  std::shared_ptr<Communicator> comm_;
  ShardedOptions options_;
  at::Device device_ = at::kCPU;
  std::vector<Buffer> buffers_;
  std::vector<Param> params_;
  std::vector<Fragment> fragments_;
  std::vector<at::Tensor> fragment_params_, fragment_grads_;  // views: the piece of the parameter / gradient shard
  at::Tensor skipped_;   // int64 [1] on the device
  int64_t skipped_loaded_ = 0;
};

}  // namespace distributed
}  // namespace lowbit
