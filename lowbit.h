// lowbit: everything public in one include.
#pragma once

#include <lowbit/tensors/build_info.h>
#include <lowbit/tensors/qtensor.h>
#include <lowbit/tensors/quant_format.h>
#include <lowbit/optim/gradient_release.h>
#include <lowbit/optim/optimizers.h>
#include <lowbit/qat/qat.h>
