// ShardedOptimizer (ZeRO-2, ZeRO-1 as an option): wraps any lowbit optimizer and keeps on each rank
// only the optimizer state of the range of the parameters it owns. Parameters become views of flat
// buckets (flat_layout.h), each cut into equal block-aligned ranges, one per rank. Per step: the
// gradients are copied into the buckets and reduce-scattered (average) -> one small all_reduce
// decides the non-finite skip and gives the clipping norms -> the owned ranges step through the same
// step op as one process, with each piece's element offset in its parameter (quantization blocks,
// state formats and stochastic-rounding indices are those of the whole parameter) -> the parameters
// are all-gathered, bucket by bucket. Results do not depend on the number of ranks nor on the
// buckets: 1, 2 or 3 ranks, with or without overlap, give the same bits as one unsharded optimizer
// fed the averaged gradients (see the note on clipping at step()).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../optim/lowbit_optimizer.h"
#include "../optim/state_layout.h"

#include "communicator.h"
#include "compressed_wire.h"
#include "flat_layout.h"

namespace lowbit {
namespace optim {
class GradHooks;
}
namespace distributed {

class FullyShardedModule;
class SerialWorker;

// Bucket size with ShardedOptions::overlap unless bucket_bytes says otherwise. On 2 H200s (268M
// fp32 parameters, bench_sharded_step) 128 and 256 MiB buckets made backward + step 0.82-0.98x its
// time without overlap, NVLink or not, memory-bound or matmul backward; 25 MiB ones (DDP's
// default) 0.92-1.06x: each reduce-scatter's kernels take SMs and memory bandwidth from backward
// for a fixed cost, so fewer, larger ones hide better. A model under 128 MiB of parameters has one
// bucket: set bucket_bytes to overlap it.
constexpr int64_t kDefaultOverlapBucketBytes = int64_t{128} << 20;
// Bucket size without overlap unless bucket_bytes says otherwise. On 2 H200s (268M fp32 parameters,
// NVLink, copy-engine gathers, five runs) the step took 4.68-4.73 ms in 256 MiB buckets against
// 5.21-5.28 in one bucket per dtype, 4.72-4.80 in 512 MiB ones, 4.80-4.87 in 128 and 5.18-5.23 in 64
// (NCCL's kernels: 5.54 against 5.72 in one): each bucket's collectives run beside the next one's
// gradient copy and update, so smaller buckets hide more of them, but each costs its fixed part.
constexpr int64_t kDefaultStepBucketBytes = int64_t{256} << 20;

struct ShardedOptions {
  // ZeRO-1: gradients all-reduced (every rank holds the whole averaged gradient) instead of
  // reduce-scattered; the state is sharded either way.
  bool zero1 = false;
  // Copy rank 0's parameters to every rank when constructed (ranks then start identical).
  bool broadcast_parameters = true;

