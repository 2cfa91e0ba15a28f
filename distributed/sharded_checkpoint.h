// Reshardable checkpoints of sharded optimizer state. Each rank writes its fragments (parameter
// group and index, element offset, numel, the whole parameter's numel, state format, block size,
// slot storage, step counters) with the format version and the stochastic-rounding seed, to
// `prefix`.rank-R-of-N. Loading reads the files of all N writers whole (each file's zip CRC-32s
// before libtorch parses it, every entry's digest, every value's range, each state tensor's dtype
// and size against its slot, finite codes), checks that they cover every parameter exactly once
// and match the optimizer (shapes, formats, block sizes, slots), and only then takes the ranges it
// needs: N ranks' files load on M ranks and into one unsharded optimizer, and an unsharded
// optimizer's save_fragments loads on any number of ranks, bit-exact, weights included (version 3:
// each writer's pieces of the parameters beside their state). State saved in another layout
// than the optimizer gives a parameter (state format, block size, float8 second-moment format) is
// refused unless LoadOptions().convert_state_format(true) asks to convert it: the parameter's
// fragments joined in the file's layout, expanded to fp32 and requantized whole into the
// optimizer's, as load_checkpoint converts an unsharded checkpoint. A refused load changes
// nothing; errors name the file, the fragment and the field or entry with its value.
#pragma once

#include <string>

#include "../optim/lowbit_optimizer.h"

namespace lowbit {
namespace distributed {

// 2: a digest of every entry, and the file's zip CRC-32s checked before libtorch reads it; 3: the
// weights of every piece a writer holds (a fully sharded job's only copy of them). Files of
// versions 1 and 2 still load, without weights (the parameters then keep their values).
constexpr int64_t kFragmentFormatVersion = 3;

// The file rank `rank` of `world_size` writes for `prefix`.
std::string fragment_file(const std::string& prefix, int rank, int world_size);

// An unsharded optimizer's state and parameters as fragments (one writer: `prefix`.rank-0-of-1),
// and back from the files of any number of writers (options: as ShardedOptimizer::load's); the
// parameters take the saved weights where the files have them (version 3).
void save_fragments(const optim::LowbitOptimizer& optimizer, const std::string& prefix);
void load_fragments(optim::LowbitOptimizer& optimizer, const std::string& prefix,
                    const optim::LoadOptions& options = optim::LoadOptions());

}  // namespace distributed
}  // namespace lowbit
