// The QAT study (--qat-steps N), run after training: how much int8 per-token activations + int4
// per-group weights (torchao's Int8DynActInt4WeightQATQuantizer config) cost the trained model as
// post-training quantization (PTQ), and how much of that N steps of QAT fine-tuning win back, beside
// the same N steps of fine-tuning without fake quantization (and that model's PTQ).
#pragma once

#include "data.h"
#include "flags.h"
#include "model.h"

namespace gpt {

struct QatStudy {
  double fp32 = 0, ptq = 0, qat = 0, fp32_tuned = 0, ptq_tuned = 0;
  // Of what PTQ lost against fp32, the part QAT won back: (ptq - qat) / (ptq - fp32); and the same
  // against the fine-tuned baseline, (ptq_tuned - qat) / (ptq_tuned - fp32_tuned).
  double recovered() const;
  double recovered_vs_tuned() const;
};

// Leaves the model as it was trained (fp32, fake quantization off). Prints one "qat study:" line
// and writes --out _qat.csv.
QatStudy run_qat_study(const Flags& f, const Corpus& c, GPT& model, double fp32_val, at::Device dev);

}  // namespace gpt
