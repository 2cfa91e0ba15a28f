// lowbit: everything public in one include.
#pragma once

#include <lowbit/tensors/build_info.h>
#include <lowbit/tensors/qtensor.h>
#include <lowbit/tensors/quant_format.h>
#include <lowbit/optim/gradient_release.h>
#include <lowbit/optim/optimizers.h>
#include <lowbit/qat/qat.h>
// distributed/: with MPI compiled in (lowbit_add_distributed in cmake/LowbitDistributed.cmake).
#include <lowbit/build_config.h>
#if LOWBIT_WITH_MPI
#include <lowbit/distributed/distributed.h>
#endif
