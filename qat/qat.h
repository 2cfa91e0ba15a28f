// lowbit QAT: fake-quant configs and modules, prepare / convert, quantized inference modules.
#pragma once

#include "fake_quant_autograd.h"
#include "fake_quant_config.h"
#include "fake_quantized_modules.h"
#include "fake_quantizer.h"
#include "int_mm_linear.h"
#include "prepare_convert.h"
#include "quantized_modules.h"
