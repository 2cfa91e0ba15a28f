// Optimizer checkpoints: quantized state saved as codes + absmax, resumed runs bit-exact, bad
// checkpoints refused with the optimizer left as it was.
#include <filesystem>
#include <fstream>

#include "checkpoint_edit.h"
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
  for (StateFormat f : lowbit::kAllStateFormats) {
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
  // A libtorch checkpoint, which only Adam / AdamW import.
  torch::optim::AdamW plain(p, torch::optim::AdamWOptions());
  const std::string foreign = temp_path("foreign");
  torch::save(plain, foreign);
  lo::Lion lion2(p, lo::LionOptions());
  EXPECT_THROW(torch::load(lion2, foreign), c10::Error);
  // Not a checkpoint of any optimizer.
  const std::string junk = temp_path("junk");
  torch::save(at::ones({3}), junk);
  check_unchanged(opt, [&] { torch::load(opt, junk); }, "not a lowbit optimizer checkpoint");
  std::filesystem::remove(junk);
  for (const auto& f : {path, cut, foreign}) std::filesystem::remove(f);
}

// A code no encoder writes (not finite in its format) is refused at load: here FP8's second moment
// relabelled from E4M3 to E5M2 (its other allowed format) and re-signed, where E4M3's code 0x7C (the
// top of its range) is Inf. Found by the fuzzer's long run (wrong_format_id, seed 7): the loader
// took it, and the first step then found every block overflowed.
TEST(Checkpoint, CodesThatAreNotFiniteInTheirFormatAreRefused) {
  auto p = params();
  lo::AdamW opt(p, lo::AdamWOptions().state_format(StateFormat::FP8));
  train(opt, p, grad_stream(p, 3), 0, 3);
  const std::string path = temp_path("fp8_relabel");
  torch::save(opt, path);
  lowbit_test::Entries e = lowbit_test::read_entries(path);
  std::string qkey;
  for (const auto& [k, v] : e)
    if (k.size() > 8 && k.compare(k.size() - 8, 8, "/qformat") == 0 && v.toInt() == int64_t(lowbit::QuantFormat::FP8E4M3) &&
        k.find("/slot/1/") != std::string::npos)
      qkey = k;
  ASSERT_FALSE(qkey.empty()) << "no E4M3 second-moment slot in the checkpoint";
  const std::string base = qkey.substr(0, qkey.size() - 8);
  e[qkey] = c10::IValue(int64_t(lowbit::QuantFormat::FP8E5M2));
  at::Tensor codes = e[base + "/codes"].toTensor().clone();
  codes.reshape(-1)[7] = 0x7C;
  e[base + "/codes"] = c10::IValue(codes);
  lowbit_test::resign(e);
  lowbit_test::write_entries(e, path);
  const auto before = opt.export_state_fp32(p[0]);
  try {
    lo::load_checkpoint(opt, path);
    ADD_FAILURE() << "a code that is Inf in its format loaded";
  } catch (const c10::Error& err) {
    EXPECT_NE(std::string(err.what_without_backtrace()).find("is not a finite value of format FP8E5M2"), std::string::npos)
        << err.what_without_backtrace();
  }
  const auto after = opt.export_state_fp32(p[0]);
  for (size_t k = 0; k < before.size(); ++k) EXPECT_TRUE(lowbit_test::bitwise_equal(before[k], after[k]));
  std::filesystem::remove(path);
}

