// Where this process sits in a job, read from its launcher's environment: Open MPI's mpirun
// (OMPI_COMM_WORLD_*), PMI launchers (MPICH / Intel MPI: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID), Slurm's
// srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) or torchrun-style RANK / WORLD_SIZE / LOCAL_RANK.
#pragma once

#include <map>
#include <string>

namespace lowbit {
namespace distributed {

struct LaunchEnv {
  int rank = 0, world_size = 1;
  int local_rank = 0;        // rank among the processes of this host (picks the GPU)
  std::string source = "none";  // the launcher the values came from ("none": a single process)
};

// From the variables in `env` (name -> value). The first complete set in the order above wins;
// every other set present must agree with it. Missing halves (a rank without a size), values that
// are not integers, rank outside [0, world_size) and disagreeing sets are errors naming the
// variables and their values.
LaunchEnv parse_launch_env(const std::map<std::string, std::string>& env);
// The same from this process's environment.
LaunchEnv launch_env();

}  // namespace distributed
}  // namespace lowbit
