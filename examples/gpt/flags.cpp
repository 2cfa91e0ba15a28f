// Flag parsing for examples/gpt: a bad value names the flag and the value.
#include "flags.h"

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace gpt {

namespace {

[[noreturn]] void bad(const std::string& flag, const std::string& value, const std::string& want) {
  throw std::invalid_argument(flag + " " + value + ": expected " + want);
}

int64_t to_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || x < lo || x > hi)
    bad(flag, "'" + v + "'", "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

double to_double(const std::string& flag, const std::string& v, double lo, double hi) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || !std::isfinite(x) || x < lo || x > hi) {
    std::ostringstream s;
    s << "a number in [" << lo << ", " << hi << "]";
    bad(flag, "'" + v + "'", s.str());
  }
  return x;
}

const char* kOptimizers[] = {"adamw", "adam", "lion", "sgd", "rmsprop", "adagrad", "ademamix", "lamb", "torch-adamw"};

// The tiny config: what CI runs on two CPU cores in a few seconds.
void tiny(Flags& f) {
  f.layers = 2, f.width = 64, f.heads = 4, f.context = 64, f.vocab = 320;
  f.batch = 16, f.steps = 60, f.warmup = 10, f.lr = 3e-3;
  f.data_limit = 400000, f.log_every = 5, f.eval_every = 20, f.eval_batches = 4;
}

}  // namespace

