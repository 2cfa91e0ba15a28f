// Autograd functions of fake quantization: forward and backward call lowbit's dispatcher ops, so
// every device's fused kernel is used and the ATen reference serves the others.
#include "fake_quant_autograd.h"

#include <ATen/core/dispatch/Dispatcher.h>

namespace lowbit {
namespace qat {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using T4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using T3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using T2 = std::tuple<at::Tensor, at::Tensor>;

c10::OperatorHandle find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

T4 call_dynamic(const at::Tensor& x, int64_t g, int64_t bits, bool is_signed, bool sym, double eps) {
  static auto op = find_op("lowbit::fake_quant_dynamic").typed<T4(const at::Tensor&, int64_t, int64_t, bool, bool, double)>();
  return op.call(x, g, bits, is_signed, sym, eps);
}

T2 call_static(const at::Tensor& x, const at::Tensor& s, const at::Tensor& z, int64_t g, int64_t bits, bool is_signed) {
  static auto op = find_op("lowbit::fake_quant_static")
                       .typed<T2(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, bool)>();
  return op.call(x, s, z, g, bits, is_signed);
}

at::Tensor call_backward(const at::Tensor& grad, const at::Tensor& mask) {
  static auto op = find_op("lowbit::fake_quant_backward").typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(grad, mask);
}

T3 call_lsq(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& s, const at::Tensor& z, int64_t g,
            int64_t bits, bool is_signed, double factor) {
  static auto op = find_op("lowbit::fake_quant_lsq_backward")
                       .typed<T3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                 int64_t, bool, double)>();
  return op.call(dy, x, s, z, g, bits, is_signed, factor);
}

// backward(create_graph=true) runs backward with grad mode on: that is a request for a second
// derivative, which the straight-through estimator does not have.
void refuse_double_backward() {
  TORCH_CHECK(!torch::GradMode::is_enabled(),
              "lowbit::qat: double backward through fake quantization is not supported (the straight-through "
              "estimator has no second derivative); call backward() without create_graph=true");
}

struct DynamicFn : torch::autograd::Function<DynamicFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t g, int64_t bits, bool is_signed,
                            bool sym, double eps) {
    auto [y, mask, s, z] = call_dynamic(x, g, bits, is_signed, sym, eps);
    ctx->save_for_backward({mask});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    refuse_double_backward();
    const at::Tensor mask = ctx->get_saved_variables()[0];
    return {call_backward(grads[0], mask), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct Float8Fn : torch::autograd::Function<Float8Fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t g, const std::string& format, double eps) {
    static auto op = find_op("lowbit::fake_quant_float8")
                         .typed<T3(const at::Tensor&, int64_t, std::string_view, double)>();
    auto [y, mask, s] = op.call(x, g, format, eps);
    ctx->save_for_backward({mask});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    refuse_double_backward();
    const at::Tensor mask = ctx->get_saved_variables()[0];
    return {call_backward(grads[0], mask), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct BlockFloatFn : torch::autograd::Function<BlockFloatFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::string& format, double eps) {
    static auto op = find_op("lowbit::fake_quant_block_float").typed<T3(const at::Tensor&, std::string_view, double)>();
    auto [y, mask, s] = op.call(x, format, eps);
    ctx->save_for_backward({mask});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    refuse_double_backward();
    const at::Tensor mask = ctx->get_saved_variables()[0];
    return {call_backward(grads[0], mask), at::Tensor(), at::Tensor()};
  }
};

struct StaticFn : torch::autograd::Function<StaticFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& s, const at::Tensor& z,
                            int64_t g, int64_t bits, bool is_signed) {
    auto [y, mask] = call_static(x, s, z, g, bits, is_signed);
    ctx->save_for_backward({mask});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    refuse_double_backward();
    const at::Tensor mask = ctx->get_saved_variables()[0];
    return {call_backward(grads[0], mask), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct LearnableFn : torch::autograd::Function<LearnableFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& s, const at::Tensor& z,
                            int64_t g, int64_t bits, bool is_signed, double factor) {
    auto [y, mask] = call_static(x, s.detach(), z.detach(), g, bits, is_signed);
    ctx->save_for_backward({x, s, z});
    ctx->saved_data["g"] = g;
    ctx->saved_data["bits"] = bits;
    ctx->saved_data["is_signed"] = is_signed;
    ctx->saved_data["factor"] = factor;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    refuse_double_backward();
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &s = saved[1], &z = saved[2];
    auto [dx, ds, dz] = call_lsq(grads[0], x, s.detach(), z.detach(), ctx->saved_data["g"].toInt(),
                                 ctx->saved_data["bits"].toInt(), ctx->saved_data["is_signed"].toBool(),
                                 ctx->saved_data["factor"].toDouble());
    return {dx, ds.view(s.sizes()), dz.view(z.sizes()), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor fake_quant_dynamic(const at::Tensor& x, int64_t group_size, int64_t bits, bool is_signed, bool symmetric,
                              double eps) {
  return DynamicFn::apply(x, group_size, bits, is_signed, symmetric, eps);
}

at::Tensor fake_quant_float8(const at::Tensor& x, int64_t group_size, const std::string& format, double eps) {
  return Float8Fn::apply(x, group_size, format, eps);
}

at::Tensor fake_quant_block_float(const at::Tensor& x, const std::string& format, double eps) {
  return BlockFloatFn::apply(x, format, eps);
}

at::Tensor fake_quant_static(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero_point,
                             int64_t group_size, int64_t bits, bool is_signed) {
  return StaticFn::apply(x, scale, zero_point, group_size, bits, is_signed);
}

at::Tensor fake_quant_learnable(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero_point,
                                int64_t group_size, int64_t bits, bool is_signed, double grad_factor) {
  return LearnableFn::apply(x, scale, zero_point, group_size, bits, is_signed, grad_factor);
}

}  // namespace qat
}  // namespace lowbit
