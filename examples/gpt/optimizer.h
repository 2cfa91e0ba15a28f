// The optimizer behind --optimizer: any lowbit optimizer (state format, clipping, master weights
// as options), or ATen's fused AdamW (at::_fused_adamw_) as the baseline, behind one interface.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "flags.h"

namespace gpt {

class TrainOptimizer {
 public:
  virtual ~TrainOptimizer() = default;
  virtual void step() = 0;  // clips to --clip (global L2 norm over every parameter) first
  virtual void zero_grad() = 0;
  virtual void set_lr(double lr) = 0;
  virtual int64_t state_bytes() const = 0;  // on the device
  // Host memory the optimizer holds (--offload: state, corrections, the weights' copies, staging).
  virtual int64_t host_bytes() const { return 0; }
  // The parts of the device's peak this optimizer knows of: parameters and gradients as the model
  // holds them (`params`; --fully-sharded: this rank's shards plus the high-water marks of gathered
  // units, gradient buffers and gradient shards, as memory_report() shows them).
  virtual int64_t weight_bytes(const std::vector<at::Tensor>& params) const;
  virtual int64_t gradient_bytes(const std::vector<at::Tensor>& params) const;
  // lowbit's per-kind report (LowbitOptimizer::memory_report); "" for ATen's optimizer.
  virtual std::string memory_report() const { return ""; }
  // Where the steps since the last call went, as one line ("" when there is nothing to say: only
  // --offload has), and a fresh count from here: called at each log line, so that a line shows the
  // steady state and not the first steps' state creation.
  virtual std::string interval_report() { return ""; }
  // Steps run by a recorded CUDA graph (LowbitOptimizer::step_graph_replays); 0 for ATen's optimizer.
  virtual int64_t step_graph_replays() const { return 0; }
  virtual void save(const std::string& path) = 0;
  // --save-moments: each parameter's first and second moments decoded to fp32 (lowbit optimizers
  // with an exp_avg / exp_avg_sq state), for bench_state_error's error tables on GPT state.
  virtual void save_moments(const std::string& path, const std::vector<at::Tensor>& params, int64_t step) const;
  virtual void load(const std::string& path) = 0;
  virtual std::string describe() const = 0;
  // After training: the parameters' values whole, for the digest. --fully-sharded gathers one unit
  // at a time and copies it to the host on rank 0 (a model larger than one GPU never is whole on
  // one); the other ranks get undefined tensors. The model stays sharded.
  virtual std::vector<at::Tensor> whole_parameters(const std::vector<at::Tensor>& params) { return params; }
  virtual bool fully_sharded() const { return false; }
  // --sharded / --fully-sharded: save() writes the weights too (each rank its files, the fragment
  // format of sharded_checkpoint.h, which load() reads on any number of ranks), as `path` prefix.
  virtual bool saves_weights() const { return false; }
};

class GPTImpl;  // model.h

// One parameter group: weight decay applies to every parameter, so that lowbit's max_grad_norm
// clips the global norm (lowbit clips per group) inside the fused step, with no host sync.
// --fully-sharded needs the model (its blocks are the units).
std::unique_ptr<TrainOptimizer> make_optimizer(const Flags& f, const std::vector<at::Tensor>& params,
                                               GPTImpl* model = nullptr);

}  // namespace gpt
