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

void check_chunked_collective(const char* who, const char* collective, const at::Tensor& input,
                              const at::Tensor& output, int size, bool input_is_whole) {
  check_collective_tensor(who, collective, "input", input);
  check_collective_tensor(who, collective, "output", output);
  check_same_kind(who, collective, input, output);
  const at::Tensor& whole = input_is_whole ? input : output;
  const at::Tensor& part = input_is_whole ? output : input;
  const char* whole_name = input_is_whole ? "input" : "output";
  const char* part_name = input_is_whole ? "output" : "input";
  TORCH_CHECK(whole.numel() == part.numel() * size, who, ": ", collective, ": ", whole_name, " has ", whole.numel(),
              " elements; expected size() * ", part_name, ".numel() = ", size, " * ", part.numel());
}

void Communicator::all_gather_many(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) {
  TORCH_CHECK(inputs.size() == outputs.size(), backend(), ": all_gather_many: ", inputs.size(), " inputs but ",
              outputs.size(), " outputs");
  for (size_t k = 0; k < inputs.size(); ++k) {
    at::Tensor out = outputs[k];
    all_gather(inputs[k], out);
  }
}

void check_all_to_all(const char* who, const at::Tensor& input, const at::Tensor& output, int size) {
  const char* name = "all_to_all";
  check_collective_tensor(who, name, "input", input);
  check_collective_tensor(who, name, "output", output);
  check_same_kind(who, name, input, output);
  TORCH_CHECK(input.numel() == output.numel() && input.numel() % size == 0, who, ": ", name, ": input has ",
              input.numel(), " elements and output ", output.numel(), "; both need the same number, a multiple of size() = ",
              size);
  TORCH_CHECK(input.numel() == 0 || !input.storage().is_alias_of(output.storage()), who, ": ", name,
              ": input and output share memory; the exchange needs two buffers");
}

bool host_sums_natively(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kLong || t == at::kInt;
}

bool is_chunk_of(const at::Tensor& input, const at::Tensor& output, int rank) {
  if (!input.is_alias_of(output)) return false;
  const int64_t n = input.numel();
  return input.storage_offset() == output.storage_offset() + static_cast<int64_t>(rank) * n;
}

}  // namespace distributed
}  // namespace lowbit
