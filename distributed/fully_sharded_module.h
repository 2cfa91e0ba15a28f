// FullyShardedModule (FSDP-style, ZeRO-3): parameters, gradients and optimizer state sharded over
// ranks, so N ranks hold about 1/N of each. The model is cut into units (a transformer block, say)
// and the root (every parameter in no unit). Each unit's parameters live as this rank's
// block-aligned range of a flat buffer per dtype (flat_layout.h, as ShardedOptimizer's buckets);
// the whole parameters exist only while a unit computes:
//   - forward: a unit's parameters are all-gathered before its forward (the next unit's gathered
//     meanwhile, where the communicator runs asynchronously) and released after it;
//   - backward: gathered again when the gradient reaches the unit's output (the unit before it
//     prefetched), and released, with the gradients, as soon as its gradients are reduce-scattered
//     (from the post-accumulate-grad hooks, as ShardedOptions::overlap does);
//   - step(): the owned ranges step through the same op as one process, each with its element
//     offset in its parameter, so parameters and state are bit for bit those of one process fed the
//     averaged gradients, at any number of ranks (and the state format, block size and
//     stochastic-rounding indices never depend on the world size).
// The root's parameters stay gathered from forward() until their gradients are reduced.
//
// libtorch's C++ modules have no forward hooks, so the model's forward says where units run:
//
//   lowbit::distributed::FullyShardedModule fsdp(model, {model->blocks[0], ...}, optimizer, comm);
//   at::Tensor loss = fsdp.forward([&] {
//     at::Tensor x = model->embed(tokens);
//     for (size_t u = 0; u < blocks.size(); ++u) x = fsdp.unit(u, [&] { return blocks[u]->forward(x); });
//     return head_and_loss(x);
//   });
//   loss.backward();
//   fsdp.step();
//   fsdp.zero_grad();
//
// `optimizer` is any lowbit optimizer over the model's parameters (every trainable one), not yet
// stepped; its groups, options and lr are the step's (schedulers work on it). Parameters not in the
// optimizer stay whole on every rank. A parameter read while its unit is released is an error
// naming the unit; gather_all() makes them readable. Tensors that alias a gathered parameter (its
// views, detach()) must not outlive the gathering: copy what is kept (clone()).
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sharded_optimizer.h"

namespace lowbit {
namespace distributed {

struct FullyShardedOptions {
  // Release a unit's gathered parameters after its forward (gathered again in backward): memory of
  // about two units' parameters at a time, one more all-gather per unit and step. Off: a unit's
  // parameters stay from its forward to its backward (the whole model's at the end of forward).
  bool reshard_after_forward = true;
  // Copy rank 0's parameters to every rank when constructed (ranks then start identical).
  bool broadcast_parameters = true;
  // Each rank fills its own shards instead (broadcast_parameters then unused): initialize(name,
  // parameter, first_element, values) writes elements [first_element, first_element +
  // values.numel()) of the flattened parameter into `values` (1-D, the shard's dtype, on its
  // device). `name` is the parameter's in root->named_parameters(); its values are never read, so
  // a model too large for any one process is built with at::empty on the host, whose untouched
  // pages hold no memory. For the ranks to hold one model, a value may depend only on the
  // parameter and the element's index: keyed_normal_ (tensors/keyed_random.h) gives random ones,
  // the same in one process that fills each parameter whole. Parameters the optimizer does not
  // train stay as the model holds them.
  std::function<void(const std::string& name, const at::Tensor& parameter, int64_t first_element,
                     const at::Tensor& values)>
      initialize;
  // Gradient release for the fully sharded model (the memory floor): each unit's shards step as
  // soon as its gradients are reduced, inside backward(), and its gradient shard is dropped, so
  // no gradient outlives its unit's backward. step() then only finishes what backward() left
  // (units whose gradients some rank did not produce). What needs every gradient first is
  // refused: global-norm clipping (max_grad_norm), LAMB. The non-finite skip is per unit (every
  // rank skips the unit where any rank saw Inf or NaN); skipped_steps() counts the steps where some
  // unit skipped. Bits otherwise as without it.
  bool step_in_backward = false;
  // Where the shards, the gathered parameters and the state live, when the model was built on the
  // host (a model larger than one device: each parameter moves to the device only as its rank's
  // shard). Unset: the parameters' own device.
  std::optional<at::Device> device;
  // Mixed precision, as FSDP2's policy. param_dtype (bfloat16 or float16): float32 parameters stay
  // float32 shards, which the optimizer steps (their own master weights: no master_weight_bits),
  // while the units compute in param_dtype: each all-gather carries the shards rounded to it (to
  // nearest even) and the model's parameters are param_dtype tensors from construction on.
  // Parameters of another dtype are left as they are. reduce_dtype: the dtype gradients are
  // reduce-scattered and stepped in (unset: the dtype they compute in). float32 adds the ranks'
  // bfloat16 gradients without rounding their mean to bfloat16, at twice the bytes on the wire;
  // bfloat16 (as the default under param_dtype bfloat16) rounds the mean once. Every rank the same.
  std::optional<at::ScalarType> param_dtype, reduce_dtype;
  // The low-bit wire for gradients (see ShardedOptions::gradient_wire): each unit's gradients
  // leave as quantized chunks (all-to-all) and their owner adds them, its own exactly, in float32;
  // at 8 bits about a quarter of a float32 reduce-scatter's bytes. The send and receive buffers
  // live from the unit's reduction until its chunks are summed, under the next unit's backward.
  // error_feedback is refused: its residual is a whole unit's gradient kept on every rank.
  std::optional<WireCompression> gradient_wire;
};

// What a rank of a fully sharded model holds, by part: between steps its weight shards, the
// optimizer state of its pieces and their master-weight corrections (each about the whole model's
// divided by the ranks); while units run, their gathered weights, their gradient buffers and the
// reduced gradient shards, now and at their high-water mark. Activations are the model's (the
// allocator's statistics hold them).
struct FullyShardedMemory {
  int64_t parameters = 0;  // elements of the whole model
  int64_t shard_bytes = 0, state_bytes = 0, correction_bytes = 0;
  int64_t gathered_bytes = 0, gradient_bytes = 0, gradient_shard_bytes = 0;
  int64_t peak_gathered_bytes = 0, peak_gradient_bytes = 0, peak_gradient_shard_bytes = 0;

