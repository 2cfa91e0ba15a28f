// --sharded: data parallel under mpirun. The job's communicator (made once, from the launcher's
// environment), and the lowbit optimizer wrapped in a ShardedOptimizer with the --wire-* options.
#pragma once

#include <lowbit/lowbit.h>

#include <memory>
#include <string>

#include "flags.h"
#include "optimizer.h"

namespace gpt {

struct Job {
  int rank = 0, size = 1, local_rank = 0;
  // Averages `t` (on the job's device) over the ranks, in place: the training loss of the global batch.
  void average(at::Tensor& t) const;
};

// One process (rank 0 of 1) without --sharded; with it the job under mpirun (its device type from
// --device; CUDA ranks use cuda:<local rank>).
const Job& job(const Flags& f);

// An error on one rank of a job of several ends the whole job at once (lowbit::distributed::
// abort_job): returning would leave the other ranks in their collectives until the timeout. Nothing
// without --sharded, or before the job's communicator was made.
void end_job_on_error(const Flags& f, const std::string& what);

// --fully-sharded: `model`'s blocks become the units of a FullyShardedModule.
std::unique_ptr<TrainOptimizer> make_sharded(const Flags& f, std::unique_ptr<lowbit::optim::LowbitOptimizer> opt,
                                             std::string what, GPTImpl* model);

// --timeline STEP: that step's collectives on the GPU (NcclCommunicator's CUDA-event timeline)
// beside marks the training loop sets; rank 0 prints them after the step. Nothing without NCCL.
void timeline_start(const Flags& f);
void timeline_mark(const Flags& f, const std::string& label);
void timeline_print(const Flags& f);

}  // namespace gpt
