// The training run: warm-up + cosine schedule, the step, progress lines, validation, CSV + PNG,
// checkpoints (--save / --resume) that continue bit for bit.
#pragma once

#include <string>
#include <vector>

#include "data.h"
#include "flags.h"
#include "model.h"

namespace gpt {

struct RunResult {
  std::vector<double> losses;       // every step's training loss (only with record_losses)
  double first_val = 0, final_val = 0;
  uint64_t digest = 0;              // of every parameter's bytes at the end
  int64_t last_step = 0;
  double seconds = 0;
};

// Learning rate before step `s` (0-based): linear warm-up to --lr over --warmup steps, then cosine
// down to --lr * --min-lr-ratio at --steps.
double lr_at(const Flags& f, int64_t s);

RunResult train(const Flags& f, const Corpus& c, bool record_losses = false);

// Mean validation loss over --eval-batches fixed batches.
double evaluate(GPT& model, const Flags& f, const Corpus& c, at::Device dev);

// The model's dtype and device for these flags (also sets threads and TF32).
at::Device device_of(const Flags& f);

}  // namespace gpt
