// The example's command line: every flag with its default, parsed and checked in one place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <lowbit/optim/state_format.h>

namespace gpt {

struct Flags {
  // ---- model
  int64_t layers = 6, width = 384, heads = 6, context = 256;
  int64_t vocab = 1024;            // 256: bytes; more: a BPE with vocab - 256 merges, trained at start-up
  std::string dtype = "fp32";      // parameter dtype: fp32 | bf16
  // --fully-sharded mixed precision (FullyShardedOptions::param_dtype / reduce_dtype); "": unset.
  std::string param_dtype, reduce_dtype;
  bool checkpoint_activations = false;
  // ---- data
  std::string data;                // file or folder; empty: /usr/share/games/fortunes
  int64_t data_limit = 0;          // bytes of the corpus to use (0: all)
  int64_t val_every = 10;          // every val_every-th chunk of the text is validation
  // ---- training
  int64_t steps = 1000, batch = 32, warmup = 100;
  double lr = 1e-3, min_lr_ratio = 0.1, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, clip = 1.0;
  std::string optimizer = "adamw";  // adamw adam lion sgd rmsprop adagrad ademamix lamb torch-adamw
  lowbit::StateFormat state_format = lowbit::StateFormat::Q8;
  int64_t block_size = 0, master_weight_bits = 0;
  lowbit::QuantFormat fp8_second_moment = lowbit::QuantFormat::FP8E4M3;  // FP8 state's second moments
  bool stochastic_round = false;
  bool gradient_release = false;    // lowbit::optim::GradientRelease: step in backward, free each gradient
  bool offload = false;             // lowbit::optim::HostOffload: state on the host, stepped by the CPU in backward
  int offload_threads = 0;          // HostOffloadOptions::host_threads (0: as many as --threads)
  bool offload_stage_weights = false;  // HostOffloadOptions::stage_weights: no host copy of the weights
  bool step_graphs = true;          // LowbitOptimizer::set_step_graphs (off: --no-step-graphs)
  bool digest = true;               // the parameters' digest at the end (off: --no-digest)
  uint64_t seed = 1;
  // The initial weights: "torch" (torch's generator) or "keyed" (a function of the parameter, the
  // seed and the element's index, ModelConfig::keyed_init: --fully-sharded ranks fill only their
  // own shards instead of rank 0 building and broadcasting the model).
  std::string init = "torch";
  std::string device = "cpu";
  int threads = 0;                  // 0: libtorch's default
  bool tf32 = true;                 // fp32 matmuls on CUDA through TF32
  bool deterministic = false;       // at::globalContext().setDeterministicAlgorithms (CUDA: attention backward)
  // ---- data parallel (under mpirun): every rank takes 1/N of each batch, ShardedOptimizer averages
  // the gradients and keeps 1/N of the state; the low-bit wire (ShardedOptions::gradient_wire /
  // update_wire): "none" or a signed QuantFormat name (Dyn8Signed, DE4Signed, ...)
  bool sharded = false;
  std::string wire_gradients = "none", wire_updates = "none";
  // --copy-engines auto|gathers|all|off: InitOptions::copy_engine_gathers / _reductions (--sharded
  // over NCCL); auto: both unset, on where NCCL has copy engines; gathers / all / off force them.
  std::string copy_engines = "auto";
  // --overlap: ShardedOptions::overlap (gradients reduce-scattered from backward()'s hooks);
  // --overlap-thread auto|on|off: ShardedOptions::overlap_thread (auto: unset, on for a GPU).
  bool overlap = false;
  std::string overlap_thread = "auto";
  // --fully-sharded: the same data parallelism with parameters, gradients and state sharded
  // (lowbit::distributed::FullyShardedModule, one unit per block; the embeddings, final norm and
  // tied head in the root): each rank holds about 1/N of the model between its uses.
  bool fully_sharded = false;
  // After training, rank 0 compares its loss curve with another run's CSV (--out of that run):
  // the largest difference of the logged training losses must stay within `tolerance`.
  std::string compare;
  int64_t timeline = 0;  // --timeline STEP: that step's collectives printed (rank 0, NCCL); 0: none
  double tolerance = 5e-3;
  // ---- output
  int64_t log_every = 10, eval_every = 100, eval_batches = 8, sample = 0;
  std::string out = "gpt";          // prefix of OUT.csv, OUT.png
  std::string save, resume;         // checkpoint folders
  std::string save_moments;         // after training: the optimizer's moments in fp32 (bench_state_error)
  int64_t stop_after = 0;           // stop (and --save) after this step, schedule unchanged
  // ---- checks (what CTest runs)
  bool check_decreases = false, check_resume = false, check_recompute = false, check_release = false,
       check_offload = false;
  // ---- QAT study (qat_study.h): after training, PTQ vs QAT fine-tuning vs fp32 fine-tuning
  int64_t qat_steps = 0, qat_group = 32, qat_bits = 4;  // weights: int<qat_bits> per group of qat_group
  double qat_lr = 0;                // 0: --lr x --min-lr-ratio (where the schedule ended)
  // ---- the largest model that trains
  bool probe = false;
  int64_t probe_steps = 3, probe_max_layers = 4096;
  std::string probe_save;           // also time torch::save(optimizer) of the largest model to this file
  bool quiet = false;
};

// Parses argv; throws std::invalid_argument naming the flag and the value on bad input.
Flags parse_flags(int argc, char** argv);
std::string usage();
// The flags that must match for a checkpoint to resume (model, data, schedule, optimizer).
std::string resume_key(const Flags& f);

}  // namespace gpt
