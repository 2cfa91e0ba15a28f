// keyed_normal_ (keyed_random.h): checks, then the fill of kernels/common/keyed_normal.h on the
// host or the GPU.
#include "keyed_random.h"

#include <ATen/ATen.h>

#include <c10/util/Exception.h>
#include <lowbit/build_config.h>

#include <cmath>
#include <limits>

#include "../kernels/cpu/keyed_normal_cpu.h"

#if LOWBIT_WITH_CUDA || LOWBIT_HIP_LINKED
#include "keyed_random_gpu.h"
#endif

namespace lowbit {

void keyed_normal_(const at::Tensor& out, double mean, double std, uint64_t key, int64_t first_element) {
  TORCH_CHECK(out.defined(), "keyed_normal_: out is an undefined tensor");
  kernels::KeyedOut type;
  switch (out.scalar_type()) {
    case at::kDouble: type = kernels::KeyedOut::F64; break;
    case at::kFloat: type = kernels::KeyedOut::F32; break;
    case at::kBFloat16: type = kernels::KeyedOut::BF16; break;
    case at::kHalf: type = kernels::KeyedOut::F16; break;
    default:
      TORCH_CHECK(false, "keyed_normal_: out has dtype ", out.scalar_type(),
                  "; supported: float64, float32, bfloat16, float16");
  }
  TORCH_CHECK(out.layout() == at::kStrided, "keyed_normal_: out is not a dense (strided) tensor");
  const bool gpu = out.is_cuda();
  TORCH_CHECK(out.is_cpu() || gpu, "keyed_normal_: out is on ", out.device(), "; supported: the CPU and GPUs");
#if !(LOWBIT_WITH_CUDA || LOWBIT_HIP_LINKED)
  TORCH_CHECK(!gpu, "keyed_normal_: out is on ", out.device(), " and this lowbit was built without GPU kernels");
#endif
  TORCH_CHECK(std::isfinite(mean), "keyed_normal_: mean is ", mean, "; it must be finite");
  TORCH_CHECK(std::isfinite(std) && std >= 0, "keyed_normal_: std is ", std, "; it must be finite and >= 0");
  const int64_t n = out.numel();
  TORCH_CHECK(first_element >= 0 && first_element <= std::numeric_limits<int64_t>::max() - n,
              "keyed_normal_: first_element is ", first_element, "; element indices run from 0 to 2^63 - 1 (out has ",
              n, " elements)");
  if (n == 0) return;
  // A non-contiguous out is filled through a contiguous copy, in out's row-major order.
  const at::Tensor dense = out.is_contiguous() ? out : at::empty(out.sizes(), out.options());
  kernels::KeyedNormalParams p;
  p.out = dense.data_ptr();
  p.type = type;
  p.n = n;
  p.first = static_cast<uint64_t>(first_element);
  p.key = key;
  p.mean = mean;
  p.std = std;
  if (gpu) {
#if LOWBIT_WITH_CUDA || LOWBIT_HIP_LINKED
    ops::keyed_normal_on_gpu(p, dense);
#endif
  } else {
    kernels::keyed_normal_cpu(p);
  }
  if (!dense.is_same(out)) {
    const at::NoGradGuard no_grad;  // a parameter's values are set, not computed
    out.copy_(dense);
  } else if (!out.is_inference()) {
    out.unsafeGetTensorImpl()->bump_version();  // written in place, as an in-place op would be
  }
}

uint64_t keyed_random_key(const std::string& name, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a, 64 bits
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  // splitmix64's finalizer over the name's hash and the seed: both halves of the key depend on both.
  uint64_t z = h ^ (seed * 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace lowbit
