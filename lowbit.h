// lowbit: everything public in one include.
#pragma once

#include "tensors/build_info.h"
#include "tensors/keyed_random.h"
#include "tensors/qtensor.h"
#include "tensors/quant_format.h"
#include "optim/gradient_release.h"
#include "optim/host_offload.h"
#include "optim/optimizers.h"
#include "qat/qat.h"
// distributed/: with MPI compiled in (lowbit_add_distributed in cmake/LowbitDistributed.cmake).
#include <lowbit/build_config.h>
#if LOWBIT_WITH_MPI
#include "distributed/distributed.h"
#endif
