// init_from_env(): the communicator of a job started by mpirun / srun (or with RANK / WORLD_SIZE set
// and MPI able to wire the ranks up): initializes MPI, checks that MPI and the launcher's variables
// agree, picks this rank's GPU by its local rank, and returns the communicator for `device_type`.
#pragma once

#include <memory>

#include <c10/core/DeviceType.h>

#include "communicator.h"
#include "launch_env.h"

namespace lowbit {
namespace distributed {

struct InitOptions {
  c10::DeviceType device_type = c10::DeviceType::CPU;  // CPU: MpiCommunicator; CUDA: NcclCommunicator
  double timeout_s = 300.0;      // per collective (failure_test and users shorten it)
  bool abort_on_failure = true;  // a failed collective aborts the whole job (see MpiOptions)
};

std::shared_ptr<Communicator> init_from_env(const InitOptions& options = {});

}  // namespace distributed
}  // namespace lowbit
