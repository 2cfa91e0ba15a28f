// The machinery every lowbit optimizer shares: lazily created state (one StateSlot per slot of
// the rule, each FP32, BF16 or quantized), the step (checks, the gradient pre-pass, one fused op
// call per device and state layout), skipping of non-finite gradients, clipping, accounting.
// Checkpoints: optim/checkpoint.cpp. Concrete optimizers (optimizers.h) only map their options to
// a kernels::StepConfig.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../kernels/common/state_slots.h"
#include "../kernels/common/step_config.h"
#include "../tensors/qtensor.h"

#include "memory_report.h"
#include "options.h"
#include "state_format.h"

namespace lowbit {
namespace optim {

// One state tensor of one parameter, stored as its SlotType says: dense (FP32 / BF16) or quantized.
struct StateSlot {
  kernels::SlotType type;  // storage None: the rule does not use this slot here
  at::Tensor dense;        // F32 / BF16: numel values
  QTensor quantized;       // Quant: codes + absmax
  bool defined() const { return type.storage != kernels::SlotStorage::None; }
  int64_t nbytes() const;
  at::Tensor to_float() const;  // fp32 values, flat
};

struct ParamState {
  // int64 [2] on the parameter's device, written by the step op: steps taken, and blocks of
  // quantized state that overflowed to Inf/NaN. Read on the host only when asked (step()).
  at::Tensor counters;
  StateFormat format = StateFormat::FP32;  // resolved format (after min_quant_numel, overrides)
  int64_t block_size = 0;                  // quantization block (work block for dense state)
  std::vector<StateSlot> slots;            // by the rule's slot index (kernels::rule_slots)
  mutable int64_t overflow_reported = 0;   // counters[1] when last checked (an error is raised once)
  int64_t step() const;                    // steps taken (a device read for GPU parameters)
};

// How a checkpoint of lowbit's own format is taken (LowbitOptimizer::load, load_checkpoint).
//   convert_state_format  a parameter whose checkpointed state is not in the layout this optimizer
//                         gives it (state format after override_state_format and min_quant_numel,
//                         block size, fp8_second_moment) is refused by default, before anything
//                         changes. true converts it: the checkpoint's state is expanded to fp32 and
//                         quantized again in this optimizer's layout (lossy where that is coarser);
//                         step counts, master-weight corrections, lr, seed and skipped steps load
//                         as stored.
struct LoadOptions {
  TORCH_ARG(bool, convert_state_format) = false;
};

struct StepTesting;     // optim/step_testing.h: the tests' switches (reference path, scalar loop)
struct FragmentAccess;  // optim/fragment_access.h: what distributed/ needs to step a range of a parameter
class StepGraph;        // optim/step_graph.h: steps recorded once and replayed
struct StepInputs;
struct GroupStep;       // optim/step_calls.h: what every op call of a group's step shares
struct StateLayout;     // optim/state_layout.h
struct CheckpointParam; // optim/checkpoint_reader.h

class LowbitOptimizer : public torch::optim::Optimizer {
 public:
  using LossClosure = torch::optim::Optimizer::LossClosure;

  // Runs one step; a non-finite gradient anywhere skips it for every parameter and is counted.
  // On CPU parameters the step reads nothing back from a device; on GPUs it never synchronizes
  // with the host (the skip, clipping and step counts stay on the device).
  torch::Tensor step(LossClosure closure = nullptr) override;
  // One step of only these parameters (those with a gradient): what gradient release
  // (gradient_release.h) runs per parameter. Each parameter's result is the one step() gives it;
  // the non-finite check and clipping see only these parameters' gradients. `found_inf`, when
  // given, is that check done already (grad_check's flag of these gradients, on their device; host
  // offload computes it on the accelerator before the copy): where no group clips, the step reads
  // it instead of reading every gradient once more.
  void step_parameters(const std::vector<at::Tensor>& params, const at::Tensor& found_inf = at::Tensor());

  // Whether any group clips to a global norm (max_grad_norm > 0).
  bool clips_gradients() const;

  // Every group's options: the named hyper-parameters against their table (step_config.h), the
  // common options and the optimizer's own; and no tensor in two groups. The constructors run it,
  // and every step before it changes anything, so options a group brought or a caller edited later
  // are held to the same ranges. Errors name the optimizer, the group, the option and its value.
  void check_groups();

