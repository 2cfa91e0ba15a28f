// lowbit's distributed layer, everything public in one include (no MPI or NCCL header needed):
// communicators, init_from_env, ShardedOptimizer and its checkpoints, FullyShardedModule.
#pragma once

#include "communicator.h"
#include "flat_layout.h"
#include "fully_sharded_module.h"
#include "init.h"
#include "launch_env.h"
#include "sharded_checkpoint.h"
#include "sharded_optimizer.h"
