// CUDA (and ROCm: libtorch's HIP build uses the CUDA key) kernels of the fake-quant ops: checks,
// device guard, current stream, then the launchers of kernels/cuda.
#include <torch/library.h>

#include "../kernels/cuda/fake_quant_cuda.h"

#include "fake_quant_ops.h"
#include "gpu_runtime.h"

namespace lowbit {
namespace ops {
namespace {

// The backend of the op bodies (fake_quant_ops.h): each kernel launched on the current stream.
struct CudaFakeQuant {
  using Guard = GpuGuard;
  static void run(const kernels::FakeQuantParams& p, const char* op) {
    check_gpu_launch(kernels::fake_quant_gpu(p, current_gpu_stream()), op);
  }
  static void run(const kernels::Float8FakeQuantParams& p, const char* op) {
    check_gpu_launch(kernels::fake_quant_float8_gpu(p, current_gpu_stream()), op);
  }
  static void run(const kernels::BlockFloatParams& p, const char* op) {
    check_gpu_launch(kernels::fake_quant_block_float_gpu(p, current_gpu_stream()), op);
  }
  static void run(const kernels::FakeQuantBackwardParams& p, const char* op) {
    check_gpu_launch(kernels::fake_quant_backward_gpu(p, current_gpu_stream()), op);
  }
  static void run(const kernels::LsqBackwardParams& p, const char* op) {
    check_gpu_launch(kernels::fake_quant_lsq_backward_gpu(p, current_gpu_stream()), op);
  }
};

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CUDA, m) {
  using namespace lowbit::ops;
  m.impl("fake_quant_dynamic", &fake_quant_dynamic_op<CudaFakeQuant>);
  m.impl("fake_quant_static", &fake_quant_static_op<CudaFakeQuant>);
  m.impl("fake_quant_float8", &fake_quant_float8_op<CudaFakeQuant>);
  m.impl("fake_quant_block_float", &fake_quant_block_float_op<CudaFakeQuant>);
  m.impl("fake_quant_backward", &fake_quant_backward_op<CudaFakeQuant>);
  m.impl("fake_quant_lsq_backward", &fake_quant_lsq_backward_op<CudaFakeQuant>);
}
