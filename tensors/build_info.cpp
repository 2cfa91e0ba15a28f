// Reports the configuration lowbit was built with (see tensors/build_info.h.in).
#include "build_info.h"

#include <omp.h>
#include <torch/version.h>

#include <sstream>

#include <lowbit/build_config.h>

namespace lowbit {

const char* version() { return LOWBIT_VERSION; }

std::string build_info() {
  std::ostringstream s;
  s << "lowbit " << LOWBIT_VERSION << "\n";
  s << "libtorch " << TORCH_VERSION << "\n";
  s << "backends:\n";
  s << "  cpu   yes (OpenMP, " << omp_get_max_threads() << " threads)\n";
  s << "  cuda  " << (LOWBIT_WITH_CUDA ? std::string("yes (archs ") + LOWBIT_CUDA_ARCHS + ")" : std::string("no"))
    << "\n";
  s << "  hip   ";
  if (!LOWBIT_WITH_HIP_KERNELS)
    s << "no\n";
  else if (LOWBIT_HIP_LINKED)
    s << "yes (archs " << LOWBIT_HIP_ARCHS << ")\n";
  else
    s << "checked, not linked (hipcc -fsyntax-only for " << LOWBIT_HIP_ARCHS << "; libtorch is not a ROCm build)\n";
  // distributed/: MpiCommunicator + ShardedOptimizer with MPI, NcclCommunicator with NCCL too,
  // ProcessGroupCommunicator over a c10d backend with a libtorch built with USE_DISTRIBUTED.
  s << "  mpi   " << (LOWBIT_WITH_MPI ? "yes (distributed/: MpiCommunicator, ShardedOptimizer)" : "no") << "\n";
  s << "  nccl  " << (LOWBIT_WITH_NCCL ? "yes (distributed/: NcclCommunicator)" : "no") << "\n";
#ifndef LOWBIT_WITH_C10D
#define LOWBIT_WITH_C10D 0
#endif
  s << "  c10d  " << (LOWBIT_WITH_C10D ? "yes (distributed/: ProcessGroupCommunicator)" : "no") << "\n";
  return s.str();
}

}  // namespace lowbit
