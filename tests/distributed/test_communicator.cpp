// The collectives on the job's communicator against values every rank can compute itself. The
// checks take the communicator, so every backend runs them (test_process_group_communicator.cpp).
#include "dist_util.h"

namespace lowbit_test {

void expect_expected_values(ld::Communicator& c) {
  const int r = c.rank(), n = c.size();
  const auto opts = at::TensorOptions().device(device());
  for (at::ScalarType t : {at::kFloat, at::kDouble, at::kBFloat16, at::kLong}) {
    SCOPED_TRACE(c10::toString(t));
    at::Tensor x = at::arange(10, opts.dtype(at::kFloat)).add(r).to(t);
    c.all_reduce(x, ld::ReduceOp::Sum);
    at::Tensor want = (at::arange(10, at::kFloat) * n + n * (n - 1) / 2).to(t);
    EXPECT_TRUE(bitwise_equal(x, want));
    if (t == at::kLong) continue;
    at::Tensor a = at::full({6}, static_cast<double>(r + 1), opts.dtype(t));
    c.all_reduce(a, ld::ReduceOp::Avg);
    EXPECT_TRUE(bitwise_equal(a.to(at::kFloat), at::full({6}, (n * (n + 1) / 2.0f) / n, at::kFloat).to(t).to(at::kFloat)));
    // reduce_scatter: chunk c of rank r holds r * 100 + c; rank c receives sum_r (r * 100 + c).
    at::Tensor in = (at::arange(n, opts.dtype(at::kFloat)).repeat_interleave(3) + r * 100).to(t);
    at::Tensor out = at::empty({3}, opts.dtype(t));
    c.reduce_scatter(in, out, ld::ReduceOp::Sum);
    EXPECT_TRUE(bitwise_equal(out, at::full({3}, 100.0 * n * (n - 1) / 2 + r * n, at::kFloat).to(t)));
    // all_gather, in place and from a separate input.
    at::Tensor g = at::zeros({2 * n}, opts.dtype(t));
    g.narrow(0, 2 * r, 2).fill_(r + 1);
    c.all_gather(g.narrow(0, 2 * r, 2), g);
    at::Tensor g2 = at::zeros({2 * n}, opts.dtype(t));
    c.all_gather(at::full({2}, r + 1, opts.dtype(t)), g2);
    at::Tensor gw = (at::arange(n, at::kFloat) + 1).repeat_interleave(2).to(t);
    EXPECT_TRUE(bitwise_equal(g, gw));
    EXPECT_TRUE(bitwise_equal(g2, gw));
    at::Tensor b = at::full({5}, r == n - 1 ? 7.0 : 0.0, opts.dtype(t));
    c.broadcast(b, n - 1);
    EXPECT_TRUE(bitwise_equal(b, at::full({5}, 7.0, at::kFloat).to(t)));
  }
  c.barrier();
}

void expect_bad_arguments_named(ld::Communicator& c) {
  const int n = c.size();
  const auto opts = at::TensorOptions().device(device());
  at::Tensor out = at::empty({3}, opts);
  try {
    c.reduce_scatter(at::zeros({3 * n + 1}, opts), out);
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_scatter: input has " + std::to_string(3 * n + 1) + " elements"),
              std::string::npos) << e.what();
  }
  at::Tensor nc = at::zeros({4, 4}, opts).t();
  EXPECT_THROW(c.all_reduce(nc), c10::Error);
  at::Tensor b = at::zeros({2}, opts);
  EXPECT_THROW(c.broadcast(b, n), c10::Error);
  EXPECT_THROW(c.all_gather(at::zeros({2}, opts.dtype(at::kDouble)), out), c10::Error);
  c.barrier();  // still usable: nothing was started
}

namespace {

TEST(Communicator, CollectivesGiveTheExpectedValues) { expect_expected_values(comm()); }

TEST(Communicator, BadArgumentsAreNamedAndChangeNothing) { expect_bad_arguments_named(comm()); }

}  // namespace
}  // namespace lowbit_test
