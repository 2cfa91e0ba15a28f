// Fragment checkpoints: N ranks' files load on one unsharded optimizer and back on N ranks,
// bit-exact; resharding across runs of different sizes (the Reshard stages, chained by ctest);
// missing, duplicated and mismatched fragments, and damaged files (each check of the reader), are
// clear errors that load nothing; state in another format is refused, or converted on purpose
// exactly as one process converts it.
#include "dist_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <lowbit/optim/step_calls.h>
#include "../fuzz/fragment_edit.h"
#include "../fuzz/pickle_claims.h"
#include "../fuzz/zip_rewrite.h"

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

// master_bits 24 / 32: a master-weight correction instead of stochastic rounding.
std::unique_ptr<lo::LowbitOptimizer> make_opt(std::vector<at::Tensor>& p, StateFormat f = StateFormat::Q4,
                                              int64_t master_bits = 0) {
  return std::make_unique<lo::AdamW>(
      p, lo::AdamWOptions(1e-2).state_format(f).bf16_stochastic_round(master_bits == 0).master_weight_bits(master_bits));
}

bool all_bitwise_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  bool same = a.size() == b.size();
  for (size_t t = 0; same && t < a.size(); ++t) same = bitwise_equal(a[t], b[t]);
  return same;
}

// Every state tensor of every parameter of an unsharded optimizer, to compare whole states.
std::vector<at::Tensor> all_state(const lo::LowbitOptimizer& o, const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params)
    if (const lo::ParamState* st = o.state_of(p)) {
      lowbit::optim::append_state_range(*st, 0, p.numel(), out);
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
    lowbit::optim::append_state_range(f.state, 0, f.numel, a);
    lowbit::optim::append_state_range(*want, f.offset, f.numel, b);
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

// Steps 3 and 4 on the sharded optimizer and on one process's, then parameters and fragments
// compared bit for bit.
void expect_next_steps_match(ld::ShardedOptimizer& s, std::vector<at::Tensor>& params, lo::LowbitOptimizer& ref,
                             std::vector<at::Tensor>& ref_params, int world) {
  for (int step = 3; step <= 4; ++step) {
    set_grads(params, ref_params, step, world);
    s.step();
    ref.step();
  }
  for (size_t k = 0; k < params.size(); ++k) EXPECT_TRUE(bitwise_equal(params[k], ref_params[k])) << "parameter " << k;
  expect_fragments_match(s, ref, ref_params);
}

// N ranks' checkpoint -> one process -> N ranks, compared with one process that never stopped.
void ranks_to_one_and_back(StateFormat fmt, int64_t master_bits = 0) {
  const int world = comm().size();
  std::vector<at::Tensor> params = make_params(at::kBFloat16, device()), ref_params = make_params(at::kBFloat16, device());
  auto ref = make_opt(ref_params, fmt, master_bits);
  ld::ShardedOptimizer sharded(std::shared_ptr<lo::LowbitOptimizer>(make_opt(params, fmt, master_bits)), comm_ptr());
  for (int s = 1; s <= 2; ++s) {
    set_grads(params, ref_params, s, world);
    sharded.step();
    ref->step();
  }
  const std::string pre = prefix_for(std::string("to_one_") + lowbit::state_format_name(fmt) + std::to_string(master_bits));
  sharded.save(pre);
  // N ranks' files -> one unsharded optimizer (every rank does it on its own).
  std::vector<at::Tensor> one_params = make_params(at::kBFloat16, device());
  auto one = make_opt(one_params, fmt, master_bits);
  ld::load_fragments(*one, pre);
  const auto want = all_state(*ref, ref_params), got = all_state(*one, one_params);
  ASSERT_EQ(want.size(), got.size());
  for (size_t t = 0; t < want.size(); ++t) EXPECT_TRUE(bitwise_equal(want[t], got[t])) << "state tensor " << t;
  // One unsharded optimizer's fragments -> N ranks, which then step on exactly like it.
  const std::string back = prefix_for(std::string("from_one_") + lowbit::state_format_name(fmt) + std::to_string(master_bits));
  if (comm().rank() == 0) ld::save_fragments(*ref, back);
  comm().barrier();
  std::vector<at::Tensor> p2 = make_params(at::kBFloat16, device());
  for (size_t k = 0; k < p2.size(); ++k) p2[k].detach().copy_(ref_params[k].detach());
  ld::ShardedOptimizer resumed(std::shared_ptr<lo::LowbitOptimizer>(make_opt(p2, fmt, master_bits)), comm_ptr());
  resumed.load(back);
  expect_fragments_match(resumed, *ref, ref_params);
  expect_next_steps_match(resumed, p2, *ref, ref_params, world);
}

TEST(ShardedCheckpoint, RanksToOneProcessAndBackAreBitExact) {
  for (StateFormat f : {StateFormat::Q4, StateFormat::FP32}) {
    SCOPED_TRACE(lowbit::state_format_name(f));
    ranks_to_one_and_back(f);
  }
  // The master-weight correction travels in the fragments like the moments.
  for (int64_t bits : {24, 32}) {
    SCOPED_TRACE(std::to_string(bits) + "-bit master weights");
    ranks_to_one_and_back(StateFormat::Q8, bits);
  }
}

std::string load_error(lo::LowbitOptimizer& o, const std::string& prefix,
                       const lo::LoadOptions& options = lo::LoadOptions()) {
  try {
    ld::load_fragments(o, prefix, options);
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
  const auto with_weights = [&] {
    std::vector<at::Tensor> all = all_state(*victim, vp);
    for (const at::Tensor& p : vp) all.push_back(p.detach().clone());
    return all;
  };
  const auto before = with_weights();
  const auto unchanged = [&] {
    const auto now = with_weights();
    bool same = now.size() == before.size();
    for (size_t t = 0; same && t < now.size(); ++t) same = bitwise_equal(now[t], before[t]);
    return same;
  };
  const std::string tag = prefix_for("bad_r" + std::to_string(rank));
  // Duplicated: two writers that both hold every parameter whole.
  relabel_fragment_file(ld::fragment_file(whole, 0, 1), ld::fragment_file(tag + "_dup", 0, 2), 0, 2);
  relabel_fragment_file(ld::fragment_file(whole, 0, 1), ld::fragment_file(tag + "_dup", 1, 2), 1, 2);
  std::string e = load_error(*victim, tag + "_dup");
  EXPECT_NE(e.find("duplicated fragment"), std::string::npos) << e;
  EXPECT_TRUE(unchanged());
  // Missing: the file of one writer.
  relabel_fragment_file(ld::fragment_file(whole, 0, 1), ld::fragment_file(tag + "_miss", 0, 2), 0, 2);
  e = load_error(*victim, tag + "_miss");
  EXPECT_NE(e.find("the file of rank 1 of 2 is missing"), std::string::npos) << e;
  EXPECT_TRUE(unchanged());
  // Mismatched: Q4 fragments into an optimizer that keeps Q8 state.
  std::vector<at::Tensor> q8p = make_params(at::kFloat, device());
  auto q8 = make_opt(q8p, StateFormat::Q8);
  e = load_error(*q8, whole);
  EXPECT_NE(e.find("the checkpoint holds its state in Q4 but this optimizer keeps it in Q8"), std::string::npos) << e;
  EXPECT_EQ(q8->state_bytes(), 0);
  // Missing fragment inside: rank 0's piece of a sharded checkpoint without the others' pieces.
  if (world >= 2) {
    relabel_fragment_file(ld::fragment_file(pre, 0, world), ld::fragment_file(tag + "_hole", 0, 2), 0, 2);
    std::vector<at::Tensor> none_p = make_params(at::kFloat, device());
    auto none = make_opt(none_p);
    const std::string empty = tag + "_empty";
    ld::save_fragments(*none, empty);  // no state yet: a file without fragments
    relabel_fragment_file(ld::fragment_file(empty, 0, 1), ld::fragment_file(tag + "_hole", 1, 2), 1, 2);
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

// ---------------------------------------------------------------------------------------------
// Damaged fragment files (format version 3): each check of the reader, by a file that fails it
// alone. Entry edits are re-signed (fragment_edit.h) so that the checks behind the digests are
// reached; the victim, an optimizer with state of its own, must come out bit-identical.
// ---------------------------------------------------------------------------------------------

struct Victim {
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  std::unique_ptr<lo::LowbitOptimizer> opt;
  std::vector<at::Tensor> before;
  explicit Victim(StateFormat f) : opt(make_opt(params, f)) {
    for (auto& p : params) p.mutable_grad() = at::ones_like(p);
    opt->step();
    before = state_and_weights();
  }
  // The state and the parameters: a refused load changes neither.
  std::vector<at::Tensor> state_and_weights() const {
    std::vector<at::Tensor> all = all_state(*opt, params);
    for (const at::Tensor& p : params) all.push_back(p.detach().clone());
    return all;
  }
  bool unchanged() const {
    const auto now = state_and_weights();
    bool same = now.size() == before.size();
    for (size_t t = 0; same && t < now.size(); ++t) same = bitwise_equal(now[t], before[t]);
    return same;
  }
};

// A trained unsharded optimizer's single-writer file, and its entries.
struct Saved {
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  std::unique_ptr<lo::LowbitOptimizer> opt;
  std::string prefix;
  Entries entries;
  Saved(StateFormat f, const std::string& name) : opt(make_opt(params, f)), prefix(prefix_for(name + "_r" + std::to_string(comm().rank()))) {
    for (int s = 1; s <= 2; ++s) {
      for (size_t k = 0; k < params.size(); ++k)
        params[k].mutable_grad() = rank_grad(0, s, static_cast<int>(k), params[k].sizes(), at::kFloat).to(device());
      opt->step();
    }
    ld::save_fragments(*opt, prefix);
    entries = read_entries(ld::fragment_file(prefix, 0, 1));
  }
};

// Writes `files` (one entry map per writer) under a fresh prefix and returns it.
std::string write_set(const std::string& name, const std::vector<Entries>& files) {
  const std::string pre = prefix_for(name + "_r" + std::to_string(comm().rank()));
  for (size_t r = 0; r < files.size(); ++r)
    write_entries(files[r], ld::fragment_file(pre, static_cast<int>(r), static_cast<int>(files.size())));
  return pre;
}

struct Damage {
  const char* name;
  std::function<void(Entries&)> edit;
  const char* expect;  // in the error
};

at::Tensor tensor_of(const Entries& e, const std::string& key) { return e.at(key).toTensor().clone(); }

// Parameters (make_params): 0 (5000), 1 (6400), 3 (12291) keep Q4 state: f<i>.t0 / t1 = the first
// moment's codes / absmax, t2 / t3 the second's; 2 (300), 4 (7), 5 (2048) keep FP32 state (t0, t1).
std::vector<Damage> damages() {
  using E = Entries;
  return {
      {"digest", [](E& e) { auto t = tensor_of(e, "f0.t0"); t[7] = t[7].item<uint8_t>() ^ 1; e["f0.t0"] = t; },
       "checkpoint tensor 'f0.t0' is corrupt: its digest is"},
      {"magic", [](E& e) { set_int(e, "header", kMagic, 1); }, "is not a lowbit fragment file"},
      {"version", [](E& e) { set_int(e, "header", kVersion, 4); }, "format version 4 is not supported"},
      {"header_size", [](E& e) { set_int(e, "header", kVersion, 2); }, "the header has 8 values; version 2 writes 7"},
      {"rank", [](E& e) { set_int(e, "header", kRank, 1); }, "the header says rank 1 of 1, the file name rank 0 of 1"},
      {"count", [](E& e) { set_int(e, "header", kCount, int64_t(1) << 40); }, "the header's fragment count is 1099511627776"},
      {"skipped", [](E& e) { set_int(e, "header", kSkipped, -1); }, "the header's skipped-step count is -1"},
      {"group", [](E& e) { set_int(e, "f0.meta", kGroup, -1); }, "field group of 'f0.meta' is -1"},
      {"index", [](E& e) { set_int(e, "f0.meta", kIndex, INT64_MAX); }, "field index of 'f0.meta' is 9223372036854775807"},
      {"param_numel", [](E& e) { set_int(e, "f0.meta", kParamNumel, 0); }, "field param_numel of 'f0.meta' is 0"},
      {"offset", [](E& e) { set_int(e, "f0.meta", kOffset, 6000); }, "field offset of 'f0.meta' is 6000, expected 0..5000"},
      {"numel", [](E& e) { set_int(e, "f0.meta", kNumel, 5001); }, "field numel of 'f0.meta' is 5001, expected 0..5000"},
      {"format", [](E& e) { set_int(e, "f0.meta", kFormat, 6); }, "field format of 'f0.meta' is 6, expected 0..5"},
      {"block_size", [](E& e) { set_int(e, "f0.meta", kBlockSize, 100); }, "'f0.meta block_size' is 100, not a block size of DE4Signed"},
      {"block_size_range", [](E& e) { set_int(e, "f2.meta", kBlockSize, 0); }, "field block_size of 'f2.meta' is 0, expected 1.."},
      {"nslots", [](E& e) { set_int(e, "f0.meta", kNslots, 5); }, "field nslots of 'f0.meta' is 5, expected 0..4"},
      {"step", [](E& e) { set_int(e, "f0.meta", kStep, -1); }, "field step of 'f0.meta' is -1"},
      {"overflow", [](E& e) { set_int(e, "f0.meta", kOverflow, -2); }, "field overflow of 'f0.meta' is -2"},
      {"unaligned", [](E& e) { set_int(e, "f0.meta", kOffset, 64); set_int(e, "f0.meta", kNumel, 4936); },
       "offset 64 is not a multiple of the block size 128"},
      {"slot_storage", [](E& e) { set_int(e, "f0.slots", 0, 9); }, "slot 0: storage is 9, expected 0..5"},
      {"slot_format", [](E& e) { set_int(e, "f0.slots", 1, 8); }, "slot 0: format is 8, expected 0..7"},
      {"slot_kind", [](E& e) { set_int(e, "f0.slots", 0, 1); }, "slot 0 is stored as fp32, which a Q4 state in this slot does not hold"},
      {"dtype", [](E& e) { e["f0.t1"] = tensor_of(e, "f0.t1").to(at::kDouble); }, "'f0.t1' has dtype Double, expected Float"},
      {"shape", [](E& e) { e["f0.t0"] = tensor_of(e, "f0.t0").reshape({2, -1}); }, "'f0.t0' has shape [2, 1250], expected 1-D"},
      {"code_bytes", [](E& e) { e["f0.t0"] = tensor_of(e, "f0.t0").narrow(0, 0, 2499).clone(); },
       "'f0.t0' has 2499 code bytes, expected 2500"},
      {"block_scales", [](E& e) { e["f0.t1"] = at::cat({tensor_of(e, "f0.t1"), at::ones({1})}); },
       "'f0.t1' has 41 block scales, expected 40"},
      {"values", [](E& e) { e["f2.t0"] = tensor_of(e, "f2.t0").narrow(0, 0, 299).clone(); }, "'f2.t0' has 299 values, expected 300"},
      {"negative_scale", [](E& e) { auto t = tensor_of(e, "f0.t1"); t[3] = -1.0f; e["f0.t1"] = t; },
       "'f0.t1' holds a negative or non-finite block scale"},
      {"extra_entry", [](E& e) { e["f9.meta"] = e["f0.meta"]; }, "entry 'f9.meta' is not one a version-3 writer writes"},
      {"extra_value", [](E& e) { e["note"] = c10::IValue(int64_t(1)); }, "entry 'note' is not one a version-3 writer writes"},
      // The weight pieces (w<i>: parameter i whole in a one-writer file).
      {"weight_count", [](E& e) { set_int(e, "header", kWeightCount, int64_t(1) << 40); },
       "the header's weight-piece count is 1099511627776"},
      {"weight_dtype", [](E& e) { set_int(e, "w0.meta", kWDtype, static_cast<int64_t>(at::kDouble)); },
       "field dtype of 'w0.meta' is 7, not float32, bfloat16 or float16"},
      {"weight_offset", [](E& e) { set_int(e, "w0.meta", kWOffset, 6000); }, "field offset of 'w0.meta' is 6000, expected 0..5000"},
      {"weight_values", [](E& e) { set_int(e, "w0.meta", kWNumel, 4999); }, "entry 'w0' has 5000 values, expected 4999"},
      {"weight_param", [](E& e) { set_int(e, "w0.meta", kWGroup, 3); }, "this optimizer has no parameter 0 in group 3"},
      {"weight_size", [](E& e) { set_int(e, "w0.meta", kWParamNumel, 6000); },
       "weight piece 0 (parameter 0 of group 0): the parameter has 6000 elements in the checkpoint but 5000 here"},
      {"weight_twice", [](E& e) { set_int(e, "w1.meta", kWIndex, 0); set_int(e, "w1.meta", kWParamNumel, 5000);
         set_int(e, "w1.meta", kWNumel, 5000); e["w1"] = e["w0"]; },
       "elements 0..5000 are in two weight pieces (duplicated piece)"},
      {"weight_missing", [](E& e) { e.erase("w5"); e.erase("w5.digest"); e.erase("w5.meta"); e.erase("w5.meta.digest");
         set_int(e, "header", kWeightCount, 5); },
       "the files hold weights (version 3) but none of parameter 5 of group 0"},
      {"weight_as_bf16", [](E& e) { e["w0"] = tensor_of(e, "w0").to(at::kBFloat16);
         set_int(e, "w0.meta", kWDtype, static_cast<int64_t>(at::kBFloat16)); },
       "the weights are BFloat16, the parameter Float"},
      {"missing_entry", [](E& e) { e.erase("f1.t2"); }, "entry 'f1.t2' is missing"},
      {"not_a_tensor", [](E& e) { e["f1.t2"] = c10::IValue(int64_t(3)); }, "entry 'f1.t2' is not a tensor"},
      {"no_such_param", [](E& e) { set_int(e, "f0.meta", kGroup, 5); }, "this optimizer has no parameter 0 in group 5"},
      {"param_size", [](E& e) { set_int(e, "f0.meta", kParamNumel, 6000); },
       "the parameter has 6000 elements in the checkpoint but 5000 here"},
      {"dense_block", [](E& e) { set_int(e, "f2.meta", kBlockSize, 512); },
       "field block_size of 'f2.meta' is 512, expected 1024 for FP32 state"},
      {"slot_family", [](E& e) { set_int(e, "f0.slots", 1, 0); },
       "slot 0 is stored as Dyn8Signed, which a Q4 state in this slot does not hold"},
      {"slot_count", [](E& e) { set_int(e, "f2.meta", kNslots, 1); set_int(e, "f2.slots", 2, 0); e.erase("f2.t1");
         e["f2.slots"] = tensor_of(e, "f2.slots").narrow(0, 0, 2).clone(); e.erase("f2.t1.digest"); },
       "has 1 state slots but this optimizer has 2"},
  };
}

TEST(ShardedCheckpoint, EveryCheckOfADamagedFragmentFileRefusesItWhole) {
  Saved saved(StateFormat::Q4, "checks");
  for (const Damage& d : damages()) {
    SCOPED_TRACE(d.name);
    Victim victim(StateFormat::Q4);  // one per case: a case that loads fails itself only
    Entries e = saved.entries;
    d.edit(e);
    if (std::string(d.name) != "digest") resign_fragments(e);
    const std::string pre = write_set(std::string("check_") + d.name, {e});
    // A load that converts state in another layout skips none of these checks.
    for (bool convert : {false, true}) {
      const std::string err = load_error(*victim.opt, pre, lo::LoadOptions().convert_state_format(convert));
      EXPECT_NE(err.find(d.expect), std::string::npos) << "convert " << convert << ": " << err;
      EXPECT_NE(err.find(ld::fragment_file(pre, 0, 1)), std::string::npos) << "the error names the file: " << err;
      EXPECT_TRUE(victim.unchanged());
    }
  }
}

// A flipped bit inside a tensor's bytes: the zip's CRC-32 (checked before libtorch reads the file,
// which checks none) refuses it, and nothing is loaded.
TEST(ShardedCheckpoint, AFlippedBitInAFragmentTensorIsRefused) {
  Saved saved(StateFormat::Q4, "bitflip");
  Victim victim(StateFormat::Q4);
  const std::string file = ld::fragment_file(saved.prefix, 0, 1);
  const auto spans = record_spans(file);
  int flipped = 0;
  for (const auto& [name, span] : spans) {
    if (name.rfind("data/", 0) != 0 || span.second == 0) continue;
    std::string bytes = read_file(file);
    bytes[span.first + span.second / 2] ^= 0x10;
    const std::string pre = prefix_for("flip_r" + std::to_string(comm().rank()));
    write_file(ld::fragment_file(pre, 0, 1), bytes);
    const std::string err = load_error(*victim.opt, pre);
    EXPECT_NE(err.find("is damaged: record"), std::string::npos) << name << ": " << err;
    EXPECT_NE(err.find(name), std::string::npos) << "names the record: " << err;
    EXPECT_TRUE(victim.unchanged()) << name;
    ++flipped;
  }
  EXPECT_GT(flipped, 10);
}

// A code that is not finite in its format (float8's NaN) is refused like the single-process reader does.
TEST(ShardedCheckpoint, NonFiniteCodesAreRefused) {
  Saved saved(StateFormat::FP8, "fp8");
  Victim victim(StateFormat::FP8);
  Entries e = saved.entries;
  at::Tensor codes = tensor_of(e, "f0.t2");
  codes[11] = 0x7F;  // NaN in FP8E4M3
  e["f0.t2"] = codes;
  resign_fragments(e);
  const std::string err = load_error(*victim.opt, write_set("nan_code", {e}));
  EXPECT_NE(err.find("'f0.t2' holds code 127 at element 11, which is not a finite value of format FP8E4M3"),
            std::string::npos) << err;
  EXPECT_TRUE(victim.unchanged());
}

// A tensor record shorter than data.pkl claims for it, in a zip re-sealed so that its sizes and
// CRC-32s are right: refused naming the file, the entry and both byte counts before anything reads
// the tensor (a 64 MB claim over a small record crashed the digest's read before). And a FIFO in
// place of a writer's file is refused at once, without blocking.
TEST(ShardedCheckpoint, TensorRecordsShorterThanTheirClaimsAreRefused) {
  Saved saved(StateFormat::Q4, "short");
  const std::vector<ZipEntry> entries = zip_entries(read_file(ld::fragment_file(saved.prefix, 0, 1)));
  std::vector<ZipEntry> probe = entries;
  const std::vector<TensorClaims> claims = tensor_claims(find_entry_in_folder(probe, "data.pkl")->bytes);
  ASSERT_GT(claims.size(), 10u);
  // The header (8 int64: 64 bytes) cut to 56 bytes; the large claim (2^24 elements, sizes too)
  // over the smallest record.
  size_t header = claims.size(), smallest = 0;
  for (size_t k = 0; k < claims.size(); ++k) {
    const size_t n = find_entry_in_folder(probe, "data/" + claims[k].key)->bytes.size();
    if (n == 64 && header == claims.size()) header = k;
    if (n < find_entry_in_folder(probe, "data/" + claims[smallest].key)->bytes.size()) smallest = k;
  }
  ASSERT_LT(header, claims.size());
  const size_t small_bytes = find_entry_in_folder(probe, "data/" + claims[smallest].key)->bytes.size();
  struct Case {
    const char* name;  // also the file's
    std::function<void(std::vector<ZipEntry>&)> edit;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"header_cut",
       [&](std::vector<ZipEntry>& e) { find_entry_in_folder(e, "data/" + claims[header].key)->bytes.resize(56); },
       "checkpoint tensor 'header' needs 64 bytes, but its record in the file holds 56 bytes"},
      {"large_claim",
       [&](std::vector<ZipEntry>& e) {
         std::string& p = find_entry_in_folder(e, "data.pkl")->bytes;
         const TensorClaims& t = claims[smallest];
         ASSERT_FALSE(t.sizes.empty());
         p = set_pickle_int(p, t.sizes[0], int64_t(1) << 24);
         p = set_pickle_int(p, t.numel, int64_t(1) << 24);
       },
       " bytes, but its record in the file holds " + std::to_string(small_bytes) + " bytes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<ZipEntry> e = entries;
    c.edit(e);
    const std::string pre = prefix_for(std::string("short_") + c.name + "_r" + std::to_string(comm().rank()));
    write_file(ld::fragment_file(pre, 0, 1), zip_archive(e));
    Victim victim(StateFormat::Q4);
    const std::string err = load_error(*victim.opt, pre);
    EXPECT_NE(err.find(c.want), std::string::npos) << err;
    EXPECT_NE(err.find("load fragments: lowbit checkpoint: '" + ld::fragment_file(pre, 0, 1) + "'"), std::string::npos)
        << err;
    EXPECT_TRUE(victim.unchanged());
  }
  // A FIFO as the writer's file.
  const std::string pre = prefix_for("fifo_r" + std::to_string(comm().rank()));
  const std::string fifo = ld::fragment_file(pre, 0, 1);
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  Victim victim(StateFormat::Q4);
  const std::string err = load_error(*victim.opt, pre);
  std::remove(fifo.c_str());
  EXPECT_NE(err.find("'" + fifo + "' is a FIFO (named pipe), not a regular file"), std::string::npos) << err;
  EXPECT_TRUE(victim.unchanged());
}

// Several writers' files: the set is checked whole (names, seeds, skipped steps) before anything loads.
TEST(ShardedCheckpoint, WriterSetsAreCheckedWhole) {
  Saved saved(StateFormat::Q4, "set");
  Victim victim(StateFormat::Q4);
  const std::vector<Entries> three = split_fragment_file(saved.entries, 3);
  // The split set loads and equals the single file.
  {
    std::vector<at::Tensor> p = make_params(at::kFloat, device());
    auto o = make_opt(p);
    ld::load_fragments(*o, write_set("split3", three));
    const auto want = all_state(*saved.opt, saved.params), got = all_state(*o, p);
    ASSERT_EQ(want.size(), got.size());
    for (size_t t = 0; t < want.size(); ++t) EXPECT_TRUE(bitwise_equal(want[t], got[t])) << "state tensor " << t;
  }
  std::vector<Entries> seeds = three;
  set_int(seeds[2], "header", kSeed, 12345);
  resign_fragments(seeds[2]);
  std::string err = load_error(*victim.opt, write_set("seed", seeds));
  EXPECT_NE(err.find("rank-2-of-3 has another stochastic-rounding seed (12345)"), std::string::npos) << err;
  EXPECT_TRUE(victim.unchanged());
  std::vector<Entries> skipped = three;
  set_int(skipped[1], "header", kSkipped, 5);
  resign_fragments(skipped[1]);
  err = load_error(*victim.opt, write_set("skipped", skipped));
  EXPECT_NE(err.find("rank-1-of-3 counts 5 skipped steps, rank 0's file 0"), std::string::npos) << err;
  EXPECT_TRUE(victim.unchanged());
  // Swapped files: each header names its writer.
  err = load_error(*victim.opt, write_set("swapped", {three[1], three[0], three[2]}));
  EXPECT_NE(err.find("the header says rank 1 of 3, the file name rank 0 of 3"), std::string::npos) << err;
  EXPECT_TRUE(victim.unchanged());
  // A file beside the set that no writer of it writes: rank 3 of 3.
  const std::string pre = write_set("extra", three);
  copy_file(ld::fragment_file(pre, 0, 3), pre + ".rank-3-of-3");
  err = load_error(*victim.opt, pre);
  EXPECT_NE(err.find("rank-3-of-3 is not a writer's file name (rank 3 of 3)"), std::string::npos) << err;
  EXPECT_TRUE(victim.unchanged());
  std::remove((pre + ".rank-3-of-3").c_str());
  // Damage in the last file read is found before the first file's state is used.
  std::vector<Entries> last = three;
  last[2].erase("f0.t0");
  err = load_error(*victim.opt, write_set("last", last));
  EXPECT_NE(err.find("rank-2-of-3: entry 'f0.t0' is missing"), std::string::npos) << err;
  EXPECT_TRUE(victim.unchanged());
}

// Version 1 files (no digests) and version 2 files (no weights) still load, with every other
// check: the state, the parameters keeping their values.
TEST(ShardedCheckpoint, Version1And2FilesStillLoad) {
  Saved saved(StateFormat::Q4, "v1");
  for (int64_t version : {1, 2}) {
    SCOPED_TRACE(version);
    std::vector<at::Tensor> p = make_params(at::kFloat, device());
    auto o = make_opt(p);
    ld::load_fragments(*o, write_set("v" + std::to_string(version), {as_version(saved.entries, version)}));
    EXPECT_TRUE(all_bitwise_equal(all_state(*saved.opt, saved.params), all_state(*o, p)));
    EXPECT_TRUE(all_bitwise_equal(p, make_params(at::kFloat, device()))) << "the parameters keep their values";
  }
  // A version-1 file carrying digests is not what a version-1 writer wrote.
  Entries e = as_version(saved.entries, 1);
  resign_fragments(e);
  std::vector<at::Tensor> p = make_params(at::kFloat, device());
  auto o = make_opt(p);
  const std::string err = load_error(*o, write_set("v1_digests", {e}));
  EXPECT_NE(err.find("' is not one a version-1 writer writes"), std::string::npos) << err;
}

// Version 3: the weights come back with the state, from one writer or from several.
TEST(ShardedCheckpoint, WeightsLoadWithTheState) {
  Saved saved(StateFormat::Q4, "weights");
  for (int world : {1, 3}) {
    SCOPED_TRACE(world);
    std::vector<at::Tensor> p = make_params(at::kFloat, device());
    auto o = make_opt(p);
    ld::load_fragments(*o, write_set("weights" + std::to_string(world), split_fragment_file(saved.entries, world)));
    EXPECT_TRUE(all_bitwise_equal(p, saved.params)) << "the weights";
    EXPECT_TRUE(all_bitwise_equal(all_state(*saved.opt, saved.params), all_state(*o, p)));
  }
}

// A load replaces the whole state: a parameter the checkpoint holds no state for has none after.
TEST(ShardedCheckpoint, ParametersWithoutStateInTheFileHaveNoneAfterTheLoad) {
  Saved saved(StateFormat::Q4, "partial");
  Entries e = saved.entries;
  // Drop fragment 5 (the last): the file as if parameter 5 had never stepped.
  for (const char* k : {"f5.meta", "f5.slots", "f5.t0", "f5.t1"}) {
    e.erase(k);
    e.erase(std::string(k) + ".digest");
  }
  set_int(e, "header", kCount, 5);
  resign_fragments(e);
  Victim victim(StateFormat::Q4);
  ASSERT_NE(victim.opt->state_of(victim.params[5]), nullptr);
  ld::load_fragments(*victim.opt, write_set("partial", {e}));
  EXPECT_EQ(victim.opt->state_of(victim.params[5]), nullptr);
  ASSERT_NE(victim.opt->state_of(victim.params[0]), nullptr);
  EXPECT_EQ(victim.opt->state_of(victim.params[0])->step(), 2);
}

// ---------------------------------------------------------------------------------------------
// State in another layout than the optimizer's (LoadOptions::convert_state_format): refused by
// default, naming the file, the parameter, both layouts and the call that converts, changing nothing
// on any rank; converted on purpose, each parameter's state equals what one process's
// load_checkpoint(..., convert_state_format(true)) makes of the same state, sliced, and steps on
// like that process.
// ---------------------------------------------------------------------------------------------

const lo::LoadOptions kConvert = lo::LoadOptions().convert_state_format(true);

// Every state tensor of a sharded optimizer's fragments and its counters.
std::vector<at::Tensor> fragment_state(const ld::ShardedOptimizer& s) {
  std::vector<at::Tensor> out;
  for (const ld::Fragment& f : s.fragments())
    if (f.state.counters.defined()) {
      lowbit::optim::append_state_range(f.state, 0, f.numel, out);
      out.push_back(f.state.counters.clone());
    }
  return out;
}

// One process's conversion of `source`'s state (its own checkpoint, load_checkpoint) into an
// optimizer of `to` over a copy of `start`.
std::unique_ptr<lo::LowbitOptimizer> converted_by_one_process(const lo::LowbitOptimizer& source, StateFormat to,
                                                              int64_t master_bits, const std::vector<at::Tensor>& start,
                                                              std::vector<at::Tensor>& params, const std::string& name) {
  params = make_params(start[0].scalar_type(), device());
  for (size_t k = 0; k < params.size(); ++k) params[k].detach().copy_(start[k].detach());
  auto one = make_opt(params, to, master_bits);
  const std::string path = prefix_for(name + "_r" + std::to_string(comm().rank()) + ".pt");
  torch::save(source, path);
  lo::load_checkpoint(*one, path, kConvert);
  std::remove(path.c_str());
  return one;
}

// N ranks save `from` state; N ranks of `to` refuse it, then convert it.
void convert_on_load(StateFormat from, StateFormat to, int64_t master_bits) {
  const int world = comm().size();
  const std::string name = std::string("convert_") + lowbit::state_format_name(from) + "_" +
                           lowbit::state_format_name(to) + "_" + std::to_string(master_bits);
  std::vector<at::Tensor> params = make_params(at::kBFloat16, device()), ref_params = make_params(at::kBFloat16, device());
  auto ref = make_opt(ref_params, from, master_bits);
  ld::ShardedOptimizer source(std::shared_ptr<lo::LowbitOptimizer>(make_opt(params, from, master_bits)), comm_ptr());
  for (int s = 1; s <= 2; ++s) {
    set_grads(params, ref_params, s, world);
    source.step();
    ref->step();
  }
  const std::string pre = prefix_for(name);
  source.save(pre);
  // The target has stepped once: state of its own, which a refused load keeps.
  std::vector<at::Tensor> tp = make_params(at::kBFloat16, device());
  ld::ShardedOptimizer target(std::shared_ptr<lo::LowbitOptimizer>(make_opt(tp, to, master_bits)), comm_ptr());
  for (size_t k = 0; k < tp.size(); ++k)
    tp[k].mutable_grad() = rank_grad(comm().rank(), 9, static_cast<int>(k), tp[k].sizes(), at::kBFloat16).to(device());
  target.step();
  const auto before = fragment_state(target);
  const std::string err = lowbit_test::error_of([&] { target.load(pre); });
  for (const std::string& want :
       {std::string("the checkpoint holds its state in ") + lowbit::state_format_name(from) +
            " but this optimizer keeps it in " + lowbit::state_format_name(to),
        std::string("ShardedOptimizer::load(prefix, LoadOptions().convert_state_format(true))"),
        ld::fragment_file(pre, 0, world) + ": fragment 0 (parameter 0 of group 0)", std::string("nothing was loaded")})
    EXPECT_NE(err.find(want), std::string::npos) << "no '" << want << "' in: " << err;
  EXPECT_TRUE(all_bitwise_equal(before, fragment_state(target)));
  // On purpose: one process's conversion of the same state, sliced, and its next steps (from the
  // saved weights, which the load brings).
  std::vector<at::Tensor> one_params;
  auto one = converted_by_one_process(*ref, to, master_bits, ref_params, one_params, name);
  target.load(pre, kConvert);
  expect_fragments_match(target, *one, one_params);
  expect_next_steps_match(target, tp, *one, one_params, world);
  // What no conversion bridges: a master-weight correction of another width.
  if (master_bits != 0) {
    std::vector<at::Tensor> wp = make_params(at::kBFloat16, device());
    auto wider = make_opt(wp, to, master_bits == 24 ? 32 : 24);
    const std::string e = lowbit_test::error_of([&] { ld::load_fragments(*wider, pre, kConvert); });
    EXPECT_NE(e.find("state slot 3 is stored as int8_correction but this optimizer stores it as int16_correction "
                     "(master_weight_bits)"),
              std::string::npos)
        << e;
    EXPECT_EQ(wider->state_bytes(), 0);
  }
}

TEST(ShardedCheckpoint, AnotherStateFormatIsRefusedOrConvertedOnPurpose) {
  {
    SCOPED_TRACE("Q8 into Q4");
    convert_on_load(StateFormat::Q8, StateFormat::Q4, 0);
  }
  {
    // The master-weight correction loads as stored beside the converted moments.
    SCOPED_TRACE("Q8 into Q4, 24-bit master weights");
    convert_on_load(StateFormat::Q8, StateFormat::Q4, 24);
  }
}

// Three writers' Q4 files (every parameter cut across two of them) into an optimizer of another
// format on 1, 2 or 3 ranks, and into one unsharded optimizer with load_fragments: refused by
// default (load_fragments names itself), converted on purpose as one process converts them.
TEST(ShardedCheckpoint, ConvertingLoadsReshardThreeWritersOntoAnyRanks) {
  Saved saved(StateFormat::Q4, "convert3");
  const std::string pre = write_set("convert3_split", split_fragment_file(saved.entries, 3));
  {
    // A parameter's fragments in two layouts (the files of two jobs spliced) convert into nothing.
    Saved q8(StateFormat::Q8, "convert3_q8");
    std::vector<Entries> spliced = split_fragment_file(saved.entries, 3);
    spliced[1] = split_fragment_file(q8.entries, 3)[1];
    Victim victim(StateFormat::Q8);
    const std::string spliced_pre = write_set("convert3_spliced", spliced);
    const std::string err = lowbit_test::error_of([&] { ld::load_fragments(*victim.opt, spliced_pre, kConvert); });
    EXPECT_NE(err.find(ld::fragment_file(spliced_pre, 1, 3) +
                       ": fragment 0 (parameter 0 of group 0) holds its state as Q8 in blocks of 256, slots Dyn8Signed, "
                       "Dyn8Unsigned but " + ld::fragment_file(spliced_pre, 0, 3) +
                       ": fragment 0 (parameter 0 of group 0) as Q4 in blocks of 128, slots DE4Signed, Linear4Unsigned "
                       "(fragments of two checkpoints?)"),
              std::string::npos)
        << err;
    EXPECT_TRUE(victim.unchanged());
  }
  for (StateFormat to : {StateFormat::Q8, StateFormat::FP32}) {
    SCOPED_TRACE(lowbit::state_format_name(to));
    Victim victim(to);
    const std::string err = load_error(*victim.opt, pre);
    for (const std::string& want :
         {std::string("the checkpoint holds its state in Q4 but this optimizer keeps it in ") +
              lowbit::state_format_name(to),
          std::string("load_fragments(optimizer, prefix, LoadOptions().convert_state_format(true))"),
          ld::fragment_file(pre, 0, 3)})
      EXPECT_NE(err.find(want), std::string::npos) << "no '" << want << "' in: " << err;
    EXPECT_TRUE(victim.unchanged());
    std::vector<at::Tensor> one_params;
    auto one = converted_by_one_process(*saved.opt, to, 0, saved.params, one_params,
                                        std::string("convert3_") + lowbit::state_format_name(to));
    // One unsharded optimizer.
    std::vector<at::Tensor> up = make_params(at::kFloat, device());
    auto unsharded = make_opt(up, to);
    ld::load_fragments(*unsharded, pre, kConvert);
    EXPECT_TRUE(all_bitwise_equal(all_state(*one, one_params), all_state(*unsharded, up)));
    // This job's ranks, then a step on each side.
    std::vector<at::Tensor> tp = make_params(at::kFloat, device());
    for (size_t k = 0; k < tp.size(); ++k) tp[k].detach().copy_(saved.params[k].detach());
    ld::ShardedOptimizer target(std::shared_ptr<lo::LowbitOptimizer>(make_opt(tp, to)), comm_ptr());
    target.load(pre, kConvert);
    expect_fragments_match(target, *one, one_params);
    set_grads(tp, one_params, 3, comm().size());
    target.step();
    one->step();
    for (size_t k = 0; k < tp.size(); ++k) EXPECT_TRUE(bitwise_equal(tp[k], one_params[k])) << "parameter " << k;
    expect_fragments_match(target, *one, one_params);
  }
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