// libtorch does not check its archive's CRCs on load: a flipped bit in a tensor's data loads
// silently. load_checkpoint checks every record's CRC-32 before libtorch reads the file; an archive
// read by libtorch alone (torch::load) meets version 2's digests, and the header's digest refuses
// a changed step count.
TEST(Checkpoint, FlippedBitsAreCaughtByTheDigests) {
  auto p = params();
  lo::AdamW opt(p, lo::AdamWOptions().state_format(StateFormat::Q8));
  train(opt, p, grad_stream(p, 3), 0, 3);
  const std::string path = temp_path("digest"), bad = temp_path("digest_bad");
  torch::save(opt, path);
  const std::string data = lowbit_test::read_file(path);
  // The largest data record: a tensor's bytes.
  std::pair<size_t, size_t> span{0, 0};
  for (const auto& [name, s] : lowbit_test::record_spans(path))
    if (name.rfind("data/", 0) == 0 && s.second > span.second) span = s;
  ASSERT_GT(span.second, 1000u);
  std::string flipped = data;
  flipped[span.first + span.second / 2] ^= 0x10;
  lowbit_test::write_file(bad, flipped);
  {
    torch::serialize::InputArchive a;
    EXPECT_NO_THROW(a.load_from(bad));  // libtorch itself notices nothing
  }
  const auto before = opt.export_state_fp32(p[2]);
  for (const char* want : {"is corrupt: its CRC-32", "is corrupt: its digest"}) {
    try {
      if (std::string(want).find("CRC") != std::string::npos)
        lo::load_checkpoint(opt, bad);  // the zip checked first
      else
        torch::load(opt, bad);  // libtorch's reader alone, then ours
      ADD_FAILURE() << "a flipped data bit loaded";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what_without_backtrace()).find(want), std::string::npos) << e.what_without_backtrace();
    }
    const auto after = opt.export_state_fp32(p[2]);
    for (size_t k = 0; k < before.size(); ++k) EXPECT_TRUE(lowbit_test::bitwise_equal(before[k], after[k]));
  }
  // A changed integer in the header (the step count), digests left as written.
  auto e = lowbit_test::read_entries(path);
  e["param/0/2/step"] = c10::IValue(int64_t(4));
  lowbit_test::write_entries(e, bad);
  lo::AdamW fresh(p, lo::AdamWOptions().state_format(StateFormat::Q8));
  EXPECT_THROW(
      {
        try {
          lo::load_checkpoint(fresh, bad);
        } catch (const c10::Error& err) {
          EXPECT_NE(std::string(err.what_without_backtrace()).find("header is corrupt"), std::string::npos);
          throw;
        }
      },
      c10::Error);
  EXPECT_EQ(fresh.state_of(p[0]), nullptr);
  std::filesystem::remove(path);
  std::filesystem::remove(bad);
}

// A version-1 checkpoint (no digests) still loads, and resumes bit-exact.
TEST(Checkpoint, VersionOneStillLoads) {
  auto p0 = params();
  const auto gs = grad_stream(p0, 6);
  std::vector<at::Tensor> a, b;
  for (auto& t : p0) {
    a.push_back(t.clone());
    b.push_back(t.clone());
  }
  const auto opts = lo::AdamWOptions(1e-2).state_format(StateFormat::Q4);
  lo::AdamW straight(a, opts);
  train(straight, a, gs, 0, 6);
  lo::AdamW first(b, opts);
  train(first, b, gs, 0, 3);
  const std::string path = temp_path("v1");
  torch::save(first, path);
  auto e = lowbit_test::read_entries(path);
  for (auto it = e.begin(); it != e.end();) it = it->first.find("digest") != std::string::npos ? e.erase(it) : ++it;
  e["lowbit/version"] = c10::IValue(int64_t(1));
  lowbit_test::write_entries(e, path);
  lo::AdamW resumed(b, opts);
  lo::load_checkpoint(resumed, path);
  train(resumed, b, gs, 3, 6);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(lowbit_test::bitwise_equal(a[i], b[i])) << "param " << i;
  // Version 3 is refused by name.
  e["lowbit/version"] = c10::IValue(int64_t(3));
  lowbit_test::write_entries(e, path);
  EXPECT_THROW(lo::load_checkpoint(resumed, path), c10::Error);
  std::filesystem::remove(path);
}

