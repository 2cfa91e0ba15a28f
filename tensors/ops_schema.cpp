// Declares lowbit's dispatcher ops; each backend registers its kernels in its own ops_*.cpp file.
#include <torch/library.h>

#include <string>

#include "optim_step_boxed.h"

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
  // A low-bit collective's rows on and off the wire (tensors/wire_ops.h).
  m.def("wire_pack_(Tensor input, Tensor(a!) packed, str format, int block_size=0) -> ()");
  m.def("wire_unpack_(Tensor packed, Tensor(a!) output, str format, int block_size=0) -> ()");
  // The optimizer step and its gradient pre-pass (tensors/optim_ops.h explains the arguments).
  m.def("grad_check(Tensor[] grads, int[] groups, int num_groups, bool want_sumsq) -> (Tensor found_inf, Tensor sumsq)");
  m.def("lamb_add_block_sums(Tensor block_sums, int[] first, int[] count) -> Tensor");
  const std::string args = lowbit::ops::step_arguments();
  m.def(("optim_step_" + args + " -> ()").c_str());
  m.def(("optim_step_reference_" + args + " -> ()").c_str());
  // optim_lamb_norms reads what optim_step_ writes: the same arguments without the (x!) marks.
  std::string reads = args;
  for (const char* mark : {"(a!)", "(b!)", "(c!)"}) reads.erase(reads.find(mark), 4);
  m.def(("optim_lamb_norms" + reads + " -> Tensor").c_str());
  m.def(("optim_lamb_norms_reference" + reads + " -> Tensor").c_str());
  // The step's named hyper-parameters, in the table's order (Python builds its keyword list from it).
  m.def("optim_hyper_parameters() -> str[]", [] { return lowbit::ops::hyper_parameter_names(); });
}
