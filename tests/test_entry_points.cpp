// Bad input at every public C++ entry point, as a table: each row one call that must raise a
// c10::Error whose message names the argument (and, where it has one, the bad value); and the
// command-line tools' bad arguments (the second table).
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "checkpoint_edit.h"
#include "test_util.h"

#include <lowbit/tensors/keyed_random.h>
#include <lowbit/tensors/optim_ops.h>
#include <lowbit/tensors/wire_ops.h>

namespace lo = lowbit::optim;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Row {
  std::string name;
  std::function<void()> call;
  std::vector<std::string> want;  // substrings of the message
};

at::Tensor dequant(const at::Tensor& codes, const at::Tensor& absmax, const std::string& f, int64_t b,
                   std::vector<int64_t> shape) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::dequantize_blockwise", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, std::string_view, int64_t,
                                         at::IntArrayRef, std::optional<at::ScalarType>)>();
  return op.call(codes, absmax, f, b, shape, std::nullopt);
}

std::tuple<at::Tensor, at::Tensor> quant(const at::Tensor& x, const std::string& f, int64_t b) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::quantize_blockwise", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, std::string_view, int64_t)>();
  return op.call(x, f, b);
}

// One step of `make`'s optimizer over `params` (gradients of ones).
template <typename Opt, typename Options>
void step_with(std::vector<at::Tensor> params, Options o) {
  Opt opt(params, o);
  for (auto& p : params) p.mutable_grad() = at::ones_like(p);
  opt.step();
}

// The optimizer options rows: every optimizer's hyper-parameters NaN / Inf / negative.
template <typename Opt, typename Options>
void option_rows(std::vector<Row>& rows, const std::string& opt, const std::vector<std::pair<std::string,
                 std::function<Options(double)>>>& fields) {
  for (const auto& [field, set] : fields)
    for (double bad : {kNaN, kInf, -1.0}) {
      std::ostringstream v;
      v << bad;
      rows.push_back({opt + " " + field + "=" + v.str(), [set = set, bad] {
                        Opt o({at::zeros({4})}, set(bad));
                      },
                      {field, v.str()}});
    }
}

void checkpoint_rows(std::vector<Row>& r);
std::string rows_dir();
void remove_dir(const std::string& dir);