std::string usage() {
  return "usage: gpt [flags]\n"
         "  model     --layers N --width N --heads N --context N --vocab N (256 = bytes, more = BPE)\n"
         "            --dtype fp32|bf16 --checkpoint-activations\n"
         "  data      --data FILE|DIR (default /usr/share/games/fortunes) --data-limit BYTES --val-every N\n"
         "  training  --steps N --batch N --warmup N --lr X --min-lr-ratio X --weight-decay X --beta1 X --beta2 X\n"
         "            --eps X --clip X (0 = off) --seed N --device cpu|cuda[:i] --threads N --no-tf32 --deterministic\n"
         "            --init torch|keyed (initial weights from torch's generator, or keyed by element index: the same\n"
         "            values however the model is sharded, each --fully-sharded rank filling only its own shards)\n"
         "  optimizer --optimizer adamw|adam|lion|sgd|rmsprop|adagrad|ademamix|lamb|torch-adamw\n"
         "            --state-format FP32|BF16|Q8|Q4|FP8|C8 --fp8-second-moment E4M3|E5M2 --block-size N --master-weight-bits 0|24|32 --stochastic-round\n"
         "            --gradient-release (each parameter steps in backward and frees its gradient; needs --clip 0)\n"
         "            --offload (optimizer state on the host: each gradient is copied there in backward and\n"
         "            stepped by the CPU, the weights copied back; needs --clip 0) --offload-threads N (the CPU\n"
         "            steps' threads; default --threads) --offload-stage-weights (no copy of the weights on the\n"
         "            host: each goes there with its gradient; half the host memory)\n"
         "            --no-step-graphs (every GPU step enqueued anew, never replayed from a recorded CUDA graph)\n"
         "  parallel  --sharded (under mpirun: data parallel, ShardedOptimizer; --batch is the global batch)\n"
         "            --wire-gradients none|FORMAT --wire-updates none|FORMAT (low-bit collectives, e.g. Dyn8Signed, DE4Signed)\n"
         "            --copy-engines auto|gathers|all|off (--sharded on CUDA: the parameters' all-gathers on NCCL's copy\n"
         "            engines, all: the gradients' reduce-scatters too; auto: both where NCCL has copy engines, one node)\n"
         "            --overlap (--sharded: gradients reduce-scattered in buckets from backward()'s hooks)\n"
         "            --overlap-thread auto|on|off (--overlap: the hooks' work on a thread of its own; auto: on for cuda)\n"
         "            --fully-sharded (parameters and gradients sharded too: FullyShardedModule, a unit per block; built on\n"
         "            the host by rank 0, or with --init keyed by no rank; with --gradient-release each unit steps in backward)\n"
         "            --param-dtype bf16 (with --dtype fp32: float32 shards, units computing in bfloat16) --reduce-dtype fp32|bf16\n"
         "            --timeline STEP (over NCCL, rank 0: that step's collectives on the GPU beside forward / backward / step)\n"
         "  output    --out PREFIX --log-every N --eval-every N --eval-batches N --sample N --quiet\n"
         "            --no-digest (no parameter digest at the end: it copies the whole model to rank 0's host)\n"
         "            --save DIR --resume DIR --stop-after STEP --save-moments FILE (AdamW / Adam moments, fp32)\n"
         "  presets   --tiny (CPU, seconds)\n"
         "  checks    --check-decreases --check-resume --check-recompute --check-release\n"
         "            --check-offload\n"
         "            --compare CSV --tolerance X (rank 0: the loss curve against another run's, within X)\n"
         "  QAT       --qat-steps N --qat-lr X --qat-group N --qat-bits N (after training: int8 per-token\n"
         "            activations + int4 (--qat-bits) per-group weights, PTQ vs QAT fine-tuning vs fp32 fine-tuning of N steps)\n"
         "  probe     --probe-max-size --probe-steps N --probe-max-layers N --probe-save FILE\n";
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  const int64_t kMax = int64_t(1) << 40;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + ": missing value");
      return argv[++i];
    };
    if (a == "--tiny") tiny(f);
    else if (a == "--layers") f.layers = to_int(a, next(), 1, 100000);
    else if (a == "--width") f.width = to_int(a, next(), 1, 1 << 20);
    else if (a == "--heads") f.heads = to_int(a, next(), 1, 1 << 16);
    else if (a == "--context") f.context = to_int(a, next(), 2, 1 << 20);
    else if (a == "--vocab") f.vocab = to_int(a, next(), 256, 65536);
    else if (a == "--dtype") {
      f.dtype = next();
      if (f.dtype != "fp32" && f.dtype != "bf16") bad(a, "'" + f.dtype + "'", "fp32 or bf16");
    } else if (a == "--param-dtype" || a == "--reduce-dtype") {
      std::string& v = a == "--param-dtype" ? f.param_dtype : f.reduce_dtype;
      v = next();
      if (v != "fp32" && v != "bf16") bad(a, "'" + v + "'", "fp32 or bf16");
    } else if (a == "--checkpoint-activations") f.checkpoint_activations = true;
    else if (a == "--data") f.data = next();
    else if (a == "--data-limit") f.data_limit = to_int(a, next(), 0, kMax);
    else if (a == "--val-every") f.val_every = to_int(a, next(), 2, 1000);
    else if (a == "--steps") f.steps = to_int(a, next(), 1, kMax);
    else if (a == "--batch") f.batch = to_int(a, next(), 1, 1 << 20);
    else if (a == "--warmup") f.warmup = to_int(a, next(), 0, kMax);
    else if (a == "--lr") f.lr = to_double(a, next(), 0, 10);
    else if (a == "--min-lr-ratio") f.min_lr_ratio = to_double(a, next(), 0, 1);
    else if (a == "--weight-decay") f.weight_decay = to_double(a, next(), 0, 10);
    else if (a == "--beta1") f.beta1 = to_double(a, next(), 0, 0.999999);
    else if (a == "--beta2") f.beta2 = to_double(a, next(), 0, 0.999999);
    else if (a == "--eps") f.eps = to_double(a, next(), 0, 1);
    else if (a == "--clip") f.clip = to_double(a, next(), 0, 1e6);
    else if (a == "--optimizer") {
      f.optimizer = next();
      bool known = false;
      for (const char* o : kOptimizers) known |= f.optimizer == o;
      if (!known) bad(a, "'" + f.optimizer + "'", "one of adamw adam lion sgd rmsprop adagrad ademamix lamb torch-adamw");
    } else if (a == "--state-format") {
      const std::string v = next();
      if (!lowbit::parse_state_format(v, &f.state_format)) bad(a, "'" + v + "'", lowbit::all_state_format_names());
    } else if (a == "--fp8-second-moment") {
      const std::string v = next();
      if (v == "E4M3" || v == "FP8E4M3") f.fp8_second_moment = lowbit::QuantFormat::FP8E4M3;
      else if (v == "E5M2" || v == "FP8E5M2") f.fp8_second_moment = lowbit::QuantFormat::FP8E5M2;
      else bad(a, "'" + v + "'", "E4M3 or E5M2");
    } else if (a == "--block-size") f.block_size = to_int(a, next(), 0, 1 << 20);
    else if (a == "--master-weight-bits") {
      const std::string v = next();
      f.master_weight_bits = to_int(a, v, 0, 32);
      if (f.master_weight_bits != 0 && f.master_weight_bits != 24 && f.master_weight_bits != 32) bad(a, "'" + v + "'", "0, 24 or 32");
    } else if (a == "--stochastic-round") f.stochastic_round = true;
    else if (a == "--gradient-release") f.gradient_release = true;
    else if (a == "--offload") f.offload = true;
    else if (a == "--offload-threads") f.offload_threads = static_cast<int>(to_int(a, next(), 1, 4096));
    else if (a == "--offload-stage-weights") f.offload_stage_weights = true;
    else if (a == "--no-step-graphs") f.step_graphs = false;
    else if (a == "--no-digest") f.digest = false;
    else if (a == "--sharded") f.sharded = true;
    else if (a == "--fully-sharded") f.sharded = f.fully_sharded = true;
    else if (a == "--copy-engines") f.copy_engines = next();
    else if (a == "--overlap") f.overlap = true;
    else if (a == "--overlap-thread") f.overlap_thread = next();
    else if (a == "--compare") f.compare = next();
    else if (a == "--timeline") f.timeline = to_int(a, next(), 1, int64_t(1) << 40);
    else if (a == "--tolerance") f.tolerance = to_double(a, next(), 0, 1e9);
    else if (a == "--wire-gradients" || a == "--wire-updates") {
      const std::string v = next();
      lowbit::QuantFormat q;
      if (v != "none" && !(lowbit::parse_format(v, &q) && lowbit::format_is_signed(q)))
        bad(a, "'" + v + "'", "none or a signed format: Dyn8Signed, DE4Signed, FP8E4M3, FP8E5M2, Pow8Signed");
      (a == "--wire-gradients" ? f.wire_gradients : f.wire_updates) = v;
    }
    else if (a == "--seed") f.seed = static_cast<uint64_t>(to_int(a, next(), 0, kMax));
    else if (a == "--init") {
      f.init = next();
      if (f.init != "torch" && f.init != "keyed") bad(a, "'" + f.init + "'", "torch or keyed");
    }
    else if (a == "--device") {
      f.device = next();
      try {
        c10::Device d(f.device);
        if (!d.is_cpu() && !d.is_cuda()) bad(a, "'" + f.device + "'", "cpu or cuda[:index]");
      } catch (const c10::Error&) {
        bad(a, "'" + f.device + "'", "cpu or cuda[:index]");
      }
    } else if (a == "--threads") f.threads = static_cast<int>(to_int(a, next(), 0, 4096));
    else if (a == "--no-tf32") f.tf32 = false;
    else if (a == "--deterministic") f.deterministic = true;
    else if (a == "--out") f.out = next();
    else if (a == "--log-every") f.log_every = to_int(a, next(), 1, kMax);
    else if (a == "--eval-every") f.eval_every = to_int(a, next(), 1, kMax);
    else if (a == "--eval-batches") f.eval_batches = to_int(a, next(), 1, 1 << 20);
    else if (a == "--sample") f.sample = to_int(a, next(), 0, 1 << 20);
    else if (a == "--save") f.save = next();
    else if (a == "--save-moments") f.save_moments = next();
    else if (a == "--resume") f.resume = next();
    else if (a == "--stop-after") f.stop_after = to_int(a, next(), 1, kMax);
    else if (a == "--check-decreases") f.check_decreases = true;
    else if (a == "--check-resume") f.check_resume = true;
    else if (a == "--check-recompute") f.check_recompute = true;
    else if (a == "--check-release") f.check_release = true;
    else if (a == "--check-offload") f.check_offload = true;
    else if (a == "--qat-steps") f.qat_steps = to_int(a, next(), 0, kMax);
    else if (a == "--qat-group") f.qat_group = to_int(a, next(), 1, 1 << 20);
    else if (a == "--qat-bits") f.qat_bits = to_int(a, next(), 2, 8);
    else if (a == "--qat-lr") f.qat_lr = to_double(a, next(), 0.0, 10.0);
    else if (a == "--probe-max-size") f.probe = true;
    else if (a == "--probe-steps") f.probe_steps = to_int(a, next(), 2, 1000);
    else if (a == "--probe-max-layers") f.probe_max_layers = to_int(a, next(), 1, 100000);
    else if (a == "--probe-save") f.probe_save = next();
    else if (a == "--quiet") f.quiet = true;
    else if (a == "--help" || a == "-h") throw std::invalid_argument("help");
    else throw std::invalid_argument("unknown flag " + a);
  }
  // ---- combinations
  if (f.width % f.heads != 0)
    throw std::invalid_argument("--width " + std::to_string(f.width) + " is not a multiple of --heads " + std::to_string(f.heads));
  if (f.master_weight_bits != 0 && f.dtype != "bf16")
    throw std::invalid_argument("--master-weight-bits " + std::to_string(f.master_weight_bits) + " needs --dtype bf16");
  if (f.stochastic_round && f.dtype != "bf16") throw std::invalid_argument("--stochastic-round needs --dtype bf16");
  if (f.stochastic_round && f.master_weight_bits != 0)
    throw std::invalid_argument("--stochastic-round cannot be combined with --master-weight-bits " +
                                std::to_string(f.master_weight_bits) + " (the correction replaces it)");
  if (f.optimizer == "torch-adamw" && (f.master_weight_bits != 0 || f.stochastic_round))
    throw std::invalid_argument("--optimizer torch-adamw has no --master-weight-bits / --stochastic-round");
  if (f.gradient_release && f.optimizer == "torch-adamw")
    throw std::invalid_argument("--gradient-release needs a lowbit optimizer, not --optimizer torch-adamw");
  if (f.gradient_release && f.clip > 0)
    throw std::invalid_argument("--gradient-release steps each parameter before the others have gradients, so "
                                "global-norm clipping (--clip " + std::to_string(f.clip) + ") cannot work: pass --clip 0");
  if (f.offload && (f.optimizer == "torch-adamw" || f.clip > 0 || f.gradient_release || f.sharded || f.qat_steps))
    throw std::invalid_argument("--offload steps a lowbit optimizer's state on the host from each gradient's hook: it "
                                "needs --clip 0 and a lowbit optimizer, and goes without --gradient-release (it "
                                "releases the gradients itself), --sharded / --fully-sharded and --qat-steps");
  if (f.offload_threads && !f.offload)
    throw std::invalid_argument("--offload-threads sets the threads of --offload's CPU steps: pass --offload too");
  if (f.offload_stage_weights && !f.offload && !f.check_offload)
    throw std::invalid_argument("--offload-stage-weights is an option of --offload: pass --offload (or --check-offload) too");
  if (!f.sharded && (f.wire_gradients != "none" || f.wire_updates != "none"))
    throw std::invalid_argument("--wire-gradients / --wire-updates compress the collectives of --sharded; add it");
  if (f.sharded && (f.optimizer == "torch-adamw" || (f.gradient_release && !f.fully_sharded) || f.qat_steps || f.probe))
    throw std::invalid_argument("--sharded / --fully-sharded take a lowbit optimizer, without --qat-steps or "
                                "--probe-max-size (and --sharded without --gradient-release)");
  if (f.copy_engines != "auto" && f.copy_engines != "gathers" && f.copy_engines != "all" && f.copy_engines != "off")
    throw std::invalid_argument("--copy-engines takes auto, gathers, all or off, not " + f.copy_engines);
  if (f.copy_engines != "auto" && (!f.sharded || f.fully_sharded || at::Device(f.device).type() != at::kCUDA))
    throw std::invalid_argument("--copy-engines chooses where --sharded's collectives run over NCCL: "
                                "it needs --sharded (not --fully-sharded) and --device cuda");
  if (f.overlap && (!f.sharded || f.fully_sharded))
    throw std::invalid_argument("--overlap reduce-scatters --sharded's gradients from backward()'s hooks: it needs "
                                "--sharded (--fully-sharded always overlaps)");
  if (f.overlap_thread != "auto" && f.overlap_thread != "on" && f.overlap_thread != "off")
    throw std::invalid_argument("--overlap-thread takes auto, on or off, not " + f.overlap_thread);
  if (f.overlap_thread != "auto" && !f.overlap)
    throw std::invalid_argument("--overlap-thread runs --overlap's hooks on a thread of their own: pass --overlap too");
  if (f.fully_sharded && f.wire_updates != "none")
    throw std::invalid_argument("--fully-sharded gathers the parameters themselves in their compute dtype, not "
                                "updates: --wire-updates is for --sharded (--wire-gradients works with both)");
  if ((!f.param_dtype.empty() || !f.reduce_dtype.empty()) && !f.fully_sharded)
    throw std::invalid_argument("--param-dtype / --reduce-dtype are the mixed precision of --fully-sharded; add it");
  if (f.param_dtype == "bf16" && f.dtype != "fp32")
    throw std::invalid_argument("--param-dtype bf16 computes float32 parameters in bfloat16; they are --dtype " + f.dtype);
  if (!f.digest && (f.check_resume || f.check_recompute || f.check_release || f.check_offload))
    throw std::invalid_argument("--check-resume / --check-recompute / --check-release / --check-offload compare the "
                                "runs' parameter digests: drop --no-digest");
  if (!f.compare.empty() && f.stop_after)
    throw std::invalid_argument("--compare checks a whole run's curve: drop --stop-after");
  if (f.stop_after > f.steps)
    throw std::invalid_argument("--stop-after " + std::to_string(f.stop_after) + " is past --steps " + std::to_string(f.steps));
  if (f.check_resume && (!f.save.empty() || !f.resume.empty() || f.stop_after))
    throw std::invalid_argument("--check-resume makes its own checkpoint: drop --save / --resume / --stop-after");
  if (f.qat_steps && f.width % f.qat_group != 0)
    throw std::invalid_argument("--qat-group " + std::to_string(f.qat_group) + " does not divide --width " + std::to_string(f.width));
  if (f.qat_steps && f.dtype != "fp32") throw std::invalid_argument("--qat-steps needs --dtype fp32 (the study compares with fp32)");
  if (f.qat_steps && f.gradient_release)
    throw std::invalid_argument("--qat-steps with --gradient-release: the study's fine-tuning steps with step(); drop one");
  if (f.check_resume && f.steps < 2) throw std::invalid_argument("--check-resume needs --steps >= 2");
  return f;
}

std::string resume_key(const Flags& f) {
  std::ostringstream s;
  s << "layers=" << f.layers << " width=" << f.width << " heads=" << f.heads << " context=" << f.context
    << " vocab=" << f.vocab << " dtype=" << f.dtype << " data_limit=" << f.data_limit << " val_every=" << f.val_every
    << " steps=" << f.steps << " batch=" << f.batch << " warmup=" << f.warmup << " lr=" << f.lr
    << " min_lr_ratio=" << f.min_lr_ratio << " weight_decay=" << f.weight_decay << " betas=" << f.beta1 << ","
    << f.beta2 << " eps=" << f.eps << " clip=" << f.clip << " optimizer=" << f.optimizer
    << " state_format=" << lowbit::state_format_name(f.state_format) << " block_size=" << f.block_size
    << " master_weight_bits=" << f.master_weight_bits << " stochastic_round=" << f.stochastic_round
    << " seed=" << f.seed;
  return s.str();
}

}  // namespace gpt
