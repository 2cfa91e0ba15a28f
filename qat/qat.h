// lowbit QAT: fake-quant configs and modules, prepare / convert, quantized inference modules.
#pragma once

#include <lowbit/qat/fake_quant_autograd.h>
#include <lowbit/qat/fake_quant_config.h>
#include <lowbit/qat/fake_quantized_modules.h>
#include <lowbit/qat/fake_quantizer.h>
#include <lowbit/qat/int_mm_linear.h>
#include <lowbit/qat/prepare_convert.h>
#include <lowbit/qat/quantized_modules.h>
