// A GPT-2-style decoder: token + position embeddings, pre-LayerNorm blocks (causal self-attention
// through at::scaled_dot_product_attention, GELU MLP), a final LayerNorm and an output head tied
// to the token embedding. Parameters are created on their device in their dtype (a 10B-parameter
// model never passes through host memory).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>

#include <lowbit/lowbit.h>

namespace gpt {

struct ModelConfig {
  int64_t vocab = 256, context = 256, layers = 6, width = 384, heads = 6;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  bool checkpoint_activations = false;  // keep only each block's input; recompute the block in backward
  // false: parameters left uninitialized (--fully-sharded ranks but 0, which take rank 0's values;
  // untouched host pages cost no memory).
  bool initialize = true;
  // Where the initial values are drawn (then copied to `device`): a GPU draws a host-built model's
  // tens of billions of values in seconds, the host in minutes.
  std::optional<at::Device> init_device;
  // --init keyed: each value a function of the parameter's name, `seed` and the element's index
  // (lowbit::keyed_normal_), so a fully sharded rank fills only its own shards (GPTImpl::init_values)
  // and gets what one process gets; otherwise torch's generator, seeded by the caller.
  bool keyed_init = false;
  uint64_t seed = 0;
};

// Parameters of a model of this shape (embeddings counted once: the head is tied).
int64_t count_params(const ModelConfig& c);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const ModelConfig& c, int64_t index);
  at::Tensor forward(const at::Tensor& x);  // with activation checkpointing when asked and grad is on
  at::Tensor forward_plain(const at::Tensor& x);
  // QAT (--qat-steps): the block's four Linear layers fake-quantize their input and weight, as
  // torchao's Int8DynActInt4WeightQATQuantizer does; 0: off.
  void set_fake_quant(int64_t weight_group_size, int64_t weight_bits = 4);

 private:
  at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b);
  int64_t heads_;
  bool checkpoint_;
  std::shared_ptr<lowbit::qat::FakeQuantizerImpl> fq_act_, fq_weight_;  // null: no fake quantization
  at::Tensor ln1_w_, ln1_b_, qkv_w_, qkv_b_, proj_w_, proj_b_, ln2_w_, ln2_b_, fc_w_, fc_b_, fc_proj_w_, fc_proj_b_;
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  explicit GPTImpl(const ModelConfig& c);
  at::Tensor forward(const at::Tensor& idx);                            // logits [B, T, vocab]
  at::Tensor loss(const at::Tensor& idx, const at::Tensor& targets);    // mean cross-entropy, fp32
  const ModelConfig& config() const { return cfg_; }
  // Every block's Linear layers (not the embeddings or the tied head): int8 asymmetric per-token
  // activations, int4 symmetric weights in groups of `weight_group_size` along the input; 0: off.
  void set_fake_quant(int64_t weight_group_size, int64_t weight_bits = 4);

  // Fully sharded training (--fully-sharded): forward runs through `whole` (the root's parameters
  // gathered around it) and each block b through unit(b, its forward); null: plain calls.
  using Fn = std::function<at::Tensor()>;
  void run_through(std::function<at::Tensor(const Fn&)> whole, std::function<at::Tensor(size_t, const Fn&)> unit);
  std::vector<std::shared_ptr<torch::nn::Module>> block_modules() const;
  // --init keyed: elements [first, first + values.numel()) of the flattened parameter `name` (its name
  // in this model, "h3.qkv_w") written into values: GPT-2's initialization, keyed by element index.
  void init_values(const std::string& name, int64_t first, const at::Tensor& values) const;

 private:
  std::function<at::Tensor(const Fn&)> whole_;
  std::function<at::Tensor(size_t, const Fn&)> unit_;
  ModelConfig cfg_;
  at::Tensor wte_, wpe_, lnf_w_, lnf_b_;
  std::vector<Block> blocks_;
};
TORCH_MODULE(GPT);

}  // namespace gpt
