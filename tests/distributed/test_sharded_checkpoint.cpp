// Fragment checkpoints: N ranks' files load on one unsharded optimizer and back on N ranks,
// bit-exact; resharding across runs of different sizes (the Reshard stages, chained by ctest);
// missing, duplicated and mismatched fragments are clear errors that load nothing.
#include "dist_util.h"

#include <cstdlib>
#include <fstream>
#include <unistd.h>

#include "../../distributed/fragment_state.h"

namespace lowbit_test {
namespace {

// Files of this test live in the working directory under a name unique to the job size.
std::string prefix_for(const std::string& name) { return "ckpt_np" + std::to_string(comm().size()) + "_" + name; }

void copy_file(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  ASSERT_TRUE(in.good()) << from;
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  out << in.rdbuf();
}

std::unique_ptr<lo::LowbitOptimizer> make_opt(std::vector<at::Tensor>& p, StateFormat f = StateFormat::Q4) {
  return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(f).bf16_stochastic_round(true));
}

// Every state tensor of every parameter of an unsharded optimizer, to compare whole states.
std::vector<at::Tensor> all_state(const lo::LowbitOptimizer& o, const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params)
    if (const lo::ParamState* st = o.state_of(p)) {
      ld::append_state_range(*st, 0, p.numel(), out);
      out.push_back(st->counters.narrow(0, 0, 1));
    }
  return out;
}

void expect_fragments_match(const ld::ShardedOptimizer& s, const lo::LowbitOptimizer& ref,
                            const std::vector<at::Tensor>& ref_params) {
  for (const ld::Fragment& f : s.fragments()) {
    const lo::ParamState* want = ref.state_of(ref_params[f.index]);
    ASSERT_TRUE(want && f.state.counters.defined()) << "parameter " << f.index;
    EXPECT_EQ(f.state.step(), want->step());
    std::vector<at::Tensor> a, b;
    ld::append_state_range(f.state, 0, f.numel, a);
    ld::append_state_range(*want, f.offset, f.numel, b);
    for (size_t t = 0; t < a.size(); ++t) EXPECT_TRUE(bitwise_equal(a[t], b[t])) << "parameter " << f.index;
  }
}

void set_grads(std::vector<at::Tensor>& sharded, std::vector<at::Tensor>& ref, int step, int world) {
  for (size_t k = 0; k < sharded.size(); ++k) {
    const auto shape = sharded[k].sizes();
    const auto dtype = sharded[k].scalar_type();
    sharded[k].mutable_grad() = rank_grad(comm().rank(), step, static_cast<int>(k), shape, dtype).to(device());
    ref[k].mutable_grad() = mean_grad(world, step, static_cast<int>(k), shape, dtype).to(device());
  }
}

// N ranks' checkpoint -> one process -> N ranks, compared with one process that never stopped.
void ranks_to_one_and_back(StateFormat fmt) {
  const int world = comm().size();
  std::vector<at::Tensor> params = make_params(at::kBFloat16, device()), ref_params = make_params(at::kBFloat16, device());
  auto ref = make_opt(ref_params, fmt);
  ld::ShardedOptimizer sharded(std::shared_ptr<lo::LowbitOptimizer>(make_opt(params, fmt)), comm_ptr());
  for (int s = 1; s <= 2; ++s) {
    set_grads(params, ref_params, s, world);
    sharded.step();
    ref->step();
  }
  const std::string pre = prefix_for(std::string("to_one_") + lowbit::state_format_name(fmt));
  sharded.save(pre);
  // N ranks' files -> one unsharded optimizer (every rank does it on its own).
  std::vector<at::Tensor> one_params = make_params(at::kBFloat16, device());
  auto one = make_opt(one_params, fmt);
  ld::load_fragments(*one, pre);
  const auto want = all_state(*ref, ref_params), got = all_state(*one, one_params);
  ASSERT_EQ(want.size(), got.size());
  for (size_t t = 0; t < want.size(); ++t) EXPECT_TRUE(bitwise_equal(want[t], got[t])) << "state tensor " << t;
  // One unsharded optimizer's fragments -> N ranks, which then step on exactly like it.
  const std::string back = prefix_for(std::string("from_one_") + lowbit::state_format_name(fmt));
  if (comm().rank() == 0) ld::save_fragments(*ref, back);
  comm().barrier();
  std::vector<at::Tensor> p2 = make_params(at::kBFloat16, device());
  for (size_t k = 0; k < p2.size(); ++k) p2[k].detach().copy_(ref_params[k].detach());
  ld::ShardedOptimizer resumed(std::shared_ptr<lo::LowbitOptimizer>(make_opt(p2, fmt)), comm_ptr());
  resumed.load(back);
  expect_fragments_match(resumed, *ref, ref_params);
  for (int s = 3; s <= 4; ++s) {
    set_grads(p2, ref_params, s, world);
    resumed.step();
    ref->step();
  }
  for (size_t k = 0; k < p2.size(); ++k) EXPECT_TRUE(bitwise_equal(p2[k], ref_params[k])) << "parameter " << k;
  expect_fragments_match(resumed, *ref, ref_params);
}