  int64_t persistent_bytes() const { return shard_bytes + state_bytes + correction_bytes; }
  // The most the transient parts held at once is at most the sum of their high-water marks.
  int64_t peak_bound_bytes() const {
    return persistent_bytes() + peak_gathered_bytes + peak_gradient_bytes + peak_gradient_shard_bytes;
  }
  // One line per part, bytes and bytes per parameter of the whole model.
  std::string to_string() const;
};

class FullyShardedModule {
 public:
  // `units`: submodules of `root`, each with parameters of its own (a parameter in two units is an
  // error naming both); every rank must give the same units, parameters and options (checked
  // before any other collective, errors naming the rank, the unit and the parameter).
  FullyShardedModule(std::shared_ptr<torch::nn::Module> root, std::vector<std::shared_ptr<torch::nn::Module>> units,
                     std::shared_ptr<optim::LowbitOptimizer> optimizer, std::shared_ptr<Communicator> comm,
                     FullyShardedOptions options = {});
  ~FullyShardedModule();
  FullyShardedModule(const FullyShardedModule&) = delete;
  FullyShardedModule& operator=(const FullyShardedModule&) = delete;

  // The model's forward: gathers the root's parameters, runs fn, which runs each unit through
  // unit(). Without grad mode (evaluation) everything is released when it returns.
  at::Tensor forward(const std::function<at::Tensor()>& fn);
  // Unit u's forward, inside forward(): its parameters gathered while fn runs; the result carries
  // the gathering for backward.
  at::Tensor unit(size_t u, const std::function<at::Tensor()>& fn);

  // One step of every shard (after backward(); every rank calls it).
  void step();
  void zero_grad(bool set_to_none = true);
  // Gradient accumulation: on for every backward() of a step but the last (the units' whole
  // gradients then add up in .grad, reduced by the last backward()).
  void set_accumulating(bool on);

  // Every parameter whole on every rank (evaluation outside forward(), saving the model); the next
  // forward() or step() releases them again. gather(u) / release(u): one unit's (u == units(): the
  // root's), for a model too large to be whole on one device. Collective: every rank calls them.
  void gather_all();
  void release_all();
  void gather(size_t u);
  void release(size_t u);

  size_t units() const { return unit_buckets_.size() - 1; }  // the root not counted
  // Bytes of parameters this rank keeps between steps (its shards), and the whole model's in the
  // dtype it is kept in (with param_dtype, float32: not the bytes a gathered copy takes).
  int64_t shard_bytes() const;
  int64_t model_bytes() const;
  // Parameters' bytes gathered on this rank now (units in use), and whether unit u's are (u ==
  // units(): the root's).
  int64_t gathered_bytes() const;
  bool gathered(size_t u) const;

  // What this rank holds, by part (see FullyShardedMemory); the high-water marks count from the
  // construction or the last reset_memory_peaks().
  FullyShardedMemory memory_report() const;
  void reset_memory_peaks();

  // Checkpoints in the fragment format (sharded_checkpoint.h, version 3): every rank writes its
  // shards and their state to `prefix`.rank-R-of-N; the files of any number of ranks load on any
  // number, and into one process (load_fragments), bit-exact, and back. A refused load changes
  // nothing on any rank.
  void save(const std::string& prefix) const { sharded_->save(prefix); }
  void load(const std::string& prefix, const optim::LoadOptions& options = optim::LoadOptions());

  // Fragments, state bytes, wire statistics and the optimizer.
  ShardedOptimizer& sharded() { return *sharded_; }
  const ShardedOptimizer& sharded() const { return *sharded_; }

  // The autograd side of unit() (fully_sharded_module.cpp): backward reached unit u's output.
  void before_backward(size_t u);

 private:
  void gather_unit(size_t u);    // waits where the unit was prefetched
  void prefetch_unit(size_t u);  // the all-gather issued without holding up the caller's stream
  void release_unit(size_t u);
  size_t root_unit() const { return unit_buckets_.size() - 1; }

  std::shared_ptr<torch::nn::Module> root_;
  FullyShardedOptions options_;
  std::unique_ptr<ShardedOptimizer> sharded_;
  std::vector<std::vector<size_t>> unit_buckets_;  // per unit (the root last): its buckets in sharded_
  // Per unit gathered without the caller's stream waiting: the number of its last all-gather
  // (Communicator::collectives_issued()), which the caller's stream waits for before a use; 0: none.
  std::vector<int64_t> prefetched_;
  bool in_forward_ = false;
};

}  // namespace distributed
}  // namespace lowbit