  // Overlap (off by default): a post-accumulate-grad hook on every parameter (the mechanism of
  // optim::GradientRelease) copies each gradient into its bucket as soon as backward() has summed
  // it, and a bucket is reduce-scattered (all-reduced with zero1) as soon as all its gradients are
  // in, while backward() goes on with the layers before. step() then reduces only the buckets still
  // outstanding, updates and all-gathers bucket by bucket (an asynchronous communicator can run the
  // all-gather of bucket k under the update of bucket k+1). Buckets hold whole parameters taken in
  // reverse registration order (the order backward() usually finishes them), one dtype each, and
  // are reduced strictly in that order on every rank, so the ranks' collectives always pair up, even
  // where backward() finishes them in another order or some never (below). Over NCCL a bucket's
  // reduce-scatter runs on the communicator's stream beside backward() (Communicator::
  // defer_stream_waits); MPI's complete inside backward(), on its thread.
  //   - Every parameter must be a leaf that requires grad and carry no other post-accumulate-grad
  //     hook (a GradientRelease, another overlapped ShardedOptimizer).
  //   - A gradient is taken when backward() finalises it: changing .grad after backward() (say,
  //     unscaling) is not seen; do it in the loss instead.
  //   - A parameter without a gradient on a rank (unused in its forward) counts as zeros from that
  //     rank; one without a gradient on every rank is not stepped (its state untouched), as one
  //     process skips a parameter whose .grad is undefined. Its bucket, and every later one, is then
  //     reduced in step(): correct, not overlapped.
  //   - No collective of your own on this communicator between a step's first backward() and its
  //     step(): ranks reduce their buckets at different times (one that misses a gradient reduces
  //     the rest in step()), so yours would pair with another rank's reduce-scatter. Use another
  //     communicator for them (the ranks of a job can hold several), or issue them after step().
  //   - Gradient accumulation: set_accumulating(true) for every backward() of a step but the last
  //     (gradients add up in .grad as usual), false before the last. A second backward() into a
  //     parameter already taken this step is an error naming it.
  // Without overlap step() takes the gradients bucket by bucket (kDefaultStepBucketBytes), each
  // bucket's reduce-scatter running beside the next one's gradient copy, and each all-gather beside
  // the next bucket's update.
  bool overlap = false;
  // Overlap: the hooks' work (each gradient's copy into its bucket, each bucket's collective) on a
  // thread of the optimizer's own, in the order the gradients came, so that it does not lengthen a
  // backward() whose thread launches kernels no faster than the GPU runs them (on 2 H200s, 64
  // gradients and 8 reduce-scatters added 1.0-1.2 ms to a 4.7 ms backward()). Everything is issued
  // before backward() returns, as without it. Unset: on for a GPU, off on the CPU (MPI's
  // collectives complete on the calling thread, and the copies use backward()'s OpenMP threads).
  // Fully sharded modules issue from backward()'s thread.
  std::optional<bool> overlap_thread;
  // The size a bucket is filled to, in bytes of parameters (a larger parameter gets its own).
  // Smaller buckets start communicating earlier; each costs one reduce-scatter, one all-gather and
  // up to world_size * 256 elements of padding. 0: kDefaultOverlapBucketBytes with overlap,
  // kDefaultStepBucketBytes without.
  int64_t bucket_bytes = 0;
  // Drop each .grad once it is copied into its bucket (by the hook with overlap, else in step()):
  // the gradients then live only in the buckets, not twice.
  bool release_gradients = false;

  // Low-bit collectives (compressed_wire.h), for runs the wire bounds (across nodes). Unset, the
  // default: full precision, and every result bit for bit one process's. Either leg on its own:
  //   gradient_wire: gradients reduce-scattered as quantized chunks (all-to-all) summed in float32
  //     by their owner, its own chunk exact (not with zero1). 8 bits: 1/4 of float32's bytes.
  //   update_wire: instead of the parameters, each owner all-gathers its chunk's update (new - old)
  //     quantized; every replica, the owner's too, adds the decoded update, so all stay identical.
  //     Use error feedback (WireCompression::updates()): without it an update smaller than its
  //     block's quantization step is lost every step. Not in checkpoints: the residual (what the
  //     replicas lack, under one update's quantization error) starts at zero after load().
  // Every rank must give the same options (checked when constructed, naming the option and rank).
  std::optional<WireCompression> gradient_wire;
  std::optional<WireCompression> update_wire;
};

// Bytes this rank sends per step (the collectives' algorithms: a ring's (world - 1) / world of the
// buffer for reduce-scatter and all-gather, twice that for all-reduce; (world - 1) rows for an
// all-to-all), with the parameters they carry: what the wire options save.
struct WireStats {
  int64_t gradient_bytes = 0, parameter_bytes = 0;
  int64_t parameters = 0;  // elements of all parameters
  double bytes_per_parameter() const {
    return parameters ? static_cast<double>(gradient_bytes + parameter_bytes) / static_cast<double>(parameters) : 0.0;
  }
};

// One rank's piece of one parameter: elements [offset, offset + numel) of parameter `index` of
// group `group`, and the optimizer state of exactly those elements.
struct Fragment {
  size_t group = 0, index = 0;
  int64_t offset = 0, numel = 0;
  int64_t param_numel = 0;  // the whole parameter's
  optim::ParamState state;
};

class ShardedOptimizer {
 public:
  using LossClosure = std::function<at::Tensor()>;

  // `optimizer` must not have stepped yet (load a checkpoint into the ShardedOptimizer instead).
  // All parameters must be on one device; the communicator carries that device's tensors.
  ShardedOptimizer(std::shared_ptr<optim::LowbitOptimizer> optimizer, std::shared_ptr<Communicator> comm,
                   ShardedOptions options = {});
  ~ShardedOptimizer();  // removes the overlap hooks
  // The hooks point at this object: neither copied nor moved.
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  // One step of every parameter; every rank calls it. Without overlap every parameter needs a
  // gradient on every rank (with overlap: see ShardedOptions::overlap). The averaged gradient is
  // computed as sum / world_size. Clipping's norm adds the ranks' partial sums of squares (one
  // scalar per group): it equals one process's norm where those sums are exact, and may differ from
  // it in the last bit otherwise (as for parameters on several devices in one optimizer).
  at::Tensor step(LossClosure closure = nullptr);
  void zero_grad(bool set_to_none = true);