  // Bytes held by optimizer state (codes + absmax for quantized state; corrections included).
  int64_t state_bytes() const;
  // Weights, gradients (as they are now), state and corrections, in bytes and per parameter.
  MemoryReport memory_report() const;
  // Steps skipped because a gradient held NaN or Inf (a device read for GPU parameters).
  int64_t skipped_steps() const;

  // Throws if the quantized state of some parameter overflowed to Inf/NaN since the last check,
  // naming the parameter. CPU parameters are checked after every step; GPU ones here, by save()
  // (which then refuses once), and every `n` steps after set_overflow_check_interval(n) (0, the
  // default: never by itself, so that a step never waits for the device).
  void check_overflow();
  void set_overflow_check_interval(int64_t n);

  // Writes each group's current lr (what a scheduler set) to the device tensor the step reads.
  // step() does this itself; call it before replaying a CUDA graph that captured step().
  void refresh_lr();

  // Step graphs (on by default): once step() sees the same inputs twice in a row on a CUDA device
  // (the same parameters, gradient addresses, options and state), it records its device work as a
  // CUDA graph and replays that while they stay the same, so a step over thousands of small
  // tensors costs the host one look at each parameter and gradient and one launch. The results
  // are those of steps run as they come, bit for bit. Off: every step enqueues its kernels anew.
  // A step inside a user's own graph capture always runs as it comes (and is captured there).
  void set_step_graphs(bool on);
  // Steps run by a recorded graph (0 on the CPU and with step graphs off).
  int64_t step_graph_replays() const;

  ~LowbitOptimizer() override;

  // Keeps `param`'s state in `format` whatever its group says (e.g. FP32 for embeddings). Must be
  // set before the parameter's first step.
  void override_state_format(const at::Tensor& param, StateFormat format);

  // Puts `to` in place of the parameter `from` in its group, with `from`'s state format override.
  // `to` must have `from`'s shape and dtype and be no parameter yet; `from` must hold no state yet.
  // What HostOffload (host_offload.h) uses to step host copies of device parameters.
  void replace_parameter(const at::Tensor& from, const at::Tensor& to);

  // The state of a parameter (nullptr before its first step).
  const ParamState* state_of(const at::Tensor& param) const;
  // The parameter's state tensors expanded to fp32, shaped like it, by slot (undefined for unused
  // slots); the moments only (a master-weight correction is read through export_master_fp32).
  std::vector<at::Tensor> export_state_fp32(const at::Tensor& param) const;

  // Master weights (option master_weight_bits): the parameter's fp32 master values, shaped like
  // it (its own values in fp32 when it carries no correction).
  at::Tensor export_master_fp32(const at::Tensor& param) const;
  // Sets a bf16 parameter with a master-weight correction to fp32 (or any float) `values`: the
  // parameter gets their nearest bf16, the correction the rest (exact in the 32-bit mode). Creates
  // the parameter's state if it has none yet. E.g. to start a bf16 model from fp32 weights.
  void load_master_fp32(const at::Tensor& param, const at::Tensor& values);

  void save(torch::serialize::OutputArchive& archive) const override;
  // torch::load's entry: load(archive, LoadOptions()).
  void load(torch::serialize::InputArchive& archive) override;
  void load(torch::serialize::InputArchive& archive, const LoadOptions& options);

  static constexpr int64_t kCheckpointVersion = 2;  // 2: digests (optim/checkpoint_reader.h)

 protected:
  LowbitOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                  std::unique_ptr<torch::optim::OptimizerOptions> defaults);

  // The rule and its named hyper-parameters for a group's options.
  virtual kernels::StepConfig config(const torch::optim::OptimizerOptions& options) const = 0;
  virtual CommonOptions common(const torch::optim::OptimizerOptions& options) const = 0;
  // Initial value of a state slot (Adagrad's initial_accumulator_value); 0 by default.
  virtual double initial_state_value(const torch::optim::OptimizerOptions&, int slot) const { return 0.0; }
  // Checks of an optimizer's own options beyond the hyper-parameter table and the common options
  // (Adagrad's initial_accumulator_value); none by default.
  virtual void check_options(const torch::optim::OptimizerOptions&, const char* who) const {}

  virtual const char* name() const = 0;

 private:
  friend struct StepTesting;
  friend struct FragmentAccess;
  enum class StepPath { Fused, Reference, ScalarLoop };

