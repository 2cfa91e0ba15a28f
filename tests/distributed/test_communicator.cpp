// The collectives on the job's communicator against values every rank can compute itself. The
// checks take the communicator, so every backend runs them (test_process_group_communicator.cpp).
#include "dist_util.h"

#include <lowbit/distributed/rank_agreement.h>

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
    // reduce_scatter: chunk c of rank r holds r * 4 + c; rank c receives sum_r (r * 4 + c). Up to 8
    // ranks every partial sum is an integer below 256, exact in bfloat16 whatever the order.
    at::Tensor in = (at::arange(n, opts.dtype(at::kFloat)).repeat_interleave(3) + r * 4).to(t);
    at::Tensor out = at::empty({3}, opts.dtype(t));
    c.reduce_scatter(in, out, ld::ReduceOp::Sum);
    EXPECT_TRUE(bitwise_equal(out, at::full({3}, 4.0 * n * (n - 1) / 2 + r * n, at::kFloat).to(t)));
    // all_gather, in place and from a separate input.
    at::Tensor g = at::zeros({2 * n}, opts.dtype(t));
    g.narrow(0, 2 * r, 2).fill_(r + 1);
    c.all_gather(g.narrow(0, 2 * r, 2), g);
    at::Tensor g2 = at::zeros({2 * n}, opts.dtype(t));
    c.all_gather(at::full({2}, r + 1, opts.dtype(t)), g2);
    at::Tensor gw = (at::arange(n, at::kFloat) + 1).repeat_interleave(2).to(t);
    EXPECT_TRUE(bitwise_equal(g, gw));
    EXPECT_TRUE(bitwise_equal(g2, gw));
    // all_gather_many: pairs of other sizes (one in place, one empty), as all_gather each.
    at::Tensor m1 = at::zeros({3 * n}, opts.dtype(t)), m2 = at::zeros({0}, opts.dtype(t)), m3 = at::zeros({n}, opts.dtype(t));
    m1.narrow(0, 3 * r, 3).fill_(r + 2);
    c.all_gather_many({m1.narrow(0, 3 * r, 3), at::zeros({0}, opts.dtype(t)), at::full({1}, r + 5, opts.dtype(t))},
                      {m1, m2, m3});
    EXPECT_TRUE(bitwise_equal(m1, (at::arange(n, at::kFloat) + 2).repeat_interleave(3).to(t)));
    EXPECT_TRUE(bitwise_equal(m3, (at::arange(n, at::kFloat) + 5).to(t)));
    c.all_gather_many({}, {});
    // all_to_all: rank r's chunk c (3 elements) holds r * 100 + c; rank r receives s * 100 + r from each s.
    const at::Tensor sent = (at::arange(n, opts.dtype(at::kFloat)).repeat_interleave(3) + r * 100).to(t);
    at::Tensor got = at::full({3 * n}, -1.0, opts.dtype(t));
    c.all_to_all(sent, got);
    EXPECT_TRUE(bitwise_equal(got, (at::arange(n, at::kFloat).repeat_interleave(3) * 100 + r).to(t)));
    at::Tensor none = at::empty({0}, opts.dtype(t));
    c.all_to_all(at::empty({0}, opts.dtype(t)), none);
    at::Tensor b = at::full({5}, r == n - 1 ? 7.0 : 0.0, opts.dtype(t));
    c.broadcast(b, n - 1);
    EXPECT_TRUE(bitwise_equal(b, at::full({5}, 7.0, at::kFloat).to(t)));
  }
  // all_to_all of bytes (a quantized wire's codes): rank r sends r * 16 + c to rank c.
  const at::Tensor codes = (at::arange(n, opts.dtype(at::kLong)).repeat_interleave(5) + r * 16).to(at::kByte);
  at::Tensor received = at::zeros({5 * n}, opts.dtype(at::kByte));
  c.all_to_all(codes, received);
  EXPECT_TRUE(bitwise_equal(received, (at::arange(n, at::kLong).repeat_interleave(5) * 16 + r).to(at::kByte)));
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
  const std::string negative = error_of([&] { c.gather_buffer(-1, opts); });
  EXPECT_NE(negative.find("gather_buffer: numel must be >= 0, got -1"), std::string::npos) << negative;
  at::Tensor nc = at::zeros({4, 4}, opts).t();
  EXPECT_THROW(c.all_reduce(nc), c10::Error);
  at::Tensor b = at::zeros({2}, opts);
  EXPECT_THROW(c.broadcast(b, n), c10::Error);
  EXPECT_THROW(c.all_gather(at::zeros({2}, opts.dtype(at::kDouble)), out), c10::Error);
  try {
    c.all_gather_many({at::zeros({3}, opts)}, {});
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_gather_many: 1 inputs but 0 outputs"), std::string::npos) << e.what();
  }
  at::Tensor whole = at::zeros({3 * n}, opts);
  EXPECT_THROW(c.all_gather_many({at::zeros({3}, opts), at::zeros({2}, opts)}, {whole, out}), c10::Error);
  try {
    c.all_to_all(at::zeros({3 * n + 1}, opts), whole);
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_to_all: input has " + std::to_string(3 * n + 1) + " elements and output " +
                                         std::to_string(3 * n)),
              std::string::npos) << e.what();
  }
  try {
    at::Tensor both = at::zeros({6 * n}, opts);
    at::Tensor second = both.narrow(0, 3 * n, 3 * n);
    c.all_to_all(both.narrow(0, 0, 3 * n), second);
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_to_all: input and output share memory"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c.all_to_all(at::zeros({3 * n}, opts.dtype(at::kDouble)), whole), c10::Error);
  c.barrier();  // still usable: nothing was started
}

