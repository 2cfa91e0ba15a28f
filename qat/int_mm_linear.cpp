// The int8 x int8 converted forward: see int_mm_linear.h.
#include "int_mm_linear.h"

#include "quantized_modules.h"

namespace lowbit {
namespace qat {

bool int_mm_cuda_shape_ok(int64_t m, int64_t k, int64_t n) {
  return m > 16 && k > 0 && k % 8 == 0 && n > 0 && n % 8 == 0;
}

at::Tensor int8_matmul(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == at::kChar && b.scalar_type() == at::kChar, "lowbit::qat::int8_matmul: a and b must "
              "be int8, got ", a.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "lowbit::qat::int8_matmul: shapes ", a.sizes(),
              " and ", b.sizes(), " do not multiply");
  TORCH_CHECK(!a.is_cuda() || int_mm_cuda_shape_ok(a.size(0), a.size(1), b.size(1)), "lowbit::qat::int8_matmul: "
              "at::_int_mm on CUDA needs m > 16 and k, n multiples of 8, got m ", a.size(0), ", k ", a.size(1), ", n ",
              b.size(1));
  if (a.is_cuda()) return at::_int_mm(a, b);
  // CPU: torch 2.11's _int_mm takes every shape but runs a slow loop (bench_fake_quant: 23x a float
  // matmul at k = 32). A float matmul of the integers is exact instead: |products| <= 2^14, so every
  // partial sum, in any order and with FMA, is an integer of magnitude <= k * 2^14, exact in float32
  // while that is <= 2^24 (k <= 1024) and in float64 up to k = 2^39.
  const at::ScalarType t = a.size(1) <= 1024 ? at::kFloat : at::kDouble;
  return at::mm(a.to(t), b.to(t)).to(at::kInt);
}

at::Tensor int8_matmul_reference(const at::Tensor& a, const at::Tensor& b) {
  return at::mm(a.to(at::kDouble), b.to(at::kDouble)).to(at::kInt);
}

std::string int_mm_config_problem(const std::optional<FakeQuantConfig>& act, const FakeQuantConfig& w) {
  if (!act) return "it needs int8 activations (the layer has no activation fake quantization)";
  if (act->format() != ValueFormat::Integer || act->bits() != 8 || !act->is_signed() ||
      act->granularity() != Granularity::PerToken || act->qparams() != QParamsMode::Dynamic)
    return "it needs int8 (signed) per-token dynamic activations, got " + act->describe();
  if (w.format() != ValueFormat::Integer || !w.is_signed() || !w.symmetric())
    return "it needs signed symmetric integer weights (zero point 0), got " + w.describe();
  if (w.granularity() == Granularity::PerChannel && !(w.axis() == 0 || w.axis() == -2))
    return "it needs weight groups along the rows, got " + w.describe();
  return "";
}

at::Tensor int_mm_linear(const at::Tensor& xq, const at::Tensor& xs, const at::Tensor& xz, const at::Tensor& w,
                         const at::Tensor& ws, int64_t group_size, const at::Tensor& bias) {
  const int64_t m = xq.size(0), k = xq.size(1), n = w.size(0);
  TORCH_CHECK(w.size(1) == k && k % group_size == 0, "lowbit::qat::int_mm_linear: weight ", w.sizes(), " and input ",
              xq.sizes(), " with group_size ", group_size, " do not fit");
  const int64_t G = k / group_size;
  const at::Tensor t = ws.view({n, G});
  const at::Tensor z = xz.to(at::kInt).view({m, 1});
  at::Tensor acc;
  for (int64_t g = 0; g < G; ++g) {
    const at::Tensor wg = w.narrow(1, g * group_size, group_size);
    // [k, n] as a view of the row-major [n, k] weight: column-major, the layout cuBLASLt wants.
    const at::Tensor p = int8_matmul(xq.narrow(1, g * group_size, group_size).contiguous(), wg.t());
    const at::Tensor a = p - z * wg.sum(1, /*keepdim=*/false, at::kInt).view({1, n});  // sum (q_x - z_x) q_w, exact
    const at::Tensor c = a.to(at::kFloat) * t.select(1, g).view({1, n});
    acc = g == 0 ? c : acc + c;
  }
  at::Tensor y = acc * xs.view({m, 1});
  if (bias.defined()) y = y + bias.view({1, n});
  return y;
}

int64_t set_int8_matmul(const std::shared_ptr<torch::nn::Module>& root, bool on) {
  TORCH_CHECK(root != nullptr, "lowbit::qat::set_int8_matmul: the module is null");
  int64_t count = 0;
  for (const auto& m : root->modules(/*include_self=*/true)) {
    auto q = std::dynamic_pointer_cast<QuantizedLinearImpl>(m);
    if (!q) continue;
    if (!on) {
      q->set_int8_matmul(false);
    } else if (int_mm_config_problem(q->options.activation(), q->options.weight()).empty()) {
      q->set_int8_matmul(true);
      ++count;
    }
  }
  return count;
}

int64_t set_int8_matmul(const torch::nn::Sequential& root, bool on) {
  return set_int8_matmul(std::static_pointer_cast<torch::nn::Module>(root.ptr()), on);
}

}  // namespace qat
}  // namespace lowbit
