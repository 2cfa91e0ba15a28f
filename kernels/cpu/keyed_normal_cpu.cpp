// keyed_normal_cpu (keyed_normal_cpu.h): each element on its own, so the threads' split changes nothing.
#include "keyed_normal_cpu.h"

#include <cmath>

namespace lowbit {
namespace kernels {

void keyed_normal_cpu(const KeyedNormalParams& p) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < p.n; ++i) keyed_normal_store(p, i);
}

}  // namespace kernels
}  // namespace lowbit
