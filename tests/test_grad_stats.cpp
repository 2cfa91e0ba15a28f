// The gradient pre-pass of the optimizer step (kernels/cpu/grad_stats_cpu.h) against ATen.
#include <gtest/gtest.h>
#include <omp.h>
#include <torch/torch.h>

#include <cmath>

#include <lowbit/kernels/cpu/grad_stats_cpu.h>

namespace lk = lowbit::kernels;

namespace {

lk::GradRef ref_of(const at::Tensor& t) {
  const lk::ElemType type = t.scalar_type() == at::kFloat      ? lk::ElemType::F32
                            : t.scalar_type() == at::kBFloat16 ? lk::ElemType::BF16
                                                               : lk::ElemType::F16;
  return {t.data_ptr(), type, t.numel()};
}

struct Stats {
  std::vector<uint8_t> finite;
  std::vector<double> sumsq;
};

Stats run(const std::vector<at::Tensor>& ts, bool want_sumsq) {
  std::vector<lk::GradRef> refs;
  for (const auto& t : ts) refs.push_back(ref_of(t));
  Stats s{std::vector<uint8_t>(ts.size(), 7), std::vector<double>(ts.size(), -1.0)};
  lk::grad_stats_cpu(refs.data(), static_cast<int64_t>(refs.size()), want_sumsq, s.finite.data(), s.sumsq.data());
  return s;
}

}  // namespace

TEST(GradStats, SumOfSquaresMatchesAtenInEveryDtype) {
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    // Sizes around the chunk and the 16 partial sums, an empty tensor, huge and tiny magnitudes.
    std::vector<at::Tensor> ts = {at::randn({lk::kGradChunk * 3 + 17}).to(dt), at::randn({1}).to(dt),
                                  at::empty({0}, at::TensorOptions().dtype(dt)), at::randn({15}).to(dt),
                                  (at::randn({1000}) * (dt == at::kHalf ? 1e4 : 1e30)).to(dt),
                                  (at::randn({999}) * 1e-5).to(dt)};
    const Stats s = run(ts, true);
    for (size_t i = 0; i < ts.size(); ++i) {
      const double want = ts[i].to(at::kDouble).pow(2).sum().item<double>();
      EXPECT_EQ(s.finite[i], 1) << c10::toString(dt) << " tensor " << i;
      EXPECT_NEAR(s.sumsq[i], want, 1e-12 * want) << c10::toString(dt) << " tensor " << i;
    }
  }
}

TEST(GradStats, FindsEveryNonFiniteValueAnywhere) {
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      for (int64_t pos : {int64_t(0), lk::kGradChunk - 1, lk::kGradChunk, 2 * lk::kGradChunk + 100}) {
        at::Tensor a = at::randn({2 * lk::kGradChunk + 101}).to(dt), b = at::randn({33}).to(dt);
        a[pos] = bad;
        for (bool want_sumsq : {false, true}) {
          const Stats s = run({b, a}, want_sumsq);
          EXPECT_EQ(s.finite[0], 1);
          EXPECT_EQ(s.finite[1], 0) << c10::toString(dt) << " " << bad << " at " << pos;
        }
      }
    }
  }
}

TEST(GradStats, ResultDoesNotDependOnThreadCount) {
  const int saved = omp_get_max_threads();
  std::vector<at::Tensor> ts = {at::randn({lk::kGradChunk * 5 + 3}), at::randn({777})};
  omp_set_num_threads(1);
  const Stats one = run(ts, true);
  omp_set_num_threads(2);
  const Stats two = run(ts, true);
  omp_set_num_threads(saved);
  for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(one.sumsq[i], two.sumsq[i]);
}