// A libtorch AdamW checkpoint loads into lowbit's AdamW (state quantized when asked), and lowbit's
// fp32 export continues in libtorch's AdamW.
TEST(Checkpoint, InteropWithLibtorchAdamW) {
  auto p0 = params();
  const auto gs = grad_stream(p0, 60);
  std::vector<at::Tensor> a, b;
  for (auto& t : p0) {
    a.push_back(t.clone());
    b.push_back(t.clone());
  }
  const auto topts = torch::optim::AdamWOptions(1e-2).weight_decay(0.05);
  torch::optim::AdamW theirs(a, topts);
  for (int s = 0; s < 30; ++s) {
    for (size_t i = 0; i < a.size(); ++i) a[i].mutable_grad() = gs[s][i].clone();
    theirs.step();
  }
  const std::string path = temp_path("torch_adamw");
  torch::save(theirs, path);
  for (size_t i = 0; i < a.size(); ++i) b[i].detach().copy_(a[i]);

  for (StateFormat f : {StateFormat::FP32, StateFormat::Q8}) {
    std::vector<at::Tensor> c;
    for (auto& t : b) c.push_back(t.clone());
    lo::AdamW ours(c, lo::AdamWOptions(1e-3).weight_decay(0.05).state_format(f));
    torch::load(ours, path);
    EXPECT_DOUBLE_EQ(ours.param_groups()[0].options().get_lr(), 1e-2);  // lr comes from the checkpoint
    EXPECT_EQ(ours.state_of(c[0])->step(), 30);
    EXPECT_EQ(ours.state_of(c[0])->format, f);
    train(ours, c, gs, 30, 60);
    if (f == StateFormat::FP32) {
      // Continue libtorch's run too: the two agree to rounding.
      for (int s = 30; s < 60; ++s) {
        for (size_t i = 0; i < a.size(); ++i) a[i].mutable_grad() = gs[s][i].clone();
        theirs.step();
      }
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_LE(((c[i] - a[i]).norm() / a[i].norm()).item<double>(), 1e-6) << "param " << i;
    } else {
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_LE(((c[i] - a[i]).norm() / a[i].norm()).item<double>(), 1e-2) << "Q8 param " << i;
    }
  }
  std::filesystem::remove(path);

  // Export: lowbit's state as fp32 tensors seeds libtorch's AdamW.
  std::vector<at::Tensor> d, e;
  for (auto& t : p0) {
    d.push_back(t.clone());
    e.push_back(t.clone());
  }
  lo::AdamW mine(d, lo::AdamWOptions(1e-2).weight_decay(0.05).state_format(StateFormat::FP32));
  train(mine, d, gs, 0, 30);
  for (size_t i = 0; i < d.size(); ++i) e[i].detach().copy_(d[i]);
  torch::optim::AdamW other(e, topts);
  for (size_t i = 0; i < e.size(); ++i) {
    const auto st = mine.export_state_fp32(d[i]);
    auto ps = std::make_unique<torch::optim::AdamWParamState>();
    ps->step(mine.state_of(d[i])->step());
    ps->exp_avg(st[0].clone());
    ps->exp_avg_sq(st[1].clone());
    other.state()[e[i].unsafeGetTensorImpl()] = std::move(ps);
  }
  train(mine, d, gs, 30, 60);
  for (int s = 30; s < 60; ++s) {
    for (size_t i = 0; i < e.size(); ++i) e[i].mutable_grad() = gs[s][i].clone();
    other.step();
  }
  for (size_t i = 0; i < d.size(); ++i) EXPECT_LE(((d[i] - e[i]).norm() / e[i].norm()).item<double>(), 1e-6);
}

// `lowbit inspect FILE` reports what a checkpoint holds.
TEST(Checkpoint, InspectCommandListsParametersFormatsAndBytes) {
  auto p = params();
  lo::AdamW opt(p, lo::AdamWOptions().state_format(StateFormat::Q4));
  train(opt, p, grad_stream(p, 2), 0, 2);
  const std::string path = temp_path("inspect"), out = path + ".txt";
  torch::save(opt, path);
  ASSERT_EQ(std::system((std::string(LOWBIT_CLI_PATH) + " inspect " + path + " > " + out).c_str()), 0);
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("lowbit::optim::AdamW checkpoint, format version 2"), std::string::npos) << text;
  EXPECT_NE(text.find("DE4Signed:"), std::string::npos) << text;
  EXPECT_NE(text.find("Linear4Unsigned:"), std::string::npos) << text;
  EXPECT_NE(text.find("bytes of state"), std::string::npos) << text;
  EXPECT_NE(text.find(std::to_string(opt.state_bytes()) + " bytes of state"), std::string::npos) << text;
  // A file that is not a checkpoint: a non-zero exit and a message.
  EXPECT_NE(std::system((std::string(LOWBIT_CLI_PATH) + " inspect " + out + " 2>/dev/null").c_str()), 0);
  std::filesystem::remove(path);
  std::filesystem::remove(out);
}

