// The fragment family of the seeded checkpoint fuzzer: originals are the fragment files
// (distributed/sharded_checkpoint.h) of a trained unsharded optimizer, as one writer and cut into
// two and three writers' files (fragment_edit.h); each case damages one file of a set, or the set
// itself (a file missing, duplicated, extra, swapped, empty), loads it with load_fragments into a
// live optimizer and checks the outcome like the checkpoint family does.
#pragma once

#include <string>
#include <vector>

#include "../checkpoint_edit.h"
#include "fuzz_common.h"

namespace lowbit_fuzz {

// One set of writers' files: bytes, entries and zip record spans per writer.
struct FragmentSet {
  std::vector<std::string> files;
  std::vector<lowbit_test::Entries> entries;
  std::vector<Spans> spans;
};

struct FragmentOriginal {
  std::string prefix;               // the one-writer files on disk, which live optimizers load first
  std::vector<FragmentSet> sets;    // 1, 2 and 3 writers
  std::vector<at::Tensor> grads2;   // a step the live optimizer takes before the damaged load
};

// `opt`'s fragments written under `dir` (a folder of this original's own).
FragmentOriginal make_fragment_original(const lo::LowbitOptimizer& opt, const std::vector<at::Tensor>& params,
                                        const std::string& dir);

extern const char* const kFragmentKinds[];
extern const int kNumFragmentKinds;

// A damaged set: file name suffix ("rank-0-of-2", or names no writer gives) -> bytes. `tmp` is a
// file the mutation may write through; `note` says what an entry edit changed.
using FileSet = std::map<std::string, std::string>;
FileSet mutate_fragments(const FragmentOriginal& o, int kind, Rng& r, const std::string& tmp, std::string* note);

// load_fragments(prefix) into a live optimizer holding other state than the original's (it loaded
// the original, then stepped once more): refused with that state and the parameters bit-identical,
// or loaded and then stepping exactly like the original; anything else is Bad (counted, with `why`).
Outcome try_load_fragments(const Make& make, StateFormat format, const std::vector<at::Tensor>& params,
                           const std::vector<at::Tensor>& grads, const FragmentOriginal& o, const std::string& prefix,
                           Counts& c, std::string* why);

}  // namespace lowbit_fuzz
