// The argument checks every Communicator backend shares.
#include "communicator.h"

namespace lowbit {
namespace distributed {

void check_collective_tensor(const char* who, const char* collective, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), who, ": ", collective, ": ", arg, " is an undefined tensor");
  TORCH_CHECK(t.layout() == at::kStrided && t.is_contiguous(), who, ": ", collective, ": ", arg,
              " must be a dense contiguous tensor (shape ", t.sizes(), ", strides ", t.strides(), ")");
}

void check_same_kind(const char* who, const char* collective, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), who, ": ", collective, ": input has dtype ", a.scalar_type(),
              " but output has dtype ", b.scalar_type());
  TORCH_CHECK(a.device() == b.device(), who, ": ", collective, ": input is on ", a.device(), " but output is on ",
              b.device());
}

bool is_chunk_of(const at::Tensor& input, const at::Tensor& output, int rank) {
  if (!input.is_alias_of(output)) return false;
  const int64_t n = input.numel();
  return input.storage_offset() == output.storage_offset() + static_cast<int64_t>(rank) * n;
}

}  // namespace distributed
}  // namespace lowbit
