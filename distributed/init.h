// init_from_env(): the communicator of a job started by mpirun / srun (or with RANK / WORLD_SIZE set
// and MPI able to wire the ranks up): initializes MPI, checks that MPI and the launcher's variables
// agree, picks this rank's GPU by its local rank, and returns the communicator for `device_type`.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <c10/core/DeviceType.h>

#include "communicator.h"
#include "launch_env.h"

namespace lowbit {
namespace distributed {

struct InitOptions {
  c10::DeviceType device_type = c10::DeviceType::CPU;  // CPU: MpiCommunicator; CUDA: NcclCommunicator
  double timeout_s = 300.0;      // per collective (failure_test and users shorten it)
  bool abort_on_failure = true;  // a failed collective aborts the whole job (see MpiOptions)
  // CUDA: NcclOptions' (unset: on where NCCL runs them on the copy engines); CPU: unset or false.
  std::optional<bool> copy_engine_gathers;
  std::optional<bool> copy_engine_reductions;
};

std::shared_ptr<Communicator> init_from_env(const InitOptions& options = {});

// Ends every rank of the job now (MPI_Abort), after printing `why` with this rank's number: for an
// error one rank meets and the others cannot know of (out of memory, a bad file). Returning from
// main instead would leave the others waiting in their next collective until its timeout, and this
// rank in its communicator's destructor, which waits for the collectives in flight. Without MPI (or
// after MPI_Finalize) the process alone exits with `status`.
[[noreturn]] void abort_job(int status, const std::string& why);

}  // namespace distributed
}  // namespace lowbit
