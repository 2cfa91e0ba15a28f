// Checkpoints an older lowbit wrote still load: Q4's second moments were Linear4Unsigned before
// Log4Unsigned (optim/state_format.h: legacy_quant_format_for). Such a slot keeps its format, so
// the load changes no value, and it goes on stepping in it.
#include <torch/serialize.h>

#include <lowbit/optim/checkpoint_reader.h>

#include "test_util.h"

namespace lo = lowbit::optim;
using lowbit::QuantFormat;
using lowbit::StateFormat;

namespace {

// The checkpoint `saved` with every Q4 second moment (slot 1) re-quantized to Linear4Unsigned,
// digests recomputed: what lowbit wrote before Log4Unsigned.
void write_legacy_q4(torch::serialize::InputArchive& saved, torch::serialize::OutputArchive& out) {
  std::map<std::string, c10::IValue> entries;
  std::map<std::string, at::Tensor> tensors;
  for (const std::string& key : saved.keys()) {
    c10::IValue v;
    ASSERT_TRUE(saved.try_read(key, v)) << key;
    if (v.isTensor()) tensors[key] = v.toTensor();
    else entries[key] = v;
  }
  entries.erase("lowbit/header_digest");
  for (auto& [key, v] : entries) {
    const std::string suffix = "/slot/1/qformat";
    if (key.size() < suffix.size() || key.compare(key.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    if (v.toInt() != static_cast<int64_t>(QuantFormat::Log4Unsigned)) continue;
    const std::string sk = key.substr(0, key.size() - std::string("/qformat").size());
    const int64_t numel = entries.at(sk.substr(0, sk.find("/slot/")) + "/numel").toInt();
    const lowbit::QTensor now(tensors.at(sk + "/codes"), tensors.at(sk + "/absmax"), {numel}, QuantFormat::Log4Unsigned, 128);
    const lowbit::QTensor old = lowbit::quantize(now.dequantize(), QuantFormat::Linear4Unsigned, 128);
    v = c10::IValue(static_cast<int64_t>(QuantFormat::Linear4Unsigned));
    tensors[sk + "/codes"] = old.codes();
    tensors[sk + "/absmax"] = old.absmax();
  }
  for (const auto& [key, t] : tensors) entries[key + "/digest"] = c10::IValue(lo::tensor_digest(key, t));
  for (const auto& [key, v] : entries) out.write(key, v);
  for (const auto& [key, t] : tensors) out.write(key, t);
  out.write("lowbit/header_digest", c10::IValue(lo::header_digest(entries)));
}

}  // namespace

TEST(CheckpointLegacy, Q4WithLinear4SecondMomentsLoadsAndStepsInIt) {
  const int64_t n = 5000;
  at::Tensor p = lowbit_test::random_input(n).requires_grad_(true);
  lo::AdamW opt({p}, lo::AdamWOptions(1e-3).state_format(StateFormat::Q4));
  for (int t = 0; t < 2; ++t) {
    p.mutable_grad() = lowbit_test::random_input(n);
    opt.step();
  }
  ASSERT_EQ(opt.state_of(p)->slots[1].quantized.format(), QuantFormat::Log4Unsigned);
  torch::serialize::OutputArchive saved;
  opt.save(saved);
  std::stringstream buf;
  saved.save_to(buf);
  torch::serialize::InputArchive in;
  in.load_from(buf);
  torch::serialize::OutputArchive legacy;
  write_legacy_q4(in, legacy);
  std::stringstream legacy_buf;
  legacy.save_to(legacy_buf);

  at::Tensor q = p.detach().clone().requires_grad_(true);
  lo::AdamW loaded({q}, lo::AdamWOptions(1e-3).state_format(StateFormat::Q4));
  torch::serialize::InputArchive legacy_in;
  legacy_in.load_from(legacy_buf);
  loaded.load(legacy_in);
  const lowbit::QTensor& v = loaded.state_of(q)->slots[1].quantized;
  ASSERT_EQ(v.format(), QuantFormat::Linear4Unsigned);
  // Nothing changed by the load: the decoded state is the legacy file's.
  const at::Tensor want_v = lowbit::quantize(opt.export_state_fp32(p).at(1).flatten(), QuantFormat::Linear4Unsigned, 128)
                                .dequantize();
  EXPECT_TRUE(lowbit_test::bitwise_equal(loaded.export_state_fp32(q).at(1).flatten(), want_v));
  EXPECT_TRUE(lowbit_test::bitwise_equal(loaded.export_state_fp32(q).at(0), opt.export_state_fp32(p).at(0)));
  // It steps on in Linear4Unsigned, to finite values, and saves and loads again as such.
  q.mutable_grad() = lowbit_test::random_input(n);
  loaded.step();
  EXPECT_EQ(loaded.state_of(q)->slots[1].quantized.format(), QuantFormat::Linear4Unsigned);
  EXPECT_TRUE(q.isfinite().all().item<bool>());
  EXPECT_TRUE((loaded.export_state_fp32(q).at(1) > 0).all().item<bool>());
  torch::serialize::OutputArchive again;
  loaded.save(again);
  std::stringstream again_buf;
  again.save_to(again_buf);
  torch::serialize::InputArchive again_in;
  again_in.load_from(again_buf);
  lo::AdamW reloaded({q.detach().clone().requires_grad_(true)}, lo::AdamWOptions(1e-3).state_format(StateFormat::Q4));
  EXPECT_NO_THROW(reloaded.load(again_in));
}
