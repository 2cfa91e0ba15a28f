// Declares lowbit's dispatcher ops; each backend registers its kernels in its own ops_*.cpp file.
#include <torch/library.h>

TORCH_LIBRARY(lowbit, m) {
  m.def("quantize_blockwise(Tensor input, str format, int block_size=0) -> (Tensor codes, Tensor absmax)");
  m.def(
      "dequantize_blockwise(Tensor codes, Tensor absmax, str format, int block_size, int[] shape, "
      "ScalarType? dtype=None) -> Tensor");
  // The ATen-only oracle under its own name, so tests can compare any backend against it.
  m.def("quantize_blockwise_reference(Tensor input, str format, int block_size=0) -> (Tensor codes, Tensor absmax)");
  m.def(
      "dequantize_blockwise_reference(Tensor codes, Tensor absmax, str format, int block_size, int[] shape, "
      "ScalarType? dtype=None) -> Tensor");
  // The optimizer step and its gradient pre-pass (tensors/optim_ops.h explains the arguments).
  m.def("grad_stats(Tensor[] grads, bool want_sumsq) -> (Tensor finite, Tensor sumsq)");
  m.def(
      "optim_step_(int rule, Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] states, int[] slot_kinds, "
      "int[] block_sizes, float[] hyper, int[] seeds, int[] flags, float grad_scale, bool scalar_loop=False) -> Tensor");
  m.def(
      "optim_step_reference_(int rule, Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] states, int[] slot_kinds, "
      "int[] block_sizes, float[] hyper, int[] seeds, int[] flags, float grad_scale, bool scalar_loop=False) -> Tensor");
}