// ---- A checkpoint of another state layout (format, block size, float8 second moment) ----------

namespace {

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& p) {
  std::vector<at::Tensor> out;
  for (const auto& t : p) out.push_back(t.clone());
  return out;
}

// Every bit of the optimizer's state of `t`: format, block size, counters and each slot's storage
// and tensors (nothing before its first step).
std::vector<at::Tensor> state_bits(const lo::LowbitOptimizer& opt, const at::Tensor& t) {
  std::vector<at::Tensor> out;
  const lo::ParamState* st = opt.state_of(t);
  if (!st) return out;
  out.push_back(at::tensor({int64_t(st->format), st->block_size}));
  out.push_back(st->counters.clone());
  for (const auto& s : st->slots) {
    out.push_back(at::tensor({int64_t(s.type.storage), int64_t(s.type.format)}));
    if (s.dense.defined()) out.push_back(s.dense.clone());
    if (s.quantized.defined()) {
      out.push_back(s.quantized.codes().clone());
      out.push_back(s.quantized.absmax().clone());
    }
  }
  return out;
}

// Every bit the optimizer holds for `p`: the parameters' values and their state.
std::vector<at::Tensor> snapshot(const lo::LowbitOptimizer& opt, const std::vector<at::Tensor>& p) {
  std::vector<at::Tensor> out;
  for (const auto& t : p) {
    out.push_back(t.detach().clone());
    for (auto& b : state_bits(opt, t)) out.push_back(b);
  }
  return out;
}

bool same_bits(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!lowbit_test::bitwise_equal(a[i], b[i])) return false;
  return true;
}

// An AdamW over `p`, `steps` steps into `gs`.
std::unique_ptr<lo::AdamW> trained(std::vector<at::Tensor>& p, const lo::AdamWOptions& opts,
                                   const std::vector<std::vector<at::Tensor>>& gs, int steps) {
  auto opt = std::make_unique<lo::AdamW>(p, opts);
  train(*opt, p, gs, 0, steps);
  return opt;
}

// amsgrad: a third moment, so that every slot's conversion is seen.
lo::AdamWOptions amsgrad(StateFormat f) { return lo::AdamWOptions(1e-2).amsgrad(true).state_format(f); }

}  // namespace

