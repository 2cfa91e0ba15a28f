// LAMB's first pass (kernels/cpu/optim_step_cpu.h: lamb_norms_cpu), whose sums set the trust ratio:
// the AVX-512 loop and the scalar loop add in the documented order, checked against an fp64 loop
// here that adds in that order, exactly (== on doubles), at 1 and 3 threads.
#include <gtest/gtest.h>
#include <omp.h>
#include <torch/torch.h>

#include <lowbit/kernels/common/optim_rules.h>
#include <lowbit/kernels/cpu/optim_step_cpu.h>

namespace lk = lowbit::kernels;

namespace {

struct Param {
  at::Tensor p, g, m, v;
};

// p^2 and r^2 summed as documented: element i of a block into partial i mod 16, partials in order,
// the block sums of each group of 256 blocks in order, the groups' sums in order.
std::pair<double, double> expected_sums(const Param& x, const lk::Hyper& h, float grad_scale, int64_t block) {
  const float* p = x.p.data_ptr<float>();
  const float* g = x.g.data_ptr<float>();
  const float* m = x.m.data_ptr<float>();
  const float* v = x.v.data_ptr<float>();
  const int64_t n = x.p.numel();
  double pp = 0.0, rr = 0.0, group_p = 0.0, group_r = 0.0;
  for (int64_t b = 0; b * block < n; ++b) {
    double lp[16] = {}, lr[16] = {};
    for (int64_t i = 0; i < block && b * block + i < n; ++i) {
      const int64_t e = b * block + i;
      float gi = grad_scale != 1.0f ? g[e] * grad_scale : g[e];
      if (h.maximize) gi = -gi;
      const float st[2] = {m[e], v[e]};
      float mn, vn;
      const float r = lk::lamb_direction(h, gi, p[e], st, &mn, &vn);
      lp[i % 16] += static_cast<double>(p[e]) * p[e];
      lr[i % 16] += static_cast<double>(r) * r;
    }
    double sp = 0.0, sr = 0.0;
    for (int j = 0; j < 16; ++j) {
      sp += lp[j];
      sr += lr[j];
    }
    group_p += sp;
    group_r += sr;
    if ((b + 1) % 256 == 0 || (b + 1) * block >= n) {
      pp += group_p;
      rr += group_r;
      group_p = group_r = 0.0;
    }
  }
  return {pp, rr};
}

}  // namespace