TEST(ShardedCheckpoint, RanksToOneProcessAndBackAreBitExact) {
  for (StateFormat f : {StateFormat::Q4, StateFormat::FP32}) {
    SCOPED_TRACE(lowbit::state_format_name(f));
    ranks_to_one_and_back(f);
  }
}

std::string load_error(lo::LowbitOptimizer& o, const std::string& prefix) {
  try {
    ld::load_fragments(o, prefix);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(ShardedCheckpoint, MissingDuplicatedOrMismatchedFragmentsLoadNothing) {
  const int rank = comm().rank(), world = comm().size();
  std::vector<at::Tensor> params = make_params(at::kFloat, device()), ref_params = make_params(at::kFloat, device());
  auto ref = make_opt(ref_params);
  ld::ShardedOptimizer sharded(std::shared_ptr<lo::LowbitOptimizer>(make_opt(params)), comm_ptr());
  set_grads(params, ref_params, 1, world);
  sharded.step();
  ref->step();
  const std::string pre = prefix_for("bad");
  sharded.save(pre);
  const std::string whole = prefix_for("bad_whole");
  if (rank == 0) ld::save_fragments(*ref, whole);
  comm().barrier();
  // The victim: an unsharded optimizer with state of its own, which a failed load must leave as is.
  std::vector<at::Tensor> vp = make_params(at::kFloat, device());
  auto victim = make_opt(vp);
  for (size_t k = 0; k < vp.size(); ++k) vp[k].mutable_grad() = at::ones_like(vp[k]);
  victim->step();
  const auto before = all_state(*victim, vp);
  const auto unchanged = [&] {
    const auto now = all_state(*victim, vp);
    bool same = now.size() == before.size();
    for (size_t t = 0; same && t < now.size(); ++t) same = bitwise_equal(now[t], before[t]);
    return same;
  };
  const std::string tag = prefix_for("bad_r" + std::to_string(rank));
  // Duplicated: two writers that both hold every parameter whole.
  copy_file(ld::fragment_file(whole, 0, 1), ld::fragment_file(tag + "_dup", 0, 2));
  copy_file(ld::fragment_file(whole, 0, 1), ld::fragment_file(tag + "_dup", 1, 2));
  std::string e = load_error(*victim, tag + "_dup");
  EXPECT_NE(e.find("duplicated fragment"), std::string::npos) << e;
  EXPECT_TRUE(unchanged());
  // Missing: the file of one writer.
  copy_file(ld::fragment_file(whole, 0, 1), ld::fragment_file(tag + "_miss", 0, 2));
  e = load_error(*victim, tag + "_miss");
  EXPECT_NE(e.find("the file of rank 1 of 2 is missing"), std::string::npos) << e;
  EXPECT_TRUE(unchanged());
  // Mismatched: Q4 fragments into an optimizer that keeps Q8 state.
  std::vector<at::Tensor> q8p = make_params(at::kFloat, device());
  auto q8 = make_opt(q8p, StateFormat::Q8);
  e = load_error(*q8, whole);
  EXPECT_NE(e.find("was saved with state format"), std::string::npos) << e;
  EXPECT_EQ(q8->state_bytes(), 0);
  // Missing fragment inside: rank 0's piece of a sharded checkpoint without the others' pieces.
  if (world >= 2) {
    copy_file(ld::fragment_file(pre, 0, world), ld::fragment_file(tag + "_hole", 0, 2));
    std::vector<at::Tensor> none_p = make_params(at::kFloat, device());
    auto none = make_opt(none_p);
    const std::string empty = tag + "_empty";
    ld::save_fragments(*none, empty);  // no state yet: a file without fragments
    copy_file(ld::fragment_file(empty, 0, 1), ld::fragment_file(tag + "_hole", 1, 2));
    e = load_error(*victim, tag + "_hole");
    EXPECT_NE(e.find("missing fragment"), std::string::npos) << e;
    EXPECT_TRUE(unchanged());
  }
  // The sharded optimizer's load refuses on every rank together and keeps its state.
  const auto mine = sharded.fragments().empty() ? at::Tensor() : sharded.fragments()[0].state.counters.clone();
  try {
    sharded.load(prefix_for("does_not_exist"));
    ADD_FAILURE() << "loaded a checkpoint that does not exist";
  } catch (const c10::Error& err) {
    EXPECT_NE(std::string(err.what()).find("no fragment files"), std::string::npos) << err.what();
  }
  if (mine.defined()) EXPECT_TRUE(bitwise_equal(mine, sharded.fragments()[0].state.counters));
}

// Resharding across jobs of different sizes: ctest runs stage 0 on 3 ranks, stage 1 on 2, stage 2 on
// 1, stage 3 on 3 again (LOWBIT_RESHARD_STAGE), each loading the previous stage's files, stepping
// twice and saving. Every stage compares with one process replaying all steps from the start.
constexpr int kSchedule[] = {3, 2, 1, 3};

TEST(Reshard, Stage) {
  const char* stage_env = std::getenv("LOWBIT_RESHARD_STAGE");
  if (!stage_env) GTEST_SKIP() << "run by the distributed_reshard_* ctest entries";
  const int stage = std::atoi(stage_env), world = comm().size();
  ASSERT_EQ(world, kSchedule[stage]) << "stage " << stage << " runs on " << kSchedule[stage] << " ranks";
  std::vector<at::Tensor> params = make_params(at::kBFloat16, device());
  if (stage > 0) {
    std::vector<at::Tensor> saved;
    torch::load(saved, "reshard_params_" + std::to_string(stage - 1) + ".pt");
    for (size_t k = 0; k < params.size(); ++k) params[k].detach().copy_(saved[k]);
  }
  ld::ShardedOptimizer sharded(std::shared_ptr<lo::LowbitOptimizer>(make_opt(params)), comm_ptr());
  if (stage > 0) sharded.load("reshard_" + std::to_string(stage - 1));
  // The replay: one process, every step so far with the mean over that step's job size.
  std::vector<at::Tensor> ref_params = make_params(at::kBFloat16, device());
  auto ref = make_opt(ref_params);
  for (int st = 0; st <= stage; ++st)
    for (int s = 2 * st + 1; s <= 2 * st + 2; ++s) {
      for (size_t k = 0; k < ref_params.size(); ++k)
        ref_params[k].mutable_grad() = mean_grad(kSchedule[st], s, static_cast<int>(k), ref_params[k].sizes(), at::kBFloat16).to(device());
      ref->step();
      if (st != stage) continue;
      for (size_t k = 0; k < params.size(); ++k)
        params[k].mutable_grad() = rank_grad(comm().rank(), s, static_cast<int>(k), params[k].sizes(), at::kBFloat16).to(device());
      sharded.step();
    }
  for (size_t k = 0; k < params.size(); ++k) EXPECT_TRUE(bitwise_equal(params[k], ref_params[k])) << "parameter " << k;
  expect_fragments_match(sharded, *ref, ref_params);
  sharded.save("reshard_" + std::to_string(stage));
  if (comm().rank() == 0) {
    std::vector<at::Tensor> out;
    for (const auto& p : params) out.push_back(p.detach().cpu());
    torch::save(out, "reshard_params_" + std::to_string(stage) + ".pt");
  }
  comm().barrier();
}

}  // namespace
}  // namespace lowbit_test