namespace {

// Rank r's input: random bits for 1 or 2 ranks (a + b is b + a in IEEE arithmetic, so any order of the
// sum gives the same bits); small integers / 64 for 3 ranks and more, whose sums are exact in any order.
at::Tensor rank_input(int rank, int64_t numel, at::ScalarType t, int salt) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7919ull * rank + 104729ull * salt + 1);
  at::Tensor x = !at::isFloatingType(t)  ? at::randint(0, 50, {numel}, gen, at::kLong).to(t)
                 : comm().size() <= 2 ? at::randn({numel}, gen, at::kDouble).mul_(1000).to(t)
                                      : (at::randint(-64, 65, {numel}, gen, at::kFloat) / 64).to(t);
  return x.to(device());
}

bool same_bits(const at::Tensor& a, const at::Tensor& b) { return bitwise_equal(a.cpu(), b.cpu()); }

}  // namespace

void expect_a_communicator_of_the_job(ld::Communicator& c, const char* backend) {
  EXPECT_STREQ(c.backend(), backend);
  EXPECT_EQ(c.rank(), comm().rank());
  EXPECT_EQ(c.size(), comm().size());
  expect_expected_values(c);
}

void expect_collectives_equal_the_jobs(ld::Communicator& c, const std::vector<at::ScalarType>& types) {
  ld::Communicator& ref = comm();
  const int r = ref.rank(), n = ref.size();
  int salt = 0;
  for (at::ScalarType t : types)
    for (int64_t numel : {1, 1000, 4099}) {
      SCOPED_TRACE(std::string(c10::toString(t)) + " " + std::to_string(numel) + " elements");
      for (ld::ReduceOp op : {ld::ReduceOp::Sum, ld::ReduceOp::Avg}) {
        if (op == ld::ReduceOp::Avg && !at::isFloatingType(t)) continue;
        const char* opname = op == ld::ReduceOp::Sum ? "Sum" : "Avg";
        at::Tensor a = rank_input(r, numel, t, ++salt), b = a.clone();
        ref.all_reduce(a, op);
        c.all_reduce(b, op);
        EXPECT_TRUE(same_bits(a, b)) << "all_reduce " << opname;
        const at::Tensor in = rank_input(r, numel * n, t, ++salt);
        at::Tensor oa = at::empty({numel}, in.options()), ob = at::empty({numel}, in.options());
        ref.reduce_scatter(in, oa, op);
        c.reduce_scatter(in, ob, op);
        EXPECT_TRUE(same_bits(oa, ob)) << "reduce_scatter " << opname;
      }
      // all_gather from a separate input, then in place (input = output's chunk rank()).
      const at::Tensor mine = rank_input(r, numel, t, ++salt);
      at::Tensor ga = at::empty({numel * n}, mine.options()), gb = at::empty({numel * n}, mine.options());
      ref.all_gather(mine, ga);
      c.all_gather(mine, gb);
      EXPECT_TRUE(same_bits(ga, gb)) << "all_gather";
      at::Tensor ia = at::zeros({n, numel}, mine.options()), ib = at::zeros({n, numel}, mine.options());
      ia[r].copy_(mine);
      ib[r].copy_(mine);
      ref.all_gather(ia[r], ia);
      c.all_gather(ib[r], ib);
      EXPECT_TRUE(same_bits(ia.view({-1}), ga)) << "all_gather in place (the job's)";
      EXPECT_TRUE(same_bits(ib.view({-1}), ga)) << "all_gather in place";
      const at::Tensor spread = rank_input(r, numel * n, t, ++salt);
      at::Tensor xa = at::empty_like(spread), xb = at::empty_like(spread);
      ref.all_to_all(spread, xa);
      c.all_to_all(spread, xb);
      EXPECT_TRUE(same_bits(xa, xb)) << "all_to_all";
      at::Tensor ba = rank_input(r, numel, t, ++salt), bb = ba.clone();
      ref.broadcast(ba, n - 1);
      c.broadcast(bb, n - 1);
      EXPECT_TRUE(same_bits(ba, bb)) << "broadcast";
    }
  c.barrier();
}

namespace {

TEST(Communicator, CollectivesGiveTheExpectedValues) { expect_expected_values(comm()); }

TEST(Communicator, BadArgumentsAreNamedAndChangeNothing) { expect_bad_arguments_named(comm()); }

// require_ranks_agree: every rank gets the same error, naming the first setting and rank that
// differ from rank 0 (shown as asked); settings every rank shares pass.
TEST(Communicator, RanksThatDisagreeAreNamedOnEveryRank) {
  ld::Communicator& c = comm();
  const auto even = [](int64_t x) { return std::string(x % 2 ? "odd" : "even"); };
  ld::require_ranks_agree(c, device(), {{"a", 7}, {"b", -3, even}}, "Test", "set them alike");
  ld::require_ranks_agree(c, device(), {}, "Test", "nothing to compare");
  if (c.size() < 2) return;
  const int last = c.size() - 1;
  const std::string e = error_of([&] {
    ld::require_ranks_agree(c, device(), {{"a", 7}, {"b", c.rank() == last ? 5 : 4, even}, {"c", c.rank()}}, "Test",
                            "set them alike");
  });
  // Rank 1 differs on c before the last rank differs on b: rank by rank, the first setting first.
  const std::string want = last == 1 ? "Test: the ranks disagree on b: rank 0 has even, rank 1 has odd; set them alike"
                                     : "Test: the ranks disagree on c: rank 0 has 0, rank 1 has 1; set them alike";
  EXPECT_EQ(e, want);
}

}  // namespace
}  // namespace lowbit_test
