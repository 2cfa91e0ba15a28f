// Element ranges of a parameter's optimizer state: the tensors of elements [begin, begin + len) of a
// ParamState, in the order the step op takes them (per slot: the dense values, or codes then absmax).
// begin is a multiple of the state's block size, so the quantized pieces are whole blocks.
#pragma once

#include <vector>

#include <lowbit/optim/lowbit_optimizer.h>

namespace lowbit {
namespace distributed {

void append_state_range(const optim::ParamState& st, int64_t begin, int64_t len, std::vector<at::Tensor>& out);

}  // namespace distributed
}  // namespace lowbit
