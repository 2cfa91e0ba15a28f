// The keyed normal fill on the host (kernels/common/keyed_normal.h), over OpenMP threads.
#pragma once

#include "../common/keyed_normal.h"

namespace lowbit {
namespace kernels {

void keyed_normal_cpu(const KeyedNormalParams& p);

}  // namespace kernels
}  // namespace lowbit