  // Overlap only: while on, the hooks leave gradients to add up in .grad (micro-batches); step()
  // takes whatever is in .grad for parameters not taken by a hook.
  void set_accumulating(bool on);
  bool accumulating() const { return accumulating_; }
  // Buckets in all, and those of the coming step whose gradients are
  // not reduced yet (0 after a backward() that produced every gradient with overlap).
  int buckets() const { return static_cast<int>(buckets_.size()); }
  int buckets_pending() const { return static_cast<int>(buckets_.size() - next_bucket_); }

  WireStats wire_stats() const { return wire_stats_; }

  // Bytes of optimizer state this rank holds (its fragments only).
  int64_t state_bytes() const;
  int64_t skipped_steps() const;

  optim::LowbitOptimizer& optimizer() { return *optimizer_; }  // param groups, lr (schedulers)
  Communicator& communicator() { return *comm_; }
  // This rank's fragments, in (group, index) order; state undefined before the first step.
  const std::vector<Fragment>& fragments() const { return fragments_; }
  // The values fragments()[i] steps: a view of this rank's range of its parameter (fully sharded,
  // of its shard; with FullyShardedOptions::param_dtype, the float32 values the units compute from).
  const at::Tensor& fragment_values(size_t i) const { return fragment_params_.at(i); }

  // Checkpoints (sharded_checkpoint.cpp): every rank writes `prefix`.rank-R-of-N; load() reads the
  // files of any number of ranks, checks them whole, then takes the pieces this rank owns. State
  // in another layout than this optimizer's is refused unless options.convert_state_format()
  // (each parameter joined whole, expanded to fp32 and requantized, then sliced: as load_checkpoint).
  void save(const std::string& prefix) const;
  void load(const std::string& prefix, const optim::LoadOptions& options = optim::LoadOptions());

 private:
  // Fully sharded (FullyShardedModule, fully_sharded_module.h): one bucket per (unit, dtype), the
  // units listed in the order their gradients are reduced. Only each bucket's owned range (shard) persists; the whole
  // parameters are gathered on request and released once their gradients are reduced; step()
  // updates the shards and gathers nothing.
  friend class FullyShardedModule;
  struct Unit {
    std::string name;             // for errors: "unit 3", "the root unit"
    std::vector<size_t> members;  // indices into the optimizer's parameters
  };
  // Fully sharded mixed precision (FullyShardedOptions::param_dtype / reduce_dtype): float32
  // parameters stay float32 shards and are gathered as `compute`; gradients reduced as `reduce`.
  struct Precision {
    std::optional<at::ScalarType> compute, reduce;
  };
  // step_in_backward: each bucket steps as soon as its gradients are reduced, and drops its
  // gradient shard (FullyShardedOptions::step_in_backward).
  // device: where the shards live when the parameters start on the host.
  // fill (FullyShardedOptions::initialize): writes parameter m's elements [first_element,
  // first_element + values.numel()) into values, in place of copying and broadcasting the parameter.
  using ShardFill = std::function<void(size_t m, int64_t first_element, const at::Tensor& values)>;
  // This rank's range of each planned bucket, filled; every rank throws if any rank's fill threw.
  std::vector<at::Tensor> fill_own_ranges(const std::vector<std::vector<size_t>>& planned, const ShardFill& fill);
  ShardedOptimizer(std::shared_ptr<optim::LowbitOptimizer> optimizer, std::shared_ptr<Communicator> comm,
                   ShardedOptions options, std::vector<Unit> units, bool step_in_backward,
                   std::optional<at::Device> device, Precision precision = {}, ShardFill fill = nullptr);
  void gather(size_t bucket);   // every rank's shard into flat_param (its parameters' memory)
  void release(size_t bucket) { release(buckets_[bucket]); }  // the parameters' memory dropped; the shard stays
  // Buckets [0, end) reduced now: the gradients no hook took from .grad, zeros where a parameter
  // has none on this rank (step() does it for every bucket).
  void reduce_buckets_before(size_t end);

