// Host offload (DESIGN.md, host offload): the optimizer's state and master-weight corrections live in
// host memory and the CPU steps them, while the accelerator keeps only the weights, the gradients in
// flight and the activations.
#pragma once

#include <torch/arg.h>

#include <memory>

#include "lowbit_optimizer.h"

namespace lowbit {
namespace optim {

struct HostOffloadOptions {
  // Gradients on their way to the host at once: each holds its device gradient until the copy is
  // done and a pinned host buffer as large as the largest parameter's gradient until the CPU has
  // stepped it. More overlaps more of backward with the copies and the CPU steps; a hook that finds
  // none free waits for the oldest.
  TORCH_ARG(int64_t, staging_buffers) = 4;
  // Threads of the CPU steps; 0: as many as the thread that makes the offload runs with.
  TORCH_ARG(int64_t, host_threads) = 0;
  // No copy of the weights on the host: each weight goes there with its gradient, through the same
  // staging buffer (twice as large then), is stepped there and goes back. The host then holds only
  // the state and the master-weight corrections (2.06 instead of 4.06 bytes a bf16 parameter with
  // Q4 state and a 24-bit master), for 2 more bytes a bf16 parameter copied to the host each step.
  // The bits are the same either way: the step reads the same weights.
  TORCH_ARG(bool, stage_weights) = false;
};

// Where an offloaded step's time goes, summed since construction (or reset_stats()); seconds of wall
// time on the thread named.
struct HostOffloadStats {
  int64_t steps = 0;            // step() calls
  int64_t host_steps = 0;       // parameters stepped on the host
  double host_step_s = 0;       // the host thread in the optimizer's CPU steps
  double copy_wait_s = 0;       // the host thread waiting for a gradient's copy to the host
  double stall_s = 0;           // hooks (so backward) waiting for a free staging buffer
  double step_wait_s = 0;       // step() waiting for the host thread: the part not under backward
  int64_t bytes_to_host = 0;    // gradients (and weights pulled after a change on the device)
  int64_t bytes_to_device = 0;  // weights back
  int64_t host_threads = 0;     // the OpenMP threads the host thread's last CPU step had
};

// Moves `opt` to the host: every parameter of its groups is replaced there by a host copy (pinned
// when the parameter lives on an accelerator; same dtype and shape), so its state and corrections are
// created, stepped, saved and loaded on the host. The model keeps its parameters on the device.
// Then, as in gradient release, a post-accumulate-grad hook on each device parameter takes its
// gradient as soon as backward() has summed it: copied to a host buffer on a copy stream, the
// device gradient dropped once copied; a host thread steps that parameter alone on the CPU
// (LowbitOptimizer::step_parameters, the same rule math as the device step: the same bits) and copies
// the updated weights back on a second copy stream, all while backward goes on.
//
//   lowbit::optim::AdamW opt(model->parameters(), options);
//   lowbit::optim::HostOffload offload(opt);
//   for (...) { loss(model).backward(); offload.step(); }   // no opt.step(), no zero_grad()
//
// step() waits for the host's steps and makes the device's current stream wait for the weights'
// copies, so the next forward sees the updated weights. Each parameter steps at most once between
// two step() calls; a second gradient before step() is an error. The non-finite check applies per
// parameter (as gradient release does), made by the hook on the gradient's device and copied with
// it, so the host's step reads each gradient once; global-norm clipping (max_grad_norm > 0) needs every
// gradient at once and is refused. Gradient accumulation: set_accumulating(true) for every
// micro-batch but the last.
//
// The optimizer must hold no state yet (make the offload before the first step or load). Checkpoints:
// torch::save / torch::load of `opt` as usual (its state is stored by group and position, so an
// offloaded optimizer's checkpoint loads into one on the device and back, bit for bit). Weights the
// user changes on the device (a model loaded, an in-place edit) are noticed by their version counter
// and copied to the host before that parameter's next step; pull_weights() does it at once.
// `opt` keeps stepping the host copies after the offload is destroyed.
class GradHooks;

class HostOffload {
 public:
  explicit HostOffload(LowbitOptimizer& opt, HostOffloadOptions options = {});
  ~HostOffload();  // waits for the work in flight, removes the hooks
  HostOffload(const HostOffload&) = delete;
  HostOffload& operator=(const HostOffload&) = delete;

  // Ends a step: waits until every gradient this backward released is stepped on the host and its
  // weights are on their way back; the device's current stream waits for those copies. Rethrows
  // the first error a host step raised since the last call (those after it were not stepped).
  void step();

  void set_accumulating(bool on);
  bool accumulating() const;
  // Parameters stepped on the host so far (one per parameter per backward).
  int64_t released() const;

  // The host copy that `opt` steps in place of a device parameter (its state: opt.state_of(copy)).
  // With stage_weights it has the parameter's shape and dtype but lies in a staging buffer: its
  // elements are the weights only while the host steps them.
  const at::Tensor& host_param(const at::Tensor& device_param) const;
  // Copies every device parameter to its host copy now (after weights changed on the device); with
  // stage_weights there are none to copy (each step takes the device's weights).
  void pull_weights();
  // Pinned host bytes beside the optimizer's state: the weights' host copies and the staging buffers.
  int64_t host_bytes() const;
  // Most device gradients held at once since construction (released by the hooks, not yet copied).
  int64_t peak_gradients_in_flight() const;
  HostOffloadStats stats() const;
  void reset_stats();

  struct Shared;  // what the hooks and the host thread share

 private:
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<GradHooks> hooks_;
};

}  // namespace optim
}  // namespace lowbit