TEST(LambNorms, BothLoopsAddInTheDocumentedOrder) {
  const int saved = omp_get_max_threads();
  // The per-step values come from the launch (config, counters, lr, loss scale), derived as the
  // kernels derive them; the expected sums are an fp64-accumulated loop of their own.
  lk::StepConfig config;
  config.rule = lk::Rule::LAMB;
  config.eps = 1e-6;
  config.weight_decay = 0.01;
  const double lr = 1e-3;
  for (bool maximize : {false, true}) {
    for (float loss_scale : {1.0f, 2.7f}) {
      config.maximize = maximize;
      const lk::Hyper h = lk::derive_hyper(config, 5, lr);
      const float grad_scale = lk::grad_multiplier(0.0, 0.0, loss_scale);
      // Sizes around the block and the 16 lanes: 1, a tail of 15, an odd size over many blocks (274:
      // two groups), one over four groups of 256 blocks with a ragged last block.
      std::vector<Param> params;
      for (int64_t n : {int64_t(1), int64_t(256 + 15), int64_t(70001), int64_t(256 * 256 * 3 + 77)}) {
        Param x{at::randn({n}) * 3, at::randn({n}) * 1e-2, at::randn({n}) * 1e-3, at::rand({n}) * 1e-5};
        params.push_back(x);
      }
      std::vector<at::Tensor> counters;
      std::vector<lk::StepParamRef> refs(params.size());
      for (size_t i = 0; i < params.size(); ++i) {
        counters.push_back(at::tensor({int64_t(4), int64_t(0)}));  // 4 steps taken: this is step 5
        lk::StepParamRef& r = refs[i];
        r.param = params[i].p.data_ptr();
        r.grad = params[i].g.data_ptr();
        r.numel = params[i].p.numel();
        r.slot[0] = params[i].m.data_ptr();
        r.slot[1] = params[i].v.data_ptr();
        r.counters = counters.back().data_ptr<int64_t>();
      }
      lk::StepLaunch step;
      step.config = config;
      step.slots[0] = step.slots[1] = {lk::SlotStorage::F32};
      step.num_slots = 2;
      step.block_size = 256;
      step.lr = &lr;
      step.grad_scale = &loss_scale;
      step.params = refs.data();
      step.n = static_cast<int64_t>(refs.size());
      for (bool vector_path : {true, false}) {
        for (int threads : {1, 3}) {
          omp_set_num_threads(threads);
          step.scalar_loop = !vector_path;
          std::vector<double> out(2 * refs.size(), -1.0);
          lk::lamb_norms_cpu(step, out.data());
          for (size_t i = 0; i < params.size(); ++i) {
            const auto [pp, rr] = expected_sums(params[i], h, grad_scale, 256);
            EXPECT_EQ(out[2 * i], pp) << "param " << i << " vector " << vector_path << " threads " << threads;
            EXPECT_EQ(out[2 * i + 1], rr) << "param " << i << " vector " << vector_path << " threads " << threads;
          }
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

// lowbit::lamb_add_block_sums: ranges of block sums added in LAMB's order (groups of 256 blocks in
// order, then the groups), against an fp64 loop written here; the CUDA kernel (one thread per
// group, the groups added by thread 0) bit for bit the CPU; bad ranges refused naming the range.
namespace {

at::Tensor add_block_sums_op(const at::Tensor& sums, const std::vector<int64_t>& first, const std::vector<int64_t>& count) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lowbit::lamb_add_block_sums", "")
                             .typed<at::Tensor(const at::Tensor&, at::IntArrayRef, at::IntArrayRef)>();
  return op.call(sums, first, count);
}

TEST(LambNorms, BlockSumsOfRangesAddInLambsOrderOnEveryDevice) {
  const int64_t blocks = 70001;
  // Values spread over many binades, so another order of the additions changes the bits.
  const at::Tensor sums = at::rand({blocks, 2}, at::kDouble) * at::exp(at::randn({blocks, 2}, at::kDouble) * 8);
  const std::vector<int64_t> first = {0, 5, 100, 0, 3000, 69000, 7};
  const std::vector<int64_t> count = {0, 1, 255, 256 * 3 + 1, 66000, 1001, 257};
  const at::Tensor got = add_block_sums_op(sums, first, count);
  ASSERT_EQ(got.sizes(), at::IntArrayRef({7, 2}));
  const double* s = sums.data_ptr<double>();
  for (size_t i = 0; i < first.size(); ++i)
    for (int k = 0; k < 2; ++k) {
      double total = 0.0;
      for (int64_t g = 0; g < count[i]; g += 256) {
        double group = 0.0;
        for (int64_t b = g; b < std::min<int64_t>(g + 256, count[i]); ++b) group += s[2 * (first[i] + b) + k];
        total += group;
      }
      EXPECT_EQ(got[i][k].item<double>(), total) << "range " << i << " sum " << k;
    }
  // One chain through every block (the order before the groups) differs: the test sees the order.
  double chain = 0.0;
  for (int64_t b = 3000; b < 69000; ++b) chain += s[2 * b];
  EXPECT_NE(got[4][0].item<double>(), chain);
  if (torch::cuda::is_available() && c10::Dispatcher::singleton()
                                         .findOp({"lowbit::lamb_add_block_sums", ""})
                                         ->hasKernelForDispatchKey(c10::DispatchKey::CUDA)) {
    const at::Tensor on_gpu = add_block_sums_op(sums.cuda(), first, count);
    EXPECT_TRUE(on_gpu.is_cuda());
    EXPECT_TRUE(at::equal(on_gpu.cpu(), got));
    // More ranges than one launch carries.
    std::vector<int64_t> f(300), c(300);
    for (int i = 0; i < 300; ++i) f[i] = i * 200, c[i] = 300 + i;
    EXPECT_TRUE(at::equal(add_block_sums_op(sums.cuda(), f, c).cpu(), add_block_sums_op(sums, f, c)));
  }
  EXPECT_EQ(add_block_sums_op(sums, {}, {}).size(0), 0);
}

TEST(LambNorms, BlockSumRangesOutsideTheSumsAreRefused) {
  const at::Tensor sums = at::zeros({10, 2}, at::kDouble);
  const auto error = [&](const at::Tensor& t, std::vector<int64_t> f, std::vector<int64_t> c) {
    try {
      add_block_sums_op(t, f, c);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string();
  };
  EXPECT_NE(error(sums, {5}, {6}).find("range 0 (first 5, count 6) is not inside the 10 blocks"), std::string::npos);
  EXPECT_NE(error(sums, {-1}, {1}).find("range 0"), std::string::npos);
  EXPECT_NE(error(sums, {0, 2}, {1, -1}).find("range 1"), std::string::npos);
  EXPECT_NE(error(sums, {0}, {}).find("first has 1 entries, count 0"), std::string::npos);
  EXPECT_NE(error(sums.to(at::kFloat), {0}, {1}).find("float64 tensor [blocks, 2]"), std::string::npos);
  EXPECT_NE(error(at::zeros({10, 3}, at::kDouble), {0}, {1}).find("[blocks, 2]"), std::string::npos);
}

}  // namespace
