// gather_values and require_ranks_agree (rank_agreement.h).
#include "rank_agreement.h"

#include <algorithm>

namespace lowbit {
namespace distributed {

std::vector<int64_t> gather_values(Communicator& comm, at::Device device, const std::vector<int64_t>& values) {
  const int64_t n = static_cast<int64_t>(values.size());
  at::Tensor mine = at::empty({n}, at::kLong);
  std::copy(values.begin(), values.end(), mine.data_ptr<int64_t>());
  at::Tensor all = at::empty({comm.size() * n}, at::TensorOptions().dtype(at::kLong).device(device));
  comm.all_gather(mine.to(device), all);
  const at::Tensor host = all.cpu();
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

void require_ranks_agree(Communicator& comm, at::Device device, const std::vector<AgreedValue>& values,
                         const std::string& who, const std::string& advice) {
  const int64_t n = static_cast<int64_t>(values.size());
  if (n == 0) return;
  std::vector<int64_t> mine;
  for (const AgreedValue& v : values) mine.push_back(v.value);
  const std::vector<int64_t> gathered = gather_values(comm, device, mine);
  const int64_t* a = gathered.data();
  // Every rank holds every rank's values, so every rank finds the same first difference.
  for (int r = 1; r < comm.size(); ++r)
    for (int64_t i = 0; i < n; ++i) {
      const AgreedValue& v = values[static_cast<size_t>(i)];
      const auto show = [&](int64_t x) { return v.show ? v.show(x) : std::to_string(x); };
      TORCH_CHECK(a[r * n + i] == a[i], who, ": the ranks disagree on ", v.what, ": rank 0 has ", show(a[i]), ", rank ",
                  r, " has ", show(a[r * n + i]), "; ", advice);
    }
}

}  // namespace distributed
}  // namespace lowbit
