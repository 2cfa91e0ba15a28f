// The GPT model and activation checkpointing.
//
// libtorch's C++ API has no torch::utils::checkpoint. CheckpointedBlock is the reentrant variant of
// PyTorch's checkpoint as a custom autograd Function: forward runs the block without recording a
// graph and saves only its input; backward recomputes the block from that input with grad on and
// runs a nested backward through it, which accumulates the block's parameter gradients into
// .grad (as a plain backward does) and yields the input's gradient. The model has no dropout, so
// the recomputation is exactly the forward that ran.
#include "model.h"

#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

namespace gpt {

namespace {

struct CheckpointedBlock : public torch::autograd::Function<CheckpointedBlock> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, BlockImpl* block) {
    ctx->save_for_backward({x});
    ctx->saved_data["block"] = reinterpret_cast<int64_t>(block);
    return block->forward_plain(x);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto* block = reinterpret_cast<BlockImpl*>(ctx->saved_data["block"].toInt());
    const at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Tensor y;
    {
      torch::AutoGradMode grad_on(true);
      y = block->forward_plain(x);
    }
    torch::autograd::backward({y}, {grad_out[0]});
    return {x.grad(), at::Tensor()};
  }
};

at::Tensor param(torch::nn::Module& m, const std::string& name, at::IntArrayRef shape, const ModelConfig& c) {
  return m.register_parameter(name, at::empty(shape, at::TensorOptions().dtype(c.dtype).device(c.device)));
}

// GPT-2's initialization, by a parameter's name ("h3.qkv_w" or its last part): weights N(0, 0.02),
// the residual projections' scaled by 1/sqrt(2 * layers), the position embedding's N(0, 0.01);
// LayerNorm weights 1, biases 0.
struct Init {
  bool normal;   // N(0, value), else the constant value
  double value;
};

Init init_of(const std::string& name, const ModelConfig& c) {
  const std::string leaf = name.substr(name.rfind('.') + 1);  // npos + 1 == 0: the whole name
  if (leaf == "wpe") return {true, 0.01};
  if (leaf == "proj_w" || leaf == "fc_proj_w") return {true, 0.02 / std::sqrt(2.0 * c.layers)};
  if (leaf.size() > 2 && leaf.compare(leaf.size() - 2, 2, "_b") == 0) return {false, 0.0};
  if (leaf.rfind("ln", 0) == 0) return {false, 1.0};
  return {true, 0.02};
}

// Torch's generator, drawn on c.init_device where set; the caller's order of calls is the order
// values are drawn in.
void init_with_torch(at::Tensor& w, const std::string& name, const ModelConfig& c) {
  const Init i = init_of(name, c);
  if (!i.normal) {
    w.fill_(i.value);
  } else if (!c.init_device || *c.init_device == w.device()) {
    w.normal_(0.0, i.value);
  } else {
    w.copy_(at::empty(w.sizes(), w.options().device(*c.init_device)).normal_(0.0, i.value));
  }
}

}  // namespace

int64_t count_params(const ModelConfig& c) {
  const int64_t d = c.width;
  const int64_t block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d);
  return c.vocab * d + c.context * d + c.layers * block + 2 * d;
}

BlockImpl::BlockImpl(const ModelConfig& c, int64_t index) : heads_(c.heads), checkpoint_(c.checkpoint_activations) {
  const int64_t d = c.width;
  ln1_w_ = param(*this, "ln1_w", {d}, c);
  ln1_b_ = param(*this, "ln1_b", {d}, c);
  qkv_w_ = param(*this, "qkv_w", {3 * d, d}, c);
  qkv_b_ = param(*this, "qkv_b", {3 * d}, c);
  proj_w_ = param(*this, "proj_w", {d, d}, c);
  proj_b_ = param(*this, "proj_b", {d}, c);
  ln2_w_ = param(*this, "ln2_w", {d}, c);
  ln2_b_ = param(*this, "ln2_b", {d}, c);
  fc_w_ = param(*this, "fc_w", {4 * d, d}, c);
  fc_b_ = param(*this, "fc_b", {4 * d}, c);
  fc_proj_w_ = param(*this, "fc_proj_w", {d, 4 * d}, c);
  fc_proj_b_ = param(*this, "fc_proj_b", {d}, c);
  if (!c.initialize || c.keyed_init) return;  // keyed: GPTImpl's constructor or the shards' owners
  torch::NoGradGuard ng;
  for (const auto& [name, w] : std::initializer_list<std::pair<const char*, at::Tensor*>>{
           {"ln1_w", &ln1_w_}, {"ln2_w", &ln2_w_}, {"ln1_b", &ln1_b_}, {"ln2_b", &ln2_b_}, {"qkv_b", &qkv_b_},
           {"proj_b", &proj_b_}, {"fc_b", &fc_b_}, {"fc_proj_b", &fc_proj_b_}, {"qkv_w", &qkv_w_}, {"fc_w", &fc_w_},
           {"proj_w", &proj_w_}, {"fc_proj_w", &fc_proj_w_}})
    init_with_torch(*w, name, c);
  (void)index;
}