  kernels::Rule rule() const { return config(defaults()).rule; }
  bool has_param(const at::Tensor& t) const;
  // only null: every parameter; found_inf: as step_parameters'.
  void step_only(const std::unordered_set<c10::TensorImpl*>* only, const at::Tensor& found_inf = at::Tensor());
  ParamState& ensure_state(const at::Tensor& p, const torch::optim::OptimizerOptions& options, int64_t group,
                           int64_t index);
  // A fresh state for p in its resolved format; slot k starts from values[k] when given. numel >= 0:
  // the state of a block-aligned range of that many elements (a shard), laid out by p's whole numel.
  ParamState make_state(const at::Tensor& p, const torch::optim::OptimizerOptions& options,
                        const std::vector<at::Tensor>& values, int64_t numel = -1) const;
  // The layout make_state gives p's state: its group's options, any override, the master-weight slot.
  StateLayout layout_of(const at::Tensor& p, const torch::optim::OptimizerOptions& options) const;
  // Checkpoint loading (checkpoint.cpp): parameter (group, index)'s state as the checkpoint stores
  // it, checked against the rule and options; and that state requantized into layout_of's layout.
  ParamState stored_state(const CheckpointParam& cp, const at::Tensor& p, size_t group, size_t index) const;
  ParamState converted_state(const ParamState& stored, const at::Tensor& p,
                             const torch::optim::OptimizerOptions& options) const;
  // What every op call of the group's step shares (step_calls.h).
  GroupStep group_step(size_t group);
  // Reads a checkpoint of libtorch's torch::optim::Adam / AdamW into this (Adam / AdamW) optimizer.
  void load_torch_adam(torch::serialize::InputArchive& archive);
  void check_grad(const at::Tensor& p, const at::Tensor& g, int64_t group, int64_t index) const;
  // The group's learning rate as a float64 [1] tensor on `device`, rewritten when the host value
  // changed (a scheduler's set_lr): the op reads lr there.
  at::Tensor lr_tensor(size_t group, at::Device device);
  // (group, index) of a parameter in param_groups_.
  using Position = std::pair<size_t, size_t>;
  // The overflow check of the parameters at `where` (null: every parameter).
  void check_overflow_on(bool cpu_only, const std::vector<Position>* where = nullptr) const;
  // The positions a step covers, in group order: every parameter's (only null), or those of `only`
  // (found through position_index_, so that a step of a few parameters costs no pass over all).
  std::vector<Position> positions(const std::unordered_set<c10::TensorImpl*>* only);
  // What this step sees of its inputs (step_graph.h), for a step of every parameter.
  StepInputs step_inputs() const;
  // The pre-pass and the step ops of one step (run as it comes, or recorded): the gradients' checks
  // are done; `devices` holds the devices' gradients (and found_inf where it was given),
  // `stepped_cpu` is set where a CPU parameter steps.
  struct DeviceGrads;
  // lamb_check: per group, whether its non-finite check rides on LAMB's first pass (step_only).
  void enqueue_step(std::vector<DeviceGrads>& devices, bool want_sumsq, const std::vector<char>& lamb_check,
                    const std::vector<Position>& where, bool* stepped_cpu);
  // The state changed (created, loaded, replaced): a recorded step that points to it is dropped.
  void state_changed();

  struct LrTensor {
    at::Tensor value;
    double written = 0.0;
  };
  std::unordered_map<c10::TensorImpl*, ParamState> states_;
  std::unordered_map<c10::TensorImpl*, StateFormat> overrides_;
  std::vector<std::vector<LrTensor>> lr_tensors_;  // per group, one per device in use
  at::Tensor skipped_;                             // int64 [1] on the device of the first step
  int64_t skipped_loaded_ = 0;                     // from a checkpoint
  int64_t steps_called_ = 0;
  int64_t overflow_check_interval_ = 0;
  StepPath path_ = StepPath::Fused;
  int64_t state_epoch_ = 0;  // bumped by state_changed()
  size_t params_checked_ = 0;  // how many parameters the groups held when check_groups last looked for repeats
  std::unique_ptr<StepGraph> step_graph_;
  std::unordered_map<c10::TensorImpl*, Position> position_index_;  // rebuilt when found stale
  uint64_t seed_ = 0x6C6F77626974ull;  // "lowbit": stochastic rounding seed, saved in checkpoints
};

// torch::load(optimizer, path) with the file's zip records checked first (a damaged size field
// must not make libtorch allocate what it says): the way to load a checkpoint from an untrusted file.
void load_checkpoint(LowbitOptimizer& optimizer, const std::string& path, const LoadOptions& options = LoadOptions());

}  // namespace optim
}  // namespace lowbit
