// The bits of the step, pinned: a digest of every parameter and state byte after a few steps, for
// every rule x state format x parameter mode, against the table in tests/data/step_digests.txt.
// A change that means to keep the step's results (a refactor of the step pipeline, a faster
// kernel) leaves every line as it is; one that means to change them rewrites the table
// (LOWBIT_RECORD_STEP_DIGESTS=FILE writes it instead of checking) and says why in its commit.
// The CUDA test checks the same table: every device steps to the same bits.
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "test_util.h"

namespace lo = lowbit::optim;
using lowbit::StateFormat;

namespace {

// Inputs from a fixed generator (splitmix64), not torch's, so the table depends on lowbit alone.
struct Gen {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)
  // Sign, a scale over 8 decades and a few exact zeros: every code range of every format.
  float value() {
    const uint64_t r = next();
    if (r % 29 == 0) return 0.0f;
    const double mag = std::pow(10.0, -6.0 + 8.0 * uniform()) * (0.5 + uniform());
    return static_cast<float>((r & 1) ? -mag : mag);
  }
};

at::Tensor filled(Gen& g, at::IntArrayRef sizes, float scale) {
  at::Tensor t = at::empty(sizes, at::kFloat);
  float* p = t.data_ptr<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = g.value() * scale;
  return t;
}

uint64_t fnv1a(uint64_t h, const at::Tensor& t) {
  const at::Tensor c = t.detach().cpu().contiguous();
  const auto* b = static_cast<const uint8_t*>(c.data_ptr());
  for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ b[i]) * 0x100000001B3ull;
  return h;
}

struct Mode {
  const char* name;
  at::ScalarType dtype;
  bool stochastic_round;
  int64_t master_bits;
};
const Mode kModes[] = {{"fp32", at::kFloat, false, 0},
                       {"bf16", at::kBFloat16, false, 0},
                       {"bf16-sr", at::kBFloat16, true, 0},
                       {"bf16-m24", at::kBFloat16, false, 24},
                       {"bf16-m32", at::kBFloat16, false, 32}};

template <typename Options>
Options common(Options o, StateFormat f, const Mode& m) {
  return o.state_format(f).bf16_stochastic_round(m.stochastic_round).master_weight_bits(m.master_bits);
}

// One optimizer per rule, with the options that take its less common paths.
std::unique_ptr<lo::LowbitOptimizer> make(const std::string& rule, std::vector<at::Tensor> p, StateFormat f,
                                          const Mode& m) {
  if (rule == "Adam") return std::make_unique<lo::Adam>(p, common(lo::AdamOptions(1e-2).amsgrad(true).weight_decay(0.01), f, m));
  if (rule == "AdamW") return std::make_unique<lo::AdamW>(p, common(lo::AdamWOptions(1e-2).max_grad_norm(0.5), f, m));
  if (rule == "SGD")
    return std::make_unique<lo::SGD>(p, common(lo::SGDOptions(1e-2).momentum(0.9).nesterov(true).weight_decay(0.01), f, m));
  if (rule == "Lion") return std::make_unique<lo::Lion>(p, common(lo::LionOptions(1e-3).weight_decay(0.1), f, m));
  if (rule == "RMSprop")
    return std::make_unique<lo::RMSprop>(p, common(lo::RMSpropOptions(1e-2).momentum(0.5).centered(true), f, m));
  if (rule == "Adagrad") return std::make_unique<lo::Adagrad>(p, common(lo::AdagradOptions(1e-2).lr_decay(0.1), f, m));
  if (rule == "AdEMAMix")
    return std::make_unique<lo::AdEMAMix>(p, common(lo::AdEMAMixOptions(1e-2).t_alpha_beta3(2).weight_decay(0.01), f, m));
  return std::make_unique<lo::LAMB>(p, common(lo::LAMBOptions(1e-2).weight_decay(0.01), f, m));
}

const char* const kRules[] = {"Adam", "AdamW", "SGD", "Lion", "RMSprop", "Adagrad", "AdEMAMix", "LAMB"};

// Three steps of three parameters (quantized state, one that keeps fp32 state by min_quant_numel,
// and a 2-D one whose size is no multiple of any block) on `device`; the digest of the parameters
// and of every state byte (codes, block scales, dense slots, master corrections, step counts).
std::string digest(const std::string& rule, StateFormat f, const Mode& m, const at::Device& device) {
  Gen g{0x6C6F77626974ull};
  std::vector<at::Tensor> params;
  for (auto sizes : {std::vector<int64_t>{10000}, std::vector<int64_t>{1000}, std::vector<int64_t>{96, 131}})
    params.push_back(filled(g, sizes, 1.0f).to(m.dtype).to(device).requires_grad_(true));
  auto opt = make(rule, params, f, m);
  for (int step = 0; step < 3; ++step) {
    for (auto& p : params) p.mutable_grad() = filled(g, p.sizes(), 0.1f).to(m.dtype).to(device);
    opt->step();
  }
  uint64_t h = 0xCBF29CE484222325ull;
  for (const auto& p : params) {
    h = fnv1a(h, p);
    const lo::ParamState* st = opt->state_of(p);
    EXPECT_NE(st, nullptr);
    if (st == nullptr) continue;
    h = fnv1a(h, st->counters);
    for (const auto& slot : st->slots) {
      if (!slot.defined()) continue;
      if (slot.quantized.defined()) {
        h = fnv1a(h, slot.quantized.codes());
        h = fnv1a(h, slot.quantized.absmax());
      } else {
        h = fnv1a(h, slot.dense);
      }
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string key_of(const std::string& rule, StateFormat f, const Mode& m) {
  return rule + " " + lowbit::state_format_name(f) + " " + m.name;
}

std::map<std::string, std::string> recorded_table() {
  std::map<std::string, std::string> table;
  std::ifstream in(LOWBIT_STEP_DIGESTS);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t cut = line.rfind(' ');
    table[line.substr(0, cut)] = line.substr(cut + 1);
  }
  return table;
}

void check_or_record(const at::Device& device) {
  const char* record = std::getenv("LOWBIT_RECORD_STEP_DIGESTS");
  const auto table = recorded_table();
  std::ostringstream out;
  out << "# rule state-format parameter-mode digest (tests/test_step_digest.cpp)\n";
  int checked = 0;
  for (const char* rule : kRules) {
    for (StateFormat f : lowbit::kAllStateFormats) {
      for (const Mode& m : kModes) {
        const std::string key = key_of(rule, f, m), got = digest(rule, f, m, device);
        out << key << " " << got << "\n";
        if (record) continue;
        const auto it = table.find(key);
        ASSERT_NE(it, table.end()) << "no recorded digest for " << key << " in " << LOWBIT_STEP_DIGESTS;
        EXPECT_EQ(got, it->second) << key << " on " << device;
        ++checked;
      }
    }
  }
  if (record) {
    std::ofstream(record) << out.str();
    GTEST_SKIP() << "recorded the digests in " << record;
  }
  EXPECT_EQ(checked, static_cast<int>(table.size())) << "the table has lines this test no longer makes";
}

}  // namespace

TEST(StepDigest, EveryRuleFormatAndModeStepsToTheRecordedBits) { check_or_record(at::kCPU); }

TEST(StepDigest, CudaStepsToTheRecordedBits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_or_record(at::Device(at::kCUDA, 0));
}