std::vector<Row> rows() {
  std::vector<Row> r;
  const auto x = at::randn({1000});
  // ---- quantize / dequantize ops
  r.push_back({"quantize: unknown format", [=] { quant(x, "Dyn9", 0); }, {"Dyn9"}});
  r.push_back({"quantize: block_size not a power of two", [=] { quant(x, "Dyn8Signed", 100); }, {"block_size", "100"}});
  r.push_back({"quantize: block_size negative", [=] { quant(x, "Dyn8Signed", -256); }, {"block_size", "-256"}});
  r.push_back({"quantize: wrong dtype", [=] { quant(x.to(at::kLong), "Dyn8Signed", 0); }, {"Long"}});
  r.push_back({"quantize: sparse layout", [=] { quant(x.to_sparse(), "Dyn8Signed", 0); }, {"input"}});
  const auto [codes, absmax] = quant(x, "Dyn8Signed", 0);
  r.push_back({"dequantize: codes wrong dtype", [c = codes, m = absmax] { dequant(c.to(at::kFloat), m, "Dyn8Signed", 0, {1000}); },
               {"codes", "Float"}});
  r.push_back({"dequantize: absmax too short", [c = codes, m = absmax] { dequant(c, m.narrow(0, 0, 1), "Dyn8Signed", 0, {1000}); },
               {"absmax"}});
  r.push_back({"dequantize: shape mismatch", [c = codes, m = absmax] { dequant(c, m, "Dyn8Signed", 0, {999}); },
               {"999"}});
  r.push_back({"dequantize: unknown format", [c = codes, m = absmax] { dequant(c, m, "nope", 0, {1000}); }, {"nope"}});
  r.push_back({"dequantize: block_size 0 resolved, 3 refused", [c = codes, m = absmax] { dequant(c, m, "Dyn8Signed", 3, {1000}); },
               {"block_size", "3"}});

  // ---- the low-bit wire's ops and LAMB's block sums (sharded steps)
  const auto rows2 = at::zeros({2, 260}, at::kByte);  // 2 rows of 256 Dyn8Signed codes + 1 absmax
  const auto flat = at::randn({512});
  r.push_back({"wire_pack_: unsigned format", [=] { lowbit::ops::wire_pack_(flat, rows2, "Dyn8Unsigned", 256); },
               {"wire_pack_", "Dyn8Unsigned", "unsigned"}});
  r.push_back({"wire_pack_: packed row bytes", [=] { lowbit::ops::wire_pack_(flat, rows2, "Dyn8Signed", 128); },
               {"wire_pack_", "260 bytes", "264"}});
  r.push_back({"wire_pack_: input not whole chunks", [=] { lowbit::ops::wire_pack_(flat.narrow(0, 0, 511), rows2, "Dyn8Signed", 256); },
               {"input", "511"}});
  r.push_back({"wire_unpack_: bf16 output", [=] { lowbit::ops::wire_unpack_(rows2, flat.to(at::kBFloat16), "Dyn8Signed", 256); },
               {"wire_unpack_", "output must be float32"}});
  const auto sums = at::zeros({10, 2}, at::kDouble);
  r.push_back({"lamb_add_block_sums: range past the blocks", [=] { lowbit::ops::lamb_add_block_sums(sums, {8}, {3}); },
               {"lamb_add_block_sums", "range 0", "first 8", "count 3", "10 blocks"}});
  r.push_back({"lamb_add_block_sums: float32 sums", [=] { lowbit::ops::lamb_add_block_sums(sums.to(at::kFloat), {0}, {1}); },
               {"lamb_add_block_sums", "float64"}});

  // ---- keyed_normal_ (a fully sharded model's initial values, filled per shard)
  const auto values = at::zeros({8});
  r.push_back({"keyed_normal_: integer out", [] { lowbit::keyed_normal_(at::zeros({8}, at::kLong), 0, 1, 1); },
               {"keyed_normal_", "out has dtype Long"}});
  r.push_back({"keyed_normal_: meta out", [] { lowbit::keyed_normal_(at::empty({8}, at::Device(at::kMeta)), 0, 1, 1); },
               {"keyed_normal_", "out is on meta"}});
  r.push_back({"keyed_normal_: mean NaN", [=] { lowbit::keyed_normal_(values, kNaN, 1, 1); }, {"keyed_normal_", "mean is nan"}});
  r.push_back({"keyed_normal_: std negative", [=] { lowbit::keyed_normal_(values, 0, -0.5, 1); },
               {"keyed_normal_", "std is -0.5"}});
  r.push_back({"keyed_normal_: std Inf", [=] { lowbit::keyed_normal_(values, 0, kInf, 1); }, {"keyed_normal_", "std is inf"}});
  r.push_back({"keyed_normal_: first_element negative", [=] { lowbit::keyed_normal_(values, 0, 1, 1, -3); },
               {"keyed_normal_", "first_element is -3"}});
  r.push_back({"keyed_normal_: indices past 2^63", [=] { lowbit::keyed_normal_(values, 0, 1, 1, INT64_MAX - 4); },
               {"keyed_normal_", "first_element is 9223372036854775803", "8 elements"}});

  // ---- optimizer options: common ones and each optimizer's hyper-parameters
  r.push_back({"lr NaN", [] { lo::AdamW o({at::zeros({4})}, lo::AdamWOptions(kNaN)); }, {"lr must be", "nan"}});
  r.push_back({"lr Inf", [] { lo::Lion o({at::zeros({4})}, lo::LionOptions(kInf)); }, {"lr must be", "inf"}});
  r.push_back({"lr negative", [] { lo::SGD o({at::zeros({4})}, lo::SGDOptions(-0.5)); }, {"lr must be", "-0.5"}});
  r.push_back({"set_lr NaN", [] {
                 lo::AdamW o({at::zeros({4})}, lo::AdamWOptions());
                 o.param_groups()[0].options().set_lr(kNaN);
               }, {"lr must be", "nan"}});
  r.push_back({"options().lr(NaN) then step", [] {
                 std::vector<at::Tensor> p = {at::zeros({4})};
                 lo::AdamW o(p, lo::AdamWOptions());
                 static_cast<lo::AdamWOptions&>(o.param_groups()[0].options()).lr(kNaN);
                 p[0].mutable_grad() = at::ones({4});
                 o.step();
               }, {"lr must be", "nan"}});
  r.push_back({"block_size not a power of two", [] { lo::AdamW o({at::zeros({4})}, lo::AdamWOptions().block_size(100)); },
               {"block_size", "100"}});
  r.push_back({"block_size negative", [] { lo::AdamW o({at::zeros({4})}, lo::AdamWOptions().block_size(-1)); },
               {"block_size", "-1"}});
  r.push_back({"min_quant_numel negative", [] { lo::AdamW o({at::zeros({4})}, lo::AdamWOptions().min_quant_numel(-1)); },
               {"min_quant_numel", "-1"}});
  r.push_back({"max_grad_norm NaN", [] { lo::AdamW o({at::zeros({4})}, lo::AdamWOptions().max_grad_norm(kNaN)); },
               {"max_grad_norm", "nan"}});
  r.push_back({"max_grad_norm Inf", [] { lo::AdamW o({at::zeros({4})}, lo::AdamWOptions().max_grad_norm(kInf)); },
               {"max_grad_norm", "inf"}});
  r.push_back({"fp8_second_moment not float8", [] {
                 lo::AdamW o({at::zeros({4})}, lo::AdamWOptions().fp8_second_moment(lowbit::QuantFormat::Dyn8Signed));
               }, {"fp8_second_moment", "Dyn8Signed"}});
  option_rows<lo::Adam, lo::AdamOptions>(r, "Adam", {
      {"eps", [](double v) { return lo::AdamOptions().eps(v); }},
      {"weight_decay", [](double v) { return lo::AdamOptions().weight_decay(v); }},
      {"beta1", [](double v) { return lo::AdamOptions().betas({v, 0.999}); }},
      {"beta2", [](double v) { return lo::AdamOptions().betas({0.9, v}); }}});
  option_rows<lo::AdamW, lo::AdamWOptions>(r, "AdamW", {
      {"eps", [](double v) { return lo::AdamWOptions().eps(v); }},
      {"weight_decay", [](double v) { return lo::AdamWOptions().weight_decay(v); }},
      {"beta1", [](double v) { return lo::AdamWOptions().betas({v, 0.999}); }}});
  option_rows<lo::SGD, lo::SGDOptions>(r, "SGD", {
      {"momentum", [](double v) { return lo::SGDOptions(0.1).momentum(v); }},
      {"weight_decay", [](double v) { return lo::SGDOptions(0.1).weight_decay(v); }}});
  option_rows<lo::Lion, lo::LionOptions>(r, "Lion", {
      {"weight_decay", [](double v) { return lo::LionOptions().weight_decay(v); }},
      {"beta2", [](double v) { return lo::LionOptions().betas({0.9, v}); }}});
  option_rows<lo::RMSprop, lo::RMSpropOptions>(r, "RMSprop", {
      {"eps", [](double v) { return lo::RMSpropOptions().eps(v); }},
      {"momentum", [](double v) { return lo::RMSpropOptions().momentum(v); }},
      {"alpha", [](double v) { return lo::RMSpropOptions().alpha(v); }},
      {"weight_decay", [](double v) { return lo::RMSpropOptions().weight_decay(v); }}});
  option_rows<lo::Adagrad, lo::AdagradOptions>(r, "Adagrad", {
      {"lr_decay", [](double v) { return lo::AdagradOptions().lr_decay(v); }},
      {"initial_accumulator_value", [](double v) { return lo::AdagradOptions().initial_accumulator_value(v); }},
      {"eps", [](double v) { return lo::AdagradOptions().eps(v); }}});
  option_rows<lo::AdEMAMix, lo::AdEMAMixOptions>(r, "AdEMAMix", {
      {"alpha", [](double v) { return lo::AdEMAMixOptions().alpha(v); }},
      {"eps", [](double v) { return lo::AdEMAMixOptions().eps(v); }},
      {"beta3", [](double v) { return lo::AdEMAMixOptions().betas({0.9, 0.999, v}); }}});
  option_rows<lo::LAMB, lo::LAMBOptions>(r, "LAMB", {
      {"eps", [](double v) { return lo::LAMBOptions().eps(v); }},
      {"weight_decay", [](double v) { return lo::LAMBOptions().weight_decay(v); }}});
  r.push_back({"SGD dampening NaN", [] { lo::SGD o({at::zeros({4})}, lo::SGDOptions(0.1).dampening(kNaN)); },
               {"dampening", "nan"}});

  // ---- the step: parameters and gradients
  r.push_back({"step: integer parameter", [] { step_with<lo::AdamW>({at::zeros({4}, at::kLong)}, lo::AdamWOptions()); },
               {"parameter 0", "Long"}});
  r.push_back({"step: sparse gradient", [] {
                 std::vector<at::Tensor> p = {at::zeros({4})};
                 lo::AdamW o(p, lo::AdamWOptions());
                 p[0].mutable_grad() = at::ones({4}).to_sparse();
                 o.step();
               }, {"parameter 0", "sparse"}});
  r.push_back({"step: gradient of another shape", [] {
                 std::vector<at::Tensor> p = {at::zeros({4})};
                 lo::AdamW o(p, lo::AdamWOptions());
                 p[0].mutable_grad() = at::ones({5});
                 o.step();
               }, {"parameter 0", "[5]"}});
  r.push_back({"step: one parameter passed twice (overlapping outputs)", [] {
                 const at::Tensor p = at::zeros({64});
                 step_with<lo::AdamW>({p, p.view({8, 8})}, lo::AdamWOptions());
               }, {"parameter 1", "parameter 0", "share memory"}});
  r.push_back({"step: parameters overlapping in part", [] {
                 const at::Tensor base = at::zeros({100});
                 step_with<lo::SGD>({base.narrow(0, 0, 60), base.narrow(0, 50, 50)}, lo::SGDOptions(0.1).momentum(0.9));
               }, {"parameter", "share memory"}});
  r.push_back({"step: outputs made to overlap after a step that passed (no stale result)", [] {
                 std::vector<at::Tensor> p = {at::zeros({64}), at::zeros({64})};
                 lo::AdamW o(p, lo::AdamWOptions());
                 for (at::Tensor& t : p) t.mutable_grad() = at::ones({64});
                 o.step();
                 p[1].set_(p[0]);  // the same outputs, but parameter 1 now aliases parameter 0
                 o.step();
               }, {"parameter 1", "parameter 0", "share memory"}});
  r.push_back({"step: expanded parameter (internal overlap)", [] {
                 step_with<lo::Lion>({at::zeros({1}).expand({16})}, lo::LionOptions());
               }, {"parameter 0", "share memory"}});
  r.push_back({"override_state_format after the first step", [] {
                 std::vector<at::Tensor> p = {at::zeros({4})};
                 lo::AdamW o(p, lo::AdamWOptions());
                 p[0].mutable_grad() = at::ones({4});
                 o.step();
                 o.override_state_format(p[0], lowbit::StateFormat::FP32);
               }, {"override_state_format"}});
  r.push_back({"set_overflow_check_interval negative", [] {
                 lo::AdamW o({at::zeros({4})}, lo::AdamWOptions());
                 o.set_overflow_check_interval(-3);
               }, {"interval", "-3"}});
  r.push_back({"step_parameters: found_inf of two elements", [] {
                 lo::AdamW o({at::zeros({4}).requires_grad_()}, lo::AdamWOptions());
                 at::Tensor p = o.param_groups()[0].params()[0];
                 p.mutable_grad() = at::ones_like(p);
                 o.step_parameters({p}, at::zeros({2}));
               }, {"found_inf", "[2]"}});
  r.push_back({"step_parameters: found_inf double, no group skipping", [] {
                 lo::AdamW o({at::zeros({4}).requires_grad_()}, lo::AdamWOptions().skip_nonfinite(false));
                 at::Tensor p = o.param_groups()[0].params()[0];
                 p.mutable_grad() = at::ones_like(p);
                 o.step_parameters({p}, at::zeros({1}, at::kDouble));
               }, {"found_inf", "Double"}});
  r.push_back({"HostOffload: host_threads -1", [] {
                 lo::AdamW o({at::zeros({4}).requires_grad_()}, lo::AdamWOptions());
                 lo::HostOffload off(o, lo::HostOffloadOptions().host_threads(-1));
               }, {"host_threads", "-1"}});
  r.push_back({"HostOffload: host_threads 2^40", [] {
                 lo::AdamW o({at::zeros({4}).requires_grad_()}, lo::AdamWOptions());
                 lo::HostOffload off(o, lo::HostOffloadOptions().host_threads(int64_t(1) << 40));
               }, {"host_threads", "1099511627776"}});
  // ---- param groups: each group's own options, options edited later, one tensor in two groups
  r.push_back({"a group's own betas (0.9, 1.0)", [] {
                 std::vector<torch::optim::OptimizerParamGroup> g;
                 g.emplace_back(std::vector<at::Tensor>{at::zeros({4})});
                 g.emplace_back(std::vector<at::Tensor>{at::zeros({4})},
                                std::make_unique<lo::AdamWOptions>(lo::AdamWOptions().betas({0.9, 1.0})));
                 lo::AdamW o(std::move(g), lo::AdamWOptions());
               }, {"param group 1", "beta2", "1"}});
  r.push_back({"options edited after construction, then step", [] {
                 std::vector<at::Tensor> p = {at::zeros({4})};
                 lo::Adam o(p, lo::AdamOptions());
                 static_cast<lo::AdamOptions&>(o.param_groups()[0].options()).eps(-1e-8);
                 p[0].mutable_grad() = at::ones({4});
                 o.step();
               }, {"param group 0", "eps", "-1e-08"}});
  r.push_back({"a group's own initial_accumulator_value NaN", [] {
                 std::vector<torch::optim::OptimizerParamGroup> g;
                 g.emplace_back(std::vector<at::Tensor>{at::zeros({4})},
                                std::make_unique<lo::AdagradOptions>(lo::AdagradOptions().initial_accumulator_value(kNaN)));
                 lo::Adagrad o(std::move(g), lo::AdagradOptions());
               }, {"param group 0", "initial_accumulator_value", "nan"}});
  r.push_back({"SGD nesterov without momentum", [] { lo::SGD o({at::zeros({4})}, lo::SGDOptions(0.1).nesterov(true)); },
               {"nesterov", "momentum 0"}});
  r.push_back({"one tensor in two groups", [] {
                 const at::Tensor t = at::zeros({4});
                 std::vector<torch::optim::OptimizerParamGroup> g;
                 g.emplace_back(std::vector<at::Tensor>{t});
                 g.emplace_back(std::vector<at::Tensor>{at::zeros({3}), t});
                 lo::AdamW o(std::move(g), lo::AdamWOptions());
               }, {"parameter 1 of group 1", "parameter 0 of group 0", "one group"}});
  r.push_back({"add_param_group with a tensor already stepped, then step", [] {
                 std::vector<at::Tensor> p = {at::zeros({4})};
                 lo::AdamW o(p, lo::AdamWOptions());
                 o.add_param_group(torch::optim::OptimizerParamGroup(std::vector<at::Tensor>{p[0]}));
                 p[0].mutable_grad() = at::ones({4});
                 o.step();
               }, {"parameter 0 of group 1", "one group"}});
  r.push_back({"state_format out of range", [] {
                 lo::AdamW o({at::zeros({4})}, lo::AdamWOptions().state_format(static_cast<lowbit::StateFormat>(9)));
               }, {"state_format", "9"}});
  r.push_back({"master_weight_bits 16", [] { lo::AdamW o({at::zeros({4})}, lo::AdamWOptions().master_weight_bits(16)); },
               {"master_weight_bits", "16"}});
  r.push_back({"override_state_format of a tensor that is not a parameter", [] {
                 lo::AdamW o({at::zeros({4})}, lo::AdamWOptions());
                 o.override_state_format(at::zeros({4}), lowbit::StateFormat::FP32);
               }, {"override_state_format", "not a parameter"}});
  r.push_back({"override_state_format out of range", [] {
                 std::vector<at::Tensor> p = {at::zeros({4})};
                 lo::AdamW o(p, lo::AdamWOptions());
                 o.override_state_format(p[0], static_cast<lowbit::StateFormat>(-2));
               }, {"override_state_format", "-2"}});
  r.push_back({"export_state_fp32 of a tensor that is not a parameter", [] {
                 lo::AdamW o({at::zeros({4})}, lo::AdamWOptions());
                 o.export_state_fp32(at::zeros({4}));
               }, {"export_state_fp32", "not a parameter"}});
  r.push_back({"load_master_fp32 with NaN", [] {
                 std::vector<at::Tensor> p = {at::zeros({4}, at::kBFloat16)};
                 lo::AdamW o(p, lo::AdamWOptions().master_weight_bits(32));
                 o.load_master_fp32(p[0], at::full({4}, kNaN));
               }, {"load_master_fp32", "NaN"}});
  r.push_back({"clipping set after a GradientRelease was made", [] {
                 std::vector<at::Tensor> p = {at::ones({4}).requires_grad_(true)};
                 lo::AdamW o(p, lo::AdamWOptions());
                 lo::GradientRelease release(o);
                 static_cast<lo::AdamWOptions&>(o.param_groups()[0].options()).max_grad_norm(1.0);
                 (p[0] * 2).sum().backward();
               }, {"GradientRelease", "max_grad_norm"}});
  checkpoint_rows(r);
  return r;
}

