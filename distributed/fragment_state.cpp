// append_state_range: views of a block-aligned element range of each state slot.
#include "fragment_state.h"

#include <lowbit/kernels/common/quant_format.h>

namespace lowbit {
namespace distributed {

void append_state_range(const optim::ParamState& st, int64_t begin, int64_t len, std::vector<at::Tensor>& out) {
  const int64_t bs = st.block_size;
  TORCH_CHECK(bs > 0 && begin % bs == 0, "append_state_range: begin ", begin, " is not a multiple of the block size ",
              bs);
  for (const optim::StateSlot& s : st.slots) {
    if (s.type.storage == kernels::SlotStorage::Quant) {
      const QuantFormat f = s.type.format;
      out.push_back(s.quantized.codes().narrow(0, code_bytes(f, begin), code_bytes(f, len)));
      out.push_back(s.quantized.absmax().narrow(0, begin / bs, (len + bs - 1) / bs));
    } else if (s.type.storage != kernels::SlotStorage::None) {
      out.push_back(s.dense.narrow(0, begin, len));
    }
  }
}

}  // namespace distributed
}  // namespace lowbit
