// --probe-max-size: the largest GPT (by layers, at the given width) whose training steps complete
// on the device with the chosen optimizer and state format, found by building and stepping
// growing configs until the allocator runs out of memory.
#pragma once

#include "flags.h"

namespace gpt {

int run_probe(const Flags& f);

}  // namespace gpt