void BlockImpl::set_fake_quant(int64_t weight_group_size, int64_t weight_bits) {
  namespace lq = lowbit::qat;
  if (weight_group_size == 0) {
    fq_act_.reset(), fq_weight_.reset();
    return;
  }
  fq_act_ = std::make_shared<lq::FakeQuantizerImpl>(lq::FakeQuantConfig::int8_per_token_asymmetric(), "block input");
  fq_weight_ = std::make_shared<lq::FakeQuantizerImpl>(
      lq::FakeQuantConfig(weight_bits, true).symmetric(true).granularity(lq::Granularity::PerGroup).group_size(weight_group_size),
      "block weight");
}

at::Tensor BlockImpl::linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  if (!fq_act_) return at::linear(x, w, b);
  return at::linear(fq_act_->forward(x), fq_weight_->forward(w), b);
}

at::Tensor BlockImpl::forward_plain(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), d = x.size(2), hd = d / heads_;
  at::Tensor h = at::layer_norm(x, {d}, ln1_w_, ln1_b_, 1e-5);
  const auto qkv = linear(h, qkv_w_, qkv_b_).split(d, -1);
  auto heads = [&](const at::Tensor& t) { return t.view({B, T, heads_, hd}).transpose(1, 2); };
  at::Tensor y = at::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), {}, 0.0, /*is_causal=*/true);
  y = y.transpose(1, 2).reshape({B, T, d});
  at::Tensor r = x + linear(y, proj_w_, proj_b_);
  h = at::gelu(linear(at::layer_norm(r, {d}, ln2_w_, ln2_b_, 1e-5), fc_w_, fc_b_), "tanh");
  return r + linear(h, fc_proj_w_, fc_proj_b_);
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  if (checkpoint_ && torch::GradMode::is_enabled() && x.requires_grad()) return CheckpointedBlock::apply(x, this);
  return forward_plain(x);
}

GPTImpl::GPTImpl(const ModelConfig& c) : cfg_(c) {
  TORCH_CHECK(c.width % c.heads == 0, "--width ", c.width, " is not a multiple of --heads ", c.heads);
  wte_ = param(*this, "wte", {c.vocab, c.width}, c);
  wpe_ = param(*this, "wpe", {c.context, c.width}, c);
  const bool torch_init = c.initialize && !c.keyed_init;
  if (torch_init) {
    torch::NoGradGuard ng;
    init_with_torch(wte_, "wte", c);
    init_with_torch(wpe_, "wpe", c);
  }
  for (int64_t i = 0; i < c.layers; ++i) blocks_.push_back(register_module("h" + std::to_string(i), Block(c, i)));
  lnf_w_ = param(*this, "lnf_w", {c.width}, c);
  lnf_b_ = param(*this, "lnf_b", {c.width}, c);
  if (!c.initialize) return;
  torch::NoGradGuard ng;
  if (torch_init) {
    init_with_torch(lnf_w_, "lnf_w", c);
    init_with_torch(lnf_b_, "lnf_b", c);
    return;
  }
  for (const auto& item : named_parameters()) init_values(item.key(), 0, item.value().view({-1}));
}

void GPTImpl::init_values(const std::string& name, int64_t first, const at::Tensor& values) const {
  const Init i = init_of(name, cfg_);
  if (i.normal)
    lowbit::keyed_normal_(values, 0.0, i.value, lowbit::keyed_random_key(name, cfg_.seed), first);
  else
    values.fill_(i.value);
}

void GPTImpl::set_fake_quant(int64_t weight_group_size, int64_t weight_bits) {
  TORCH_CHECK(weight_group_size == 0 || cfg_.width % weight_group_size == 0, "--qat-group ", weight_group_size,
              " does not divide --width ", cfg_.width);
  for (Block& b : blocks_) b->set_fake_quant(weight_group_size, weight_bits);
}

void GPTImpl::run_through(std::function<at::Tensor(const Fn&)> whole, std::function<at::Tensor(size_t, const Fn&)> unit) {
  whole_ = std::move(whole);
  unit_ = std::move(unit);
}

std::vector<std::shared_ptr<torch::nn::Module>> GPTImpl::block_modules() const {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (const Block& b : blocks_) out.push_back(b.ptr());
  return out;
}

at::Tensor GPTImpl::forward(const at::Tensor& idx) {
  const int64_t T = idx.size(1);
  TORCH_CHECK(T <= cfg_.context, "sequence of ", T, " tokens is longer than --context ", cfg_.context);
  const Fn body = [&] {
    at::Tensor x = at::embedding(wte_, idx) + wpe_.narrow(0, 0, T);
    for (size_t b = 0; b < blocks_.size(); ++b)
      x = unit_ ? unit_(b, [&] { return blocks_[b]->forward(x); }) : blocks_[b]->forward(x);
    x = at::layer_norm(x, {cfg_.width}, lnf_w_, lnf_b_, 1e-5);
    return at::linear(x, wte_);  // tied head
  };
  return whole_ ? whole_(body) : body();
}

at::Tensor GPTImpl::loss(const at::Tensor& idx, const at::Tensor& targets) {
  const at::Tensor logits = forward(idx);
  return at::cross_entropy_loss(logits.reshape({-1, cfg_.vocab}).to(at::kFloat), targets.reshape({-1}));
}

}  // namespace gpt
