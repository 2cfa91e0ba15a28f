// The text corpus: read from a file or a folder, split into training and held-out validation text
// (deterministically, by chunks), tokenized, and cut into batches that depend only on (seed, step).
#pragma once

#include <torch/torch.h>

#include <string>

#include "bpe.h"

namespace gpt {

constexpr const char* kDefaultData = "/usr/share/games/fortunes";  // Debian package `fortunes`

// A file's bytes, or a folder's regular files whose names hold no '.' (fortunes' data files, not
// their .dat indexes or .u8 links), concatenated in byte order of their names. `scripts/gpt
// prepare` writes the same bytes to one file.
std::string read_corpus(const std::string& path);

struct Corpus {
  Bpe bpe;
  at::Tensor train, val;  // int64 token ids, CPU
  uint64_t digest = 0;    // of the text used and the tokenizer's vocabulary: checked on --resume
  int64_t train_bytes = 0, val_bytes = 0;
};

// Text cut into chunks of about 4 KiB at line ends; every `val_every`-th chunk is validation.
// The BPE is trained on the training text only. limit > 0: the first `limit` bytes only.
Corpus load_corpus(const std::string& path, int64_t limit, int64_t vocab, int64_t val_every);

// Batch `step` of a run with `seed`: `batch` windows of context + 1 tokens at offsets drawn from
// (seed, step) alone, so a resumed run sees the batches the uninterrupted run would.
// Returns {inputs, targets}, int64 [batch, context], on `device`.
std::pair<at::Tensor, at::Tensor> train_batch(const Corpus& c, int64_t batch, int64_t context, uint64_t seed,
                                              int64_t step, at::Device device);

// The fixed validation windows: batch `i` of `n` batches spread evenly over the validation text.
std::pair<at::Tensor, at::Tensor> val_batch(const Corpus& c, int64_t batch, int64_t context, int64_t i, int64_t n,
                                            at::Device device);

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull);

}  // namespace gpt
