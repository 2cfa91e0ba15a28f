// Optimizer checkpoints: quantized state saved as codes + absmax, resumed runs bit-exact, bad
// checkpoints refused with the optimizer left as it was.
#include <filesystem>
#include <fstream>

#include "test_util.h"

using lowbit::StateFormat;
namespace lo = lowbit::optim;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("lowbit_test_" + std::to_string(getpid()) + "_" + name)).string();
}

std::vector<at::Tensor> params() { return {at::randn({5000}), at::randn({300}), at::randn({40001})}; }

std::vector<std::vector<at::Tensor>> grad_stream(const std::vector<at::Tensor>& p, int n) {
  std::vector<std::vector<at::Tensor>> out;
  for (int s = 0; s < n; ++s) {
    std::vector<at::Tensor> g;
    for (const auto& t : p) g.push_back(at::randn(t.sizes()) * 0.1);
    out.push_back(g);
  }
  return out;
}

void train(lo::LowbitOptimizer& opt, std::vector<at::Tensor>& p, const std::vector<std::vector<at::Tensor>>& gs,
           int from, int to) {
  for (int s = from; s < to; ++s) {
    for (size_t i = 0; i < p.size(); ++i) p[i].mutable_grad() = gs[s][i].clone();
    opt.step();
  }
}

}  // namespace

TEST(Checkpoint, ResumeIsBitExactForEveryFormat) {
  for (StateFormat f : {StateFormat::FP32, StateFormat::BF16, StateFormat::Q8, StateFormat::Q4, StateFormat::FP8}) {
    auto p0 = params();
    const auto gs = grad_stream(p0, 100);
    std::vector<at::Tensor> a, b;
    for (auto& t : p0) {
      a.push_back(t.clone());
      b.push_back(t.clone());
    }
    const auto opts = lo::AdamWOptions(1e-2).state_format(f);
    lo::AdamW straight(a, opts);
    train(straight, a, gs, 0, 100);

    lo::AdamW first(b, opts);
    train(first, b, gs, 0, 50);
    const std::string path = temp_path(std::string("resume_") + lowbit::state_format_name(f));
    torch::save(first, path);
    lo::AdamW resumed(b, opts);
    torch::load(resumed, path);
    EXPECT_EQ(resumed.state_bytes(), first.state_bytes());
    train(resumed, b, gs, 50, 100);
    std::filesystem::remove(path);
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(lowbit_test::bitwise_equal(a[i], b[i])) << lowbit::state_format_name(f) << " param " << i;
  }
}

TEST(Checkpoint, QuantizedStateIsStoredCompact) {
  std::vector<at::Tensor> p = {at::randn({1 << 20})};
  lo::AdamW opt(p, lo::AdamWOptions().state_format(StateFormat::Q4));
  p[0].mutable_grad() = at::randn({1 << 20});
  opt.step();
  const std::string path = temp_path("compact");
  torch::save(opt, path);
  const auto size = std::filesystem::file_size(path);
  std::filesystem::remove(path);
  EXPECT_LT(size, 1.2 * opt.state_bytes());  // never expanded to fp32
}

TEST(Checkpoint, MismatchedOrCorruptCheckpointsAreRefusedAndChangeNothing) {
  auto p = params();
  lo::AdamW opt(p, lo::AdamWOptions().state_format(StateFormat::Q8));
  const auto gs = grad_stream(p, 3);
  train(opt, p, gs, 0, 3);
  const std::string path = temp_path("mismatch");
  torch::save(opt, path);

  auto check_unchanged = [&](lo::AdamW& target, const std::function<void()>& load, const std::string& want) {
    const int64_t bytes = target.state_bytes();
    const auto st = target.export_state_fp32(target.param_groups()[0].params()[0]);
    try {
      load();
      ADD_FAILURE() << "expected an error containing: " << want;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find(want), std::string::npos) << e.what_without_backtrace();
    }
    EXPECT_EQ(target.state_bytes(), bytes);
    const auto after = target.export_state_fp32(target.param_groups()[0].params()[0]);
    for (size_t k = 0; k < st.size(); ++k) EXPECT_TRUE(lowbit_test::bitwise_equal(st[k], after[k]));
  };

  // Different parameter shapes.
  std::vector<at::Tensor> other = {at::randn({5000}), at::randn({301}), at::randn({40001})};
  lo::AdamW wrong_shape(other, lo::AdamWOptions());
  check_unchanged(wrong_shape, [&] { torch::load(wrong_shape, path); }, "has 301 elements but the checkpoint's has 300");
  // Different parameter count.
  std::vector<at::Tensor> fewer = {p[0].clone(), p[1].clone()};
  lo::AdamW wrong_count(fewer, lo::AdamWOptions());
  check_unchanged(wrong_count, [&] { torch::load(wrong_count, path); }, "has 3 parameters");
  // A checkpoint of another optimizer.
  lo::Lion lion(p, lo::LionOptions());
  EXPECT_THROW(torch::load(lion, path), c10::Error);
  // Truncated file: the optimizer that already trained keeps its state.
  const std::string cut = temp_path("truncated");
  {
    std::ifstream in(path, std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(cut, std::ios::binary);
    out.write(data.data(), static_cast<std::streamsize>(data.size() / 2));
  }
  check_unchanged(opt, [&] { torch::load(opt, cut); }, "");
  // Not a lowbit checkpoint at all.
  torch::optim::AdamW plain(p, torch::optim::AdamWOptions());
  const std::string foreign = temp_path("foreign");
  torch::save(plain, foreign);
  check_unchanged(opt, [&] { torch::load(opt, foreign); }, "not a lowbit optimizer checkpoint");
  for (const auto& f : {path, cut, foreign}) std::filesystem::remove(f);
}