// ---- load_checkpoint: damaged files are refused before libtorch parses them (optim/checkpoint_zip.h),
// naming the file and the record or field.
// Removes a flat folder of files. Not std::filesystem::remove_all: the torch 2.11 wheel's libtorch.so
// exports its own (older) copy of it, which our binaries bind to and which calls a null pointer
// under AddressSanitizer.
void remove_dir(const std::string& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& f : std::filesystem::directory_iterator(dir)) files.push_back(f.path());
  for (const auto& f : files) std::filesystem::remove(f);
  std::filesystem::remove(dir);
}

std::string rows_dir() {
  return (std::filesystem::temp_directory_path() / ("lowbit_entry_rows_" + std::to_string(getpid()))).string();
}

void checkpoint_rows(std::vector<Row>& r) {
  const std::string dir = rows_dir();
  std::filesystem::create_directories(dir);
  const std::string good = dir + "/good.pt";
  {
    std::vector<at::Tensor> p = {at::randn({5000})};
    lo::AdamW o(p, lo::AdamWOptions().state_format(lowbit::StateFormat::Q8));
    p[0].mutable_grad() = at::ones({5000});
    o.step();
    torch::save(o, good);
  }
  const std::string bytes = lowbit_test::read_file(good);
  const auto spans = lowbit_test::record_spans(good);
  // A copy of the checkpoint with `edit` applied, as a file of its own.
  const auto damaged = [&](const std::string& name, const std::function<void(std::string&)>& edit) {
    std::string b = bytes;
    edit(b);
    lowbit_test::write_file(dir + "/" + name, b);
    return dir + "/" + name;
  };
  const auto flip_in = [&](const std::string& record) {
    return [s = spans.at(record)](std::string& b) { b[s.first + s.second / 2] ^= 0x04; };
  };
  const auto load = [](const std::string& path) {
    return [path] {
      lo::AdamW o({at::zeros({5000})}, lo::AdamWOptions().state_format(lowbit::StateFormat::Q8));
      lo::load_checkpoint(o, path);
    };
  };
  std::string tensor_record;
  for (const auto& [name, s] : spans)
    if (name.rfind("data/", 0) == 0 && s.second > 1000) tensor_record = name;
  const std::string missing = dir + "/missing.pt";
  r.push_back({"load_checkpoint: missing file", load(missing), {missing, "cannot read"}});
  const std::string empty = damaged("empty.pt", [](std::string& b) { b.clear(); });
  r.push_back({"load_checkpoint: empty file", load(empty), {empty, "0 bytes"}});
  const std::string cut = damaged("cut.pt", [](std::string& b) { b.resize(b.size() - 30); });
  r.push_back({"load_checkpoint: cut inside the end record", load(cut), {cut, "no zip end record"}});
  r.push_back({"load_checkpoint: flipped bit in the deflated code record",
               load(damaged("code.pt", flip_in("code/__torch__.py"))), {"code/__torch__.py", "CRC-32"}});
  r.push_back({"load_checkpoint: flipped bit in data.pkl", load(damaged("pickle.pt", flip_in("data.pkl"))),
               {"data.pkl", "CRC-32"}});
  r.push_back({"load_checkpoint: flipped bit in a tensor's bytes", load(damaged("tensor.pt", flip_in(tensor_record))),
               {tensor_record, "CRC-32"}});
  r.push_back({"load_checkpoint: a record's stored size past the central directory",
               load(damaged("size.pt",
                            [](std::string& b) {
                              const size_t d = b.find(std::string("PK\x01\x02", 4));
                              const uint32_t v = 0x7FFFFFFF;
                              std::memcpy(&b[d + 20], &v, 4);  // compressed size
                              std::memcpy(&b[d + 24], &v, 4);  // uncompressed size
                            })),
               {"2147483647 bytes", "past the start of the central directory"}});
  r.push_back({"load_checkpoint: a record marked as a directory",
               load(damaged("directory.pt",
                            [](std::string& b) {
                              const size_t d = b.find(std::string("PK\x01\x02", 4));
                              b[d + 38] ^= 0x10;  // external attributes: MS-DOS directory
                            })),
               {"marked as a directory"}});
  r.push_back({"load_checkpoint: a Q8 checkpoint into a Q4 optimizer",
               [good] {
                 lo::AdamW o({at::zeros({5000})}, lo::AdamWOptions().state_format(lowbit::StateFormat::Q4));
                 lo::load_checkpoint(o, good);
               },
               {"parameter 0 of group 0", "state in Q8 but this optimizer keeps it in Q4", "convert_state_format(true)"}});
  r.push_back({"load_checkpoint: the central directory's offset moved",
               load(damaged("offset.pt",
                            [](std::string& b) {
                              const size_t e = b.rfind(std::string("PK\x05\x06", 4));
                              b[e + 16] ^= 0x01;
                            })),
               {"end record", "disagree"}});
}

}  // namespace

