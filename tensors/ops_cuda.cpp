// CUDA (and ROCm: libtorch's HIP build uses the CUDA key) kernels of the blockwise ops: checks,
// device guard, current stream, then the launchers of kernels/cuda.
#include <torch/library.h>

#include "../kernels/cuda/quantize_cuda.h"

#include "blockwise_ops.h"
#include "gpu_runtime.h"
#include "wire_ops.h"

namespace lowbit {
namespace ops {
namespace {

// The backend of the op bodies (blockwise_ops.h, wire_ops.h): each kernel launched on the current
// stream (the wire ops' flagged blocks are carried without a wait).
struct CudaBlockwise {
  using Guard = GpuGuard;
  static void run(const kernels::QuantizeParams& p, const char* op) {
    check_gpu_launch(kernels::quantize_blockwise_gpu(p, current_gpu_stream()), op);
  }
  static void run(const kernels::DequantizeParams& p, const char* op) {
    check_gpu_launch(kernels::dequantize_blockwise_gpu(p, current_gpu_stream()), op);
  }
};

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CUDA, m) {
  using namespace lowbit::ops;
  m.impl("quantize_blockwise", &quantize_blockwise_op<CudaBlockwise>);
  m.impl("dequantize_blockwise", &dequantize_blockwise_op<CudaBlockwise>);
  m.impl("wire_pack_", &wire_pack_op<CudaBlockwise>);
  m.impl("wire_unpack_", &wire_unpack_op<CudaBlockwise>);
}
