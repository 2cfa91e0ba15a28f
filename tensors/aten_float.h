// A tensor as the float type of the per-element rules (kernels/common/optim_rules.h): each operator
// is one ATen op over float32 tensors, one IEEE operation per element (ATen's float sqrt is not
// correctly rounded, so vsqrt goes through double, which is). With it the ATen reference runs the
// kernels' own rule code over whole tensors: the rules exist once, and the reference still checks
// everything the kernels do around them (traversal, decode, encode, blocks, rounding of stores).
// The rules themselves are checked against libtorch's optimizers and fp64 loops (tests/test_optim).
#pragma once

#include <ATen/ATen.h>

namespace lowbit {
namespace ops {

struct AtenFloat {
  at::Tensor t;  // undefined: the constant 0 (F{} in the rules)
};

inline AtenFloat operator+(const AtenFloat& a, const AtenFloat& b) { return {at::add(a.t, b.t)}; }
inline AtenFloat operator-(const AtenFloat& a, const AtenFloat& b) { return {at::sub(a.t, b.t)}; }
inline AtenFloat operator*(const AtenFloat& a, const AtenFloat& b) { return {at::mul(a.t, b.t)}; }
inline AtenFloat operator/(const AtenFloat& a, const AtenFloat& b) { return {at::div(a.t, b.t)}; }
inline AtenFloat operator-(const AtenFloat& a) { return {at::neg(a.t)}; }
// A float scalar is exact in the double ATen takes, and ATen rounds it back to float for a float
// tensor: the operation is the fp32 one the kernels do.
inline AtenFloat operator+(const AtenFloat& a, float s) { return {at::add(a.t, static_cast<double>(s))}; }
inline AtenFloat operator*(const AtenFloat& a, float s) { return {at::mul(a.t, static_cast<double>(s))}; }
inline AtenFloat operator*(float s, const AtenFloat& a) { return {at::mul(a.t, static_cast<double>(s))}; }

inline AtenFloat vsqrt(const AtenFloat& a) { return {at::sqrt(a.t.to(at::kDouble)).to(at::kFloat)}; }
// a > b ? a : b, as the kernels (NaN > x is false: b).
inline AtenFloat vmax(const AtenFloat& a, const AtenFloat& b) {
  if (!b.t.defined()) return {at::where(at::gt(a.t, 0.0), a.t, at::zeros_like(a.t))};
  return {at::where(at::gt(a.t, b.t), a.t, b.t)};
}
// 1, -1 or 0 (also for NaN), as the kernels.
inline AtenFloat sign_of(const AtenFloat& x) {
  const at::Tensor one = at::ones_like(x.t);
  return {at::where(at::gt(x.t, 0.0), one, at::where(at::lt(x.t, 0.0), -one, at::zeros_like(x.t)))};
}

}  // namespace ops
}  // namespace lowbit
