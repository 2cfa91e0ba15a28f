// CUDA (and ROCm, under the CUDA key) kernels of lowbit::optim_step_, optim_lamb_norms and
// grad_check (optim_ops.h): checks, device guard, current stream, scratch from the caching
// allocator, then the launchers of kernels/cuda/optim_step_cuda.h. Nothing is read back to the
// host: the step count, lr, the skip flag and the clipping norm are read by the kernels. A
// parameter that is not contiguous takes the reference path (which does read back).
#include <torch/library.h>

#include "../kernels/cuda/optim_step_cuda.h"

#include "blockwise_ops.h"
#include "gpu_runtime.h"
#include "optim_ops.h"
#include "optim_step_boxed.h"

namespace lowbit {
namespace ops {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check(const char* err, const char* op) { TORCH_CHECK(err == nullptr, op, ": ", err); }

// Runs fn(launch, indices) for each launch of the call, with its scratch allocated and, for LAMB
// with given norms, its parameters' rows of them.
template <typename Fn>
void each_launch(const StepCall& c, StepLaunches& l, Fn fn) {
  for (size_t d = 0; d < l.launches.size(); ++d) {
    kernels::StepLaunch& s = l.launches[d];
    const std::vector<size_t>& idx = l.index[d];
    at::Tensor norms;
    if (c.lamb_norms) {
      norms = idx.size() == c.params.size()
                  ? c.lamb_norms->contiguous()
                  : c.lamb_norms->index_select(
                        0, at::tensor(std::vector<int64_t>(idx.begin(), idx.end()), at::kLong).to(c.lamb_norms->device()));
      s.lamb_norms = norms.const_data_ptr<double>();
    }
    const at::Tensor scratch = at::empty({static_cast<int64_t>(kernels::gpu_step_scratch_bytes(s))},
                                         c.params[0].param->options().dtype(at::kByte));
    s.scratch = scratch.data_ptr();
    fn(s, idx);
  }
}

void step_cuda(const StepArgs& args) {
  const char* op = "lowbit::optim_step_";
  const StepCall c = check_step_call(args, op);
  if (c.params.empty()) return;
  const GpuGuard guard(c.params[0].param->device());
  StepLaunches l;
  make_launches(c, false, &l);
  each_launch(c, l, [&](const kernels::StepLaunch& s, const std::vector<size_t>&) {
    check(kernels::optim_step_gpu(s, current_gpu_stream()), op);
  });
  reference_steps(c, l.strided);  // the parameters that are not contiguous (reads back to the host)
}

at::Tensor lamb_norms_cuda(const StepArgs& args) {
  const char* op = "lowbit::optim_lamb_norms";
  StepCall c = check_step_call(args, op);
  const int64_t n = static_cast<int64_t>(c.params.size());
  if (n == 0) return at::zeros({0, 2}, at::kDouble);
  const GpuGuard guard(c.params[0].param->device());
  at::Tensor out = at::zeros({n, 2}, c.params[0].param->options().dtype(at::kDouble));
  StepLaunches l;
  make_launches(c, false, &l);
  TORCH_CHECK(l.strided.empty(), op, ": parameters must be contiguous on the GPU");
  c.lamb_norms.reset();
  each_launch(c, l, [&](const kernels::StepLaunch& s, const std::vector<size_t>& idx) {
    at::Tensor part = idx.size() == static_cast<size_t>(n) ? out : at::zeros({s.n, 2}, out.options());
    check(kernels::lamb_norms_gpu(s, part.data_ptr<double>(), current_gpu_stream()), op);
    if (!part.is_same(out))
      out.index_copy_(0, at::tensor(std::vector<int64_t>(idx.begin(), idx.end()), at::kLong).to(out.device()), part);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> grad_check_cuda(at::TensorList grads, at::IntArrayRef groups, int64_t num_groups,
                                                   bool want_sumsq) {
  const char* op = "lowbit::grad_check";
  check_grad_check_args(grads, groups, num_groups);
  TORCH_CHECK(!grads.empty(), op, ": no gradients");
  const GpuGuard guard(grads[0].device());
  std::vector<at::Tensor> keep;
  std::vector<kernels::GpuGrad> refs;
  for (size_t i = 0; i < grads.size(); ++i) {
    const auto t = grads[i].scalar_type();
    if (!grads[i].is_contiguous()) keep.push_back(grads[i].contiguous());
    const at::Tensor& c = grads[i].is_contiguous() ? grads[i] : keep.back();
    kernels::GpuGrad g;
    g.data = c.const_data_ptr();
    g.type = elem_type(t);
    g.numel = c.numel();
    g.group = groups[i];
    g.aligned = aligned16(g.data) ? 1 : 0;
    refs.push_back(g);
  }
  const auto opts = grads[0].options();
  at::Tensor found_inf = at::zeros({1}, opts.dtype(at::kFloat));
  at::Tensor sumsq = at::zeros({num_groups}, opts.dtype(at::kDouble));
  const int64_t n = static_cast<int64_t>(refs.size());
  const at::Tensor scratch =
      at::empty({static_cast<int64_t>(kernels::grad_check_scratch_bytes(refs.data(), n, want_sumsq))}, opts.dtype(at::kByte));
  check(kernels::grad_check_gpu(refs.data(), n, want_sumsq, found_inf.data_ptr<float>(), sumsq.data_ptr<double>(),
                                scratch.data_ptr(), current_gpu_stream()),
        op);
  return {found_inf, sumsq};
}

// The first and count arrays travel in the launches' parameters: nothing is uploaded or read back.
at::Tensor lamb_add_block_sums_cuda(const at::Tensor& block_sums, at::IntArrayRef first, at::IntArrayRef count) {
  check_lamb_add_block_sums_args(block_sums, first, count);
  const GpuGuard guard(block_sums.device());
  at::Tensor out = at::empty({static_cast<int64_t>(first.size()), 2}, block_sums.options());
  if (first.empty()) return out;
  check(kernels::lamb_add_block_sums_gpu(block_sums.const_data_ptr<double>(), first.data(), count.data(),
                                         static_cast<int64_t>(first.size()), out.data_ptr<double>(), current_gpu_stream()),
        "lowbit::lamb_add_block_sums");
  return out;
}

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CUDA, m) {
  using namespace lowbit::ops;
  m.impl("optim_step_", torch::CppFunction::makeFromBoxedFunction<&boxed_step<&step_cuda>>());
  m.impl("optim_lamb_norms", torch::CppFunction::makeFromBoxedFunction<&boxed_lamb_norms<&lamb_norms_cuda>>());
  m.impl("grad_check", &grad_check_cuda);
  m.impl("lamb_add_block_sums", &lamb_add_block_sums_cuda);
}
