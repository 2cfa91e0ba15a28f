// Module-tree walks of prepare / convert / enable: see prepare_convert.h.
#include "prepare_convert.h"

#include <functional>
#include <optional>

#include "fake_quantized_modules.h"
#include "quantized_modules.h"

namespace lowbit {
namespace qat {
namespace {

using ModulePtr = std::shared_ptr<torch::nn::Module>;
// A replacement for the module at `name`, or nullopt to keep it (and walk into it).
using SwapFn = std::function<std::optional<torch::nn::AnyModule>(const std::string& name, const ModulePtr&)>;

std::string join(const std::string& prefix, const std::string& name) { return prefix.empty() ? name : prefix + "." + name; }

// Returns the module to put in place of m: m itself (children swapped in place), a replacement
// from `swap`, or a rebuilt Sequential. `any` receives the replacement's AnyModule when there is one.
ModulePtr walk(const std::string& prefix, const ModulePtr& m, const SwapFn& swap, std::optional<torch::nn::AnyModule>* any) {
  if (auto r = swap(prefix, m)) {
    *any = r;
    return r->ptr();
  }
  if (auto seq = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(m)) {
    auto out = std::make_shared<torch::nn::SequentialImpl>();
    const auto names = seq->named_children().keys();
    bool changed = false;
    size_t i = 0;
    for (auto it = seq->begin(); it != seq->end(); ++it, ++i) {
      std::optional<torch::nn::AnyModule> rep;
      const ModulePtr child = it->ptr();
      const ModulePtr got = walk(join(prefix, names[i]), child, swap, &rep);
      TORCH_CHECK(got == child || rep, "lowbit::qat: cannot rebuild Sequential '", join(prefix, names[i]),
                  "' inside Sequential '", prefix, "'");
      if (rep) {
        out->push_back(names[i], *rep);
        changed = true;
      } else {
        out->push_back(names[i], *it);
      }
    }
    return changed ? out : m;
  }
  for (const auto& item : m->named_children()) {
    std::optional<torch::nn::AnyModule> rep;
    const ModulePtr got = walk(join(prefix, item.key()), item.value(), swap, &rep);
    if (got != item.value()) m->replace_module(item.key(), got);
  }
  return m;
}

ModulePtr walk_root(const ModulePtr& root, const SwapFn& swap) {
  TORCH_CHECK(root != nullptr, "lowbit::qat: the module is null");
  std::optional<torch::nn::AnyModule> rep;
  return walk("", root, swap, &rep);
}

template <typename M>
std::optional<torch::nn::AnyModule> any_of(std::shared_ptr<M> m) {
  return torch::nn::AnyModule(std::move(m));
}

template <typename F>
void for_each_quantizer(const ModulePtr& root, F f) {
  for (const auto& m : root->modules(/*include_self=*/true))
    if (auto q = std::dynamic_pointer_cast<FakeQuantizerImpl>(m)) f(*q);
}

}  // namespace

ModulePtr prepare(const ModulePtr& root, const QatConfig& config) {
  return walk_root(root, [&](const std::string& name, const ModulePtr& m) -> std::optional<torch::nn::AnyModule> {
    const std::string who = name.empty() ? "(root)" : name;
    if (config.filter() && !config.filter()(name, *m)) return std::nullopt;
    if (auto lin = std::dynamic_pointer_cast<torch::nn::LinearImpl>(m)) {
      if (!config.activation() && !config.weight()) return std::nullopt;
      auto fq = std::make_shared<FakeQuantizedLinearImpl>(torch::nn::Linear(lin), config.activation(), config.weight(), who);
      if (fq->activation_fake_quant) fq->activation_fake_quant->set_start_step(config.start_step());
      if (fq->weight_fake_quant) fq->weight_fake_quant->set_start_step(config.start_step());
      return any_of(fq);
    }
    if (auto emb = std::dynamic_pointer_cast<torch::nn::EmbeddingImpl>(m)) {
      if (!config.embedding()) return std::nullopt;
      auto fq = std::make_shared<FakeQuantizedEmbeddingImpl>(torch::nn::Embedding(emb), *config.embedding(), who);
      fq->weight_fake_quant->set_start_step(config.start_step());
      return any_of(fq);
    }
    return std::nullopt;
  });
}

ModulePtr convert(const ModulePtr& root) {
  return walk_root(root, [](const std::string&, const ModulePtr& m) -> std::optional<torch::nn::AnyModule> {
    if (auto fq = std::dynamic_pointer_cast<FakeQuantizedLinearImpl>(m)) {
      if (!fq->weight_fake_quant) return std::nullopt;  // activation-only: nothing to store in low bits
      return any_of(QuantizedLinearImpl::from_fake_quantized(*fq));
    }
    if (auto fq = std::dynamic_pointer_cast<FakeQuantizedEmbeddingImpl>(m)) {
      return any_of(QuantizedEmbeddingImpl::from_fake_quantized(*fq));
    }
    return std::nullopt;
  });
}

void enable_fake_quant(const ModulePtr& root, bool on) {
  for_each_quantizer(root, [on](FakeQuantizerImpl& q) { q.enable(on); });
}

void set_start_step(const ModulePtr& root, int64_t steps) {
  for_each_quantizer(root, [steps](FakeQuantizerImpl& q) { q.set_start_step(steps); });
}

torch::nn::Sequential prepare(const torch::nn::Sequential& root, const QatConfig& config) {
  return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(prepare(std::static_pointer_cast<torch::nn::Module>(root.ptr()), config)));
}

torch::nn::Sequential convert(const torch::nn::Sequential& root) {
  return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(convert(std::static_pointer_cast<torch::nn::Module>(root.ptr()))));
}

}  // namespace qat
}  // namespace lowbit