  struct Bucket {
    at::ScalarType dtype;  // the parameters' (and the shard's)
    // Fully sharded: the gathered parameters' and the gradients' dtypes (Precision; else dtype).
    at::ScalarType compute, reduce;
    FlatLayout layout;
    std::vector<size_t> members;  // indices into params_
    at::Tensor flat_param, flat_grad, grad_shard;
    std::vector<size_t> fragments;  // this rank's pieces of the members, indices into fragments_
    size_t waiting = 0;             // members whose gradient of this step is not in flat_grad yet
    bool sum_only = false;          // grad_shard is in float_shards_: reduced as a sum, divided in step()
    // gradient_wire: packed chunks sent and received (uint8 [world, row bytes]), and with error
    // feedback what quantization lost (float32 [total]).
    at::Tensor grad_send, grad_recv, grad_residual;
    // update_wire: every rank's packed update (uint8 [world, row bytes]), this rank's chunk before
    // the update (parameter dtype) and the update's residual (float32 [chunk]).
    at::Tensor update_rows, before, update_residual;
    // Fully sharded: this rank's range of the parameters (flat_param's lives only while gathered),
    // the unit the bucket belongs to, and flat_grad's elements that hold no parameter (zeroed
    // whenever its memory is allocated anew).
    at::Tensor shard;
    at::Tensor released;  // what the members are views of while released (reading it is an error)
    size_t unit = 0;
    bool gathered = true;
    std::vector<std::pair<int64_t, int64_t>> padding;
    int64_t reduced_by = 0;  // step_in_backward: its reduction's number (Communicator::collectives_issued())
  };
  struct Param {
    size_t group, index;
    at::Tensor param;
    size_t bucket;
    int64_t flat_offset;
    int fragment = -1;  // index into fragments_ (this rank owns a piece), or -1
    optim::StateLayout layout;
    at::Tensor in_flat_grad;  // its place in the bucket's flat_grad, shaped as the parameter
    bool taken = false;  // this step's gradient is in the bucket
    bool had = false;    // ... and it was a gradient, not zeros for a missing one
  };
  std::vector<std::vector<size_t>> plan_buckets() const;
  FlatLayout layout_of(const std::vector<size_t>& members) const;  // a planned bucket's flat layout
  void ensure_flat_grad(Bucket& b);  // fully sharded: flat_grad's memory, its padding zeroed
  void release(Bucket& b);
  void point_members_at(Bucket& b, const at::Tensor& flat);  // the parameters become views of flat
  // What every rank decides together before an update, in one small all_reduce: whether any of the
  // pieces `frags` (of every rank) holds a non-finite gradient and each group's sum of squares
  // (prepass; sumsq where asked), and with count_ranks which of `members` no rank had a gradient
  // for (had: this rank's flags, by index into params_).
  struct GradientAgreement {
    at::Tensor found_inf, sumsq;  // undefined without prepass
    std::vector<char> stepped;    // by index into params_: 0 where no rank had the gradient
  };
  GradientAgreement agree_on_gradients(const std::vector<size_t>& frags, const std::vector<size_t>& members,
                                       const std::vector<char>& had, bool prepass, bool want_sumsq, bool count_ranks);
  void step_bucket(Bucket& b);       // step_in_backward: the bucket's update, once reduced
  void step_reduced_buckets(size_t end);  // ... of the buckets before `end` not stepped yet
  void sum_chunks(Bucket& b);  // gradient_wire: the received chunks and the own one into grad_shard
  // Fully sharded over gradient_wire: the buckets before `end` not summed yet, their exchange
  // awaited on the caller's stream, then their send, receive and gradient buffers released.
  void sum_received_chunks(size_t end);
  at::ScalarType compute_dtype(at::ScalarType param) const;  // precision_ applied to a parameter dtype
  at::ScalarType reduce_dtype(at::ScalarType param) const;
  // Fully sharded: bytes the buckets hold now in gathered parameters, gradient buffers and gradient
  // shards, and their high-water marks (note_transient() after each allocation; FullyShardedModule::
  // memory_report()).
  struct Transient {
    int64_t gathered = 0, gradients = 0, gradient_shards = 0;
  };
  Transient transient_now() const;
  void note_transient();
  Transient transient_peak_;
  // A transient buffer's memory (a unit's gathered parameters, gradient buffer or gradient shard),
  // and its release. The caching allocator hands memory a collective used on its own stream out
  // again only once that collective has finished; a host that ran ahead of the device would get
  // every unit's buffers newly reserved (seen: 27 GiB of slack at 4.8B parameters on 2 GPUs). So a
  // release notes the collectives issued by then, and an allocation first lets the host wait for
  // the oldest noted release while more than kReleasesAhead are pending (about three units ahead in
  // backward, which keeps the device's queue full).
  void allocate_transient(const at::Tensor& t);
  void release_transient(const at::Tensor& t);
  static constexpr size_t kReleasesAhead = 6;
  std::deque<int64_t> releases_pending_;  // collectives_issued() at each release not yet waited for
  void check_step_in_backward();     // ... refuses what needs every gradient first
  void report_overflow();            // quantized state that overflowed since the last report
  // Every rank's options, parameter count and sizes against rank 0's, before any other collective.
  void check_ranks_agree();
  void make_wire_buffers(Bucket& b);
  std::string name(size_t m) const;
  void on_gradient(size_t m, const at::Tensor& param);  // the overlap hook
  void take_gradient(size_t m, at::Tensor grad);   // checked, copied into its bucket, flagged taken
  void check_gradient(size_t m, const at::Tensor& grad) const;  // its shape
  void copy_gradient(size_t m, const at::Tensor& grad);         // into its bucket (the worker's part)
  void mark_taken(size_t m);  // this step's gradient is in (or on its way to) the bucket; .grad dropped if released
  void reduce_ready_buckets();
  void update(size_t group, const std::vector<size_t>& frags, const at::Tensor& found_inf, const at::Tensor& sumsq,
              const std::vector<at::Tensor>& lamb_rows);
  void ensure_states();
  // LAMB: each piece's sums of p^2 and r^2 over its whole parameter, the per-block sums
  // all-reduced and added as one process adds them (kernels::lamb_add_block_sums), float64 [pieces, 2].
  at::Tensor lamb_norms(size_t group, const std::vector<size_t>& frags, const at::Tensor& found_inf,
                        const at::Tensor& sumsq);