TEST(EntryPoints, EveryRowRaisesAnErrorNamingTheArgument) {
  int n = 0;
  for (const Row& row : rows()) {
    ++n;
    SCOPED_TRACE(row.name);
    if (std::getenv("LOWBIT_TEST_VERBOSE")) std::fprintf(stderr, "row: %s\n", row.name.c_str());
    try {
      row.call();
      ADD_FAILURE() << row.name << ": no error";
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      for (const auto& w : row.want)
        EXPECT_NE(msg.find(w), std::string::npos) << row.name << ": the message does not name '" << w << "': " << msg;
    } catch (const std::exception& e) {
      ADD_FAILURE() << row.name << ": not a c10::Error: " << e.what();
    }
  }
  remove_dir(rows_dir());
  std::printf("%d rows\n", n);
}

// ---------------------------------------------------------------------------------------------
// The command-line tools: bad arguments end with a nonzero status and a message naming the
// argument and its value (`lowbit`; lowbit_fuzz_checkpoint, whose options are numbers).
// ---------------------------------------------------------------------------------------------

namespace {

struct CliRow {
  std::string name;
  std::string command;            // run by the shell, stderr into the output
  int status;                     // the exit status expected
  std::vector<std::string> want;  // substrings of the output
};

std::pair<int, std::string> run_command(const std::string& command) {
  std::string out;
  FILE* f = popen((command + " 2>&1").c_str(), "r");
  if (!f) return {-1, "popen failed"};
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  const int status = pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

std::vector<CliRow> cli_rows(const std::string& dir) {
  const std::string cli = LOWBIT_CLI_PATH, fuzz = LOWBIT_FUZZ_PATH;
  const std::string missing = dir + "/no_such_checkpoint.pt", empty = dir + "/empty.pt", text = dir + "/text.pt",
                    tensor = dir + "/tensor.pt";
  std::vector<CliRow> r = {
      {"lowbit: no command", cli, 2, {"missing command"}},
      {"lowbit: unknown command", cli + " frobnicate", 2, {"unknown command", "'frobnicate'"}},
      {"lowbit: info with an argument", cli + " info extra", 2, {"info", "unexpected argument 'extra'"}},
      {"lowbit: codebook without FORMAT", cli + " codebook", 2, {"codebook", "missing FORMAT"}},
      {"lowbit: codebook of an unknown format", cli + " codebook Dyn9", 2, {"FORMAT", "'Dyn9'", "unknown"}},
      {"lowbit: codebook of a state format", cli + " codebook Q8", 2, {"FORMAT", "'Q8'"}},
      {"lowbit: codebook with two formats", cli + " codebook Dyn8Signed FP8E4M3", 2,
       {"codebook", "unexpected argument 'FP8E4M3'"}},
      {"lowbit: inspect without FILE", cli + " inspect", 2, {"inspect", "missing FILE"}},
      {"lowbit: inspect an empty FILE name", cli + " inspect ''", 2, {"FILE is empty"}},
      {"lowbit: inspect a missing file", cli + " inspect " + missing, 2, {"FILE", missing, "does not exist"}},
      {"lowbit: inspect a directory", cli + " inspect " + dir, 2, {"FILE", dir, "is a directory"}},
      {"lowbit: inspect an empty file", cli + " inspect " + empty, 1, {empty}},
      {"lowbit: inspect a text file", cli + " inspect " + text, 1, {text}},
      {"lowbit: inspect a tensor, not a checkpoint", cli + " inspect " + tensor, 1,
       {tensor, "not a lowbit optimizer checkpoint"}},
      {"fuzz: --cases not a number", fuzz + " --cases abc", 2, {"--cases", "'abc'"}},
      {"fuzz: --cases negative", fuzz + " --cases -5", 2, {"--cases", "'-5'"}},
      {"fuzz: --cases with trailing characters", fuzz + " --cases 10x", 2, {"--cases", "'10x'"}},
      {"fuzz: --cases beyond 2^40", fuzz + " --cases 2000000000000", 2, {"--cases", "'2000000000000'"}},
      {"fuzz: --seed beyond 64 bits", fuzz + " --seed 18446744073709551616", 2, {"--seed", "'18446744073709551616'"}},
      {"fuzz: --case empty", fuzz + " --case ''", 2, {"--case", "''"}},
      {"fuzz: --from a fraction", fuzz + " --from 1.5", 2, {"--from", "'1.5'"}},
      {"fuzz: --kind unknown", fuzz + " --kind bitflip", 2, {"--kind", "'bitflip'"}},
      {"fuzz: unknown option", fuzz + " --cases 1 --frobnicate 1", 2, {"unknown option", "'--frobnicate'"}},
      {"fuzz: option without its value", fuzz + " --seed", 2, {"--seed", "needs a value"}},
  };
  return r;
}

}  // namespace

TEST(EntryPoints, CommandLineToolsRejectBadArgumentsNamingThem) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("lowbit_cli_rows_" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  { std::ofstream(dir + "/empty.pt"); }
  { std::ofstream(dir + "/text.pt") << "not a zip archive\n"; }
  torch::save(at::ones({3}), dir + "/tensor.pt");
  int n = 0;
  for (const CliRow& row : cli_rows(dir)) {
    ++n;
    SCOPED_TRACE(row.name);
    const auto [status, out] = run_command(row.command);
    EXPECT_EQ(status, row.status) << row.name << ": " << out;
    for (const auto& w : row.want)
      EXPECT_NE(out.find(w), std::string::npos) << row.name << ": the message does not name '" << w << "': " << out;
  }
  remove_dir(dir);
  std::printf("%d rows\n", n);
}