// The default: a parameter whose checkpointed state is not in the layout this optimizer gives it
// is refused, naming the parameter and both layouts, and the optimizer (trained, with state of
// its own) is bit-identical afterwards.
TEST(Checkpoint, AnotherStateLayoutIsRefusedAndChangesNothing) {
  const auto p0 = params();
  const auto gs = grad_stream(p0, 3);
  struct Case {
    std::string name;
    lo::AdamWOptions saved, loaded;
    std::function<void(lo::AdamW&, const std::vector<at::Tensor>&)> setup;
    std::vector<std::string> want;
  };
  const std::vector<Case> cases = {
      {"Q8 into Q4", amsgrad(StateFormat::Q8), amsgrad(StateFormat::Q4), nullptr,
       {"parameter 0 of group 0 (param/0/0, shape [5000])",
        "the checkpoint holds its state in Q8 but this optimizer keeps it in Q4", "convert_state_format(true)"}},
      {"FP32 into Q8", amsgrad(StateFormat::FP32), amsgrad(StateFormat::Q8), nullptr,
       {"parameter 0 of group 0", "the checkpoint holds its state in FP32 but this optimizer keeps it in Q8",
        "convert_state_format(true)"}},
      {"Q8 into an FP32 override", amsgrad(StateFormat::Q8), amsgrad(StateFormat::Q8),
       [](lo::AdamW& o, const std::vector<at::Tensor>& p) { o.override_state_format(p[2], StateFormat::FP32); },
       {"parameter 2 of group 0 (param/0/2, shape [40001])", "in Q8 but this optimizer keeps it in FP32"}},
      {"Q8 in blocks of 256 into blocks of 128", amsgrad(StateFormat::Q8), amsgrad(StateFormat::Q8).block_size(128),
       nullptr, {"parameter 0 of group 0", "Q8 state in blocks of 256 but this optimizer uses blocks of 128"}},
      {"FP8 with an E5M2 second moment into E4M3",
       amsgrad(StateFormat::FP8).fp8_second_moment(lowbit::QuantFormat::FP8E5M2), amsgrad(StateFormat::FP8), nullptr,
       {"parameter 0 of group 0", "slot 1 of its FP8 state as FP8E5M2", "FP8E4M3"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto ps = clones(p0);
    auto source = trained(ps, c.saved, gs, 3);
    const std::string path = temp_path("layout");
    torch::save(*source, path);
    auto pt = clones(p0);
    lo::AdamW target(pt, lo::AdamWOptions(c.loaded).lr(1e-3));
    if (c.setup) c.setup(target, pt);
    train(target, pt, gs, 0, 2);
    const auto before = snapshot(target, pt);
    // load_checkpoint, and torch::load (the same loader behind libtorch's reader).
    for (bool via_torch_load : {false, true}) {
      const std::string err = lowbit_test::error_of([&] {
        if (via_torch_load)
          torch::load(target, path);
        else
          lo::load_checkpoint(target, path);
      });
      ASSERT_FALSE(err.empty()) << "loaded";
      for (const auto& w : c.want) EXPECT_NE(err.find(w), std::string::npos) << "no '" << w << "' in: " << err;
      EXPECT_TRUE(same_bits(before, snapshot(target, pt)));
      EXPECT_DOUBLE_EQ(target.param_groups()[0].options().get_lr(), 1e-3);
    }
    std::filesystem::remove(path);
  }
}

// On purpose (LoadOptions::convert_state_format): each moment (amsgrad's third included) is the
// file's dequantized and requantized in the optimizer's format and block size; the step count and
// lr load as stored; the next step runs. A parameter already in the optimizer's layout (the small
// one keeps FP32 state on both sides) loads bit for bit, as every same-layout load does.
TEST(Checkpoint, ConvertStateFormatRequantizesOnPurpose) {
  const auto p0 = params();
  const auto gs = grad_stream(p0, 5);
  const std::pair<StateFormat, StateFormat> pairs[] = {
      {StateFormat::Q8, StateFormat::Q4}, {StateFormat::FP32, StateFormat::Q8}, {StateFormat::Q4, StateFormat::BF16},
      {StateFormat::Q8, StateFormat::Q8}};
  for (const auto& [from, to] : pairs) {
    SCOPED_TRACE(std::string(lowbit::state_format_name(from)) + " into " + lowbit::state_format_name(to));
    auto ps = clones(p0);
    auto source = trained(ps, amsgrad(from), gs, 3);
    const std::string path = temp_path("convert");
    torch::save(*source, path);
    auto pt = clones(p0);
    lo::AdamW target(pt, amsgrad(to).lr(1e-3));
    lo::load_checkpoint(target, path, lo::LoadOptions().convert_state_format(true));
    EXPECT_DOUBLE_EQ(target.param_groups()[0].options().get_lr(), 1e-2);
    for (size_t i = 0; i < pt.size(); ++i) {
      const lo::ParamState& src = *source->state_of(ps[i]);
      const lo::ParamState& got = *target.state_of(pt[i]);
      EXPECT_EQ(got.step(), 3) << "param " << i;
      const StateFormat want = lowbit::is_quantized(to) && pt[i].numel() < 4096 ? StateFormat::FP32 : to;
      ASSERT_STREQ(lowbit::state_format_name(got.format), lowbit::state_format_name(want)) << "param " << i;
      if (src.format == want) {
        // Already in the optimizer's layout: loaded as stored, nothing requantized.
        EXPECT_TRUE(same_bits(state_bits(*source, ps[i]), state_bits(target, pt[i]))) << "param " << i;
        continue;
      }
      for (size_t k = 0; k < 3; ++k) {
        SCOPED_TRACE(c10::str("param ", i, " slot ", k));
        const lo::StateSlot& s = got.slots[k];
        const at::Tensor values = src.slots[k].to_float();
        if (s.type.storage == lowbit::kernels::SlotStorage::Quant) {
          EXPECT_STREQ(lowbit::format_name(s.type.format), lowbit::format_name(lowbit::quant_format_for(to, k == 0)));
          EXPECT_EQ(got.block_size, lowbit::default_block_size(lowbit::quant_format_for(to, true)));
          const lowbit::QTensor requantized = lowbit::quantize(values, s.type.format, got.block_size);
          EXPECT_TRUE(lowbit_test::bitwise_equal(s.quantized.codes(), requantized.codes()));
          EXPECT_TRUE(lowbit_test::bitwise_equal(s.quantized.absmax(), requantized.absmax()));
        } else {
          EXPECT_TRUE(lowbit_test::bitwise_equal(s.dense, values.to(s.dense.scalar_type())));
        }
      }
    }
    // The next step runs from the converted state.
    train(target, pt, gs, 3, 4);
    for (size_t i = 0; i < pt.size(); ++i) {
      EXPECT_EQ(target.state_of(pt[i])->step(), 4);
      EXPECT_TRUE(at::isfinite(pt[i]).all().item<bool>());
      EXPECT_FALSE(lowbit_test::bitwise_equal(pt[i], p0[i])) << "param " << i << " did not move";
    }
    std::filesystem::remove(path);
  }
}

// What is not a moment survives a conversion: bf16 parameters' master-weight corrections (the
// master values bit for bit) and the step count; and without the opt-in the same file is refused.
TEST(Checkpoint, ConvertStateFormatKeepsMasterWeights) {
  std::vector<at::Tensor> p0 = {at::randn({5000}).to(at::kBFloat16), at::randn({40001}).to(at::kBFloat16)};
  std::vector<std::vector<at::Tensor>> gs;
  for (int s = 0; s < 3; ++s) gs.push_back({at::randn({5000}).to(at::kBFloat16), at::randn({40001}).to(at::kBFloat16)});
  const auto opts = [](StateFormat f) { return lo::AdamWOptions(1e-2).master_weight_bits(32).state_format(f); };
  auto ps = clones(p0);
  auto source = trained(ps, opts(StateFormat::Q8), gs, 3);
  const std::string path = temp_path("convert_master");
  torch::save(*source, path);
  auto pt = clones(ps);  // the trained bf16 weights, as a model checkpoint would restore them
  lo::AdamW target(pt, opts(StateFormat::Q4));
  EXPECT_NE(lowbit_test::error_of([&] { lo::load_checkpoint(target, path); }).find("Q8 but this optimizer keeps it in Q4"),
            std::string::npos);
  EXPECT_EQ(target.state_bytes(), 0);
  lo::load_checkpoint(target, path, lo::LoadOptions().convert_state_format(true));
  for (size_t i = 0; i < pt.size(); ++i) {
    EXPECT_STREQ(lowbit::state_format_name(target.state_of(pt[i])->format), "Q4");
    EXPECT_EQ(target.state_of(pt[i])->step(), 3);
    EXPECT_TRUE(lowbit_test::bitwise_equal(target.export_master_fp32(pt[i]), source->export_master_fp32(ps[i])))
        << "param " << i;
  }
  std::filesystem::remove(path);
}

// A load into the layout the checkpoint was written in is bit for bit, with or without the opt-in.
TEST(Checkpoint, SameLayoutLoadIsBitExact) {
  const auto p0 = params();
  const auto gs = grad_stream(p0, 3);
  for (StateFormat f : lowbit::kAllStateFormats) {
    SCOPED_TRACE(lowbit::state_format_name(f));
    auto ps = clones(p0);
    auto source = trained(ps, amsgrad(f), gs, 3);
    const std::string path = temp_path("same_layout");
    torch::save(*source, path);
    for (bool convert : {false, true}) {
      auto pt = clones(p0);
      lo::AdamW target(pt, amsgrad(f));
      lo::load_checkpoint(target, path, lo::LoadOptions().convert_state_format(convert));
      for (size_t i = 0; i < pt.size(); ++i)
        EXPECT_TRUE(same_bits(state_bits(*source, ps[i]), state_bits(target, pt[i]))) << "param " << i;
    }
    std::filesystem::remove(path);
  }
}
