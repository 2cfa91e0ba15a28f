// require_ranks_agree: settings every rank must share, compared in one all-gather before the
// collectives that depend on them. A rank that differs would otherwise meet its peers in another
// collective (or none) and hang until a timeout; here every rank gets the same error naming the
// setting and the first rank that differs from rank 0. Internal: not an installed header.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "communicator.h"

namespace lowbit {
namespace distributed {

struct AgreedValue {
  std::string what;  // the setting's name, as the error gives it
  int64_t value = 0;
  std::function<std::string(int64_t)> show = {};  // how the error writes a value (default: the number)
};

// Every rank's `values` (the same count on each), rank after rank: one all_gather on `comm` in
// tensors on `device` (the communicator's).
std::vector<int64_t> gather_values(Communicator& comm, at::Device device, const std::vector<int64_t>& values);

// One all_gather on `comm` of int64 values, in tensors on `device` (the communicator's). Throws
// "<who>: the ranks disagree on <what>: rank 0 has <a>, rank r has <b>; <advice>" on every rank.
void require_ranks_agree(Communicator& comm, at::Device device, const std::vector<AgreedValue>& values,
                         const std::string& who, const std::string& advice);

}  // namespace distributed
}  // namespace lowbit
