// Whether NCCL runs this job's all-gathers on the copy engines: what NcclOptions' copy-engine
// options come to when left unset. NCCL 2.28 (src/enqueue.cc) runs an all-gather between symmetric
// windows of a communicator with the zero-CTA policy on the copy engines when every rank is on one
// node, the driver is CUDA 12.5 or later, and the communicator has symmetric support: every pair of
// the node's GPUs reaches the other directly (NVLink, or PCIe peer-to-peer where NCCL allows it),
// with NCCL_WIN_ENABLE and cuMem on (src/init.cc). The host rules out what it can; NCCL answers for
// the rest. Every rank gets the same answer. Internal: not an installed header.
#pragma once

#include <functional>
#include <string>

#include "communicator.h"

namespace lowbit {
namespace distributed {

struct CopyEngineSupport {
  bool supported = false;
  std::string why_not;  // when not supported: the first reason, naming the rank it holds on
};

// Collective over `bootstrap` (the job's MPI communicator, CPU tensors). nccl_version and
// driver_version: this rank's libraries' (ncclGetVersion, cudaDriverGetVersion). nccl_agrees: NCCL's
// own check of symmetric support, a collective over the NCCL communicator; called on every rank or
// on none.
CopyEngineSupport copy_engine_support(Communicator& bootstrap, int nccl_version, int driver_version,
                                      const std::function<bool()>& nccl_agrees);

}  // namespace distributed
}  // namespace lowbit
