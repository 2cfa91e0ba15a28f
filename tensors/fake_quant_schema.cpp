// Declares the fake-quant (QAT) dispatcher ops; tensors/fake_quant_ops.h documents them.
#include <torch/library.h>

#include <string>
#include <utility>

TORCH_LIBRARY_FRAGMENT(lowbit, m) {
  // {name, arguments -> returns}: each op is also declared as name + "_reference", the ATen-only
  // oracle under its own name, so tests can compare any backend against it.
  const std::pair<const char*, const char*> with_reference[] = {
      {"fake_quant_dynamic",
       "(Tensor input, int group_size, int bits, bool is_signed, bool symmetric, float eps) "
       "-> (Tensor output, Tensor mask, Tensor scale, Tensor zero_point)"},
      {"fake_quant_static",
       "(Tensor input, Tensor scale, Tensor zero_point, int group_size, int bits, bool is_signed) "
       "-> (Tensor output, Tensor mask)"},
      {"fake_quant_float8",
       "(Tensor input, int group_size, str format, float eps) -> (Tensor output, Tensor mask, Tensor scale)"},
      {"fake_quant_block_float", "(Tensor input, str format, float eps) -> (Tensor output, Tensor mask, Tensor scale)"},
      {"fake_quant_backward", "(Tensor grad, Tensor mask) -> Tensor"},
      {"fake_quant_lsq_backward",
       "(Tensor grad, Tensor input, Tensor scale, Tensor zero_point, int group_size, int bits, bool is_signed, "
       "float grad_factor) -> (Tensor grad_input, Tensor grad_scale, Tensor grad_zero_point)"},
  };
  for (const char* suffix : {"", "_reference"})
    for (const auto& [name, signature] : with_reference) m.def((std::string(name) + suffix + signature).c_str());
  m.def(
      "fake_quant_qparams(Tensor min, Tensor max, int bits, bool is_signed, bool symmetric, float eps) "
      "-> (Tensor scale, Tensor zero_point)");
  m.def(
      "quantize_codes(Tensor input, Tensor scale, Tensor zero_point, int group_size, int bits, bool is_signed) "
      "-> Tensor");
  m.def(
      "dequantize_codes(Tensor codes, Tensor scale, Tensor zero_point, int group_size, int bits, bool is_signed, "
      "ScalarType dtype) -> Tensor");
  m.def("pack_codes(Tensor codes, int bits) -> Tensor");
  m.def("unpack_codes(Tensor packed, int bits, int numel) -> Tensor");
}
