// Recording device work once and replaying it with one launch: what lets an optimizer step over
// thousands of tensors cost the host one launch instead of a pass over every tensor's metadata.
// On CUDA devices a recording is a CUDA graph; elsewhere (the CPU, ROCm builds for now) nothing
// can be recorded and callers run their work as it comes.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>

namespace lowbit {
namespace ops {

// Work recorded by record(): the same kernels on the same addresses, with whatever values those
// addresses hold when it runs.
class Recording {
 public:
  virtual ~Recording() = default;
  // Enqueues the recorded work on the device's current stream.
  virtual void replay() = 0;
};

// Whether work on `device` can be recorded now: a CUDA device, in a build with CUDA graphs, whose
// current stream is not being captured already (by a user's own graph around the work).
bool can_record(const at::Device& device);

// Records what enqueue() puts on `device`'s current stream (captured on a side stream, into a
// private memory pool that holds what enqueue() allocates). Nothing runs: replay() runs it. The
// work must not synchronize with the host or allocate anything meant to outlive it. Throws what
// enqueue() throws, or the capture's error; the device is left as it was.
std::unique_ptr<Recording> record(const at::Device& device, const std::function<void()>& enqueue);

}  // namespace ops
}  // namespace lowbit