  std::shared_ptr<optim::LowbitOptimizer> optimizer_;
  std::shared_ptr<Communicator> comm_;
  ShardedOptions options_;
  at::Device device_ = at::kCPU;
  std::vector<Bucket> buckets_;  // in the order they are reduced
  // The float32 buckets' gradient shards (reduce-scatter without zero1), one buffer: reduced as sums
  // from the hooks, divided by the world size once in step(), the same div_ Avg would make in each
  // reduce-scatter, off the autograd thread.
  at::Tensor float_shards_;
  at::Tensor wire_scratch_;  // float32, the largest chunk: one decoded chunk at a time
  WireStats wire_stats_;
  size_t next_bucket_ = 0;       // the next bucket to reduce this step
  size_t next_to_step_ = 0;      // step_in_backward: the next bucket to step this step
  size_t next_to_sum_ = 0;       // fully sharded, gradient_wire: the next bucket to sum this step
  bool accumulating_ = false;
  std::unique_ptr<optim::GradHooks> hooks_;  // overlap only
  // Overlap on a thread of its own (ShardedOptions::overlap_thread): the hooks' copies and
  // collectives, and whether this backward()'s final callback (which waits for them) is queued.
  std::unique_ptr<SerialWorker> worker_;
  bool drain_queued_ = false;
  std::vector<Param> params_;
  std::vector<Fragment> fragments_;
  std::vector<size_t> fragment_param_;  // index into params_ of each fragment
  std::vector<at::Tensor> fragment_params_, fragment_grads_;  // views: the piece of the parameter / gradient shard
  at::Tensor skipped_;   // int64 [1] on the device
  int64_t skipped_loaded_ = 0;
  std::vector<Unit> units_;  // fully sharded only (see the constructor above)
  bool step_in_backward_ = false;
  Precision precision_;
  at::Tensor backward_found_;  // step_in_backward: float32 [1], a bucket of this step was skipped
  bool fully_sharded() const { return !units_.empty(); }
  bool filled_ = false;  // each rank filled its own shards (ShardFill)
  // The gradient wire's option as the user set it, for errors.
  const char* gradient_wire_option() const {
    return fully_sharded() ? "FullyShardedOptions::gradient_wire" : "ShardedOptions::gradient_wire";
  }
};

}  // namespace distributed
}  // namespace lowbit
