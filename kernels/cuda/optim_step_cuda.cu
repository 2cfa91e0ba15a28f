// Drives one fused optimizer step on a GPU (optim_step_cuda.h): the prologue derives each
// parameter's per-step values from its counters and lr on the device, LAMB's first pass and
// trust ratios where asked, then the step kernels of step_kernel.cuh, one launch per chunk of
// parameters. Everything is enqueued on `stream`; nothing waits for the device.
#include "lamb_sums_kernel.cuh"
#include "step_launch.cuh"
#include "step_tuning.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

// Instantiated in optim_step_<rule>.cu.
template <> cudaError_t launch_step<Rule::Adam>(const Chunk&, const Args&, ElemType, int, int, int, int, int64_t, cudaStream_t);
template <> cudaError_t launch_step<Rule::AdamW>(const Chunk&, const Args&, ElemType, int, int, int, int, int64_t, cudaStream_t);
template <> cudaError_t launch_step<Rule::SGD>(const Chunk&, const Args&, ElemType, int, int, int, int, int64_t, cudaStream_t);
template <> cudaError_t launch_step<Rule::Lion>(const Chunk&, const Args&, ElemType, int, int, int, int, int64_t, cudaStream_t);
template <> cudaError_t launch_step<Rule::RMSprop>(const Chunk&, const Args&, ElemType, int, int, int, int, int64_t, cudaStream_t);
template <> cudaError_t launch_step<Rule::Adagrad>(const Chunk&, const Args&, ElemType, int, int, int, int, int64_t, cudaStream_t);
template <> cudaError_t launch_step<Rule::AdEMAMix>(const Chunk&, const Args&, ElemType, int, int, int, int, int64_t, cudaStream_t);
template <> cudaError_t launch_step<Rule::LAMB>(const Chunk&, const Args&, ElemType, int, int, int, int, int64_t, cudaStream_t);

namespace {

struct Scalars {
  StepConfig config;
  const void* lr;
  bool lr_is_double;
  const double* grad_sumsq;
  double max_grad_norm;
  const float* grad_scale;
  const double* lamb_norms;
  uint64_t seed;
  bool write_counters;
};

// The prologue's view of a run of parameters: only what it reads of each. The driver copies a
// launch's parameters at every launch; the step's whole descriptors (a Chunk, 25 KB for 200
// parameters) made the prologues half of a step's launch bytes, and with 16 bytes a parameter one
// launch covers five chunks' parameters.
constexpr int kPrologueParams = 5 * kChunk;
struct PrologueChunk {
  int64_t* counters[kPrologueParams];
  int64_t rng_key[kPrologueParams];
  int64_t first_param;  // index of counters[0]'s parameter in the launch group (scratch)
  int count;
};
static_assert(sizeof(PrologueChunk) <= sizeof(Chunk), "a prologue's parameters fit where a step's do");

// One thread per parameter: step t = counters[0] + 1 and what derives from it.
__global__ void prologue_kernel(const LOWBIT_GRID_CONSTANT PrologueChunk chunk, const LOWBIT_GRID_CONSTANT Scalars s,
                                const float* found_inf, ParamScalars* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= chunk.count || (found_inf && *found_inf != 0.0f)) return;
  int64_t* const counters = chunk.counters[i];
  const int64_t t = counters[0] + 1;
  const double lr = s.lr_is_double ? *static_cast<const double*>(s.lr) : static_cast<double>(*static_cast<const float*>(s.lr));
  ParamScalars ps;
  ps.hyper = derive_hyper(s.config, t, lr);
  ps.seed = step_seed(s.seed, t, chunk.rng_key[i]);
  ps.grad_mult = grad_multiplier(s.grad_sumsq ? s.max_grad_norm : 0.0, s.grad_sumsq ? *s.grad_sumsq : 0.0,
                                 s.grad_scale ? static_cast<double>(*s.grad_scale) : 1.0);
  // maximize's sign flip joins the multiplier (-(g * m) == g * -m exactly), so the kernels do one
  // multiply per gradient and no branch.
  if (ps.hyper.maximize) ps.grad_mult = -ps.grad_mult;
  ps.hyper.maximize = false;
  ps.pad = 0;
  const int64_t g = chunk.first_param + i;
  if (s.lamb_norms) ps.hyper.trust = lamb_trust(s.lamb_norms[2 * g], s.lamb_norms[2 * g + 1]);
  out[g] = ps;
  if (s.write_counters) counters[0] = t;
}

// One thread block per parameter: its norm blocks' sums added in LAMB's order
// (lamb_add_block_sums), into the trust ratio or out. Each thread adds one group of kLambSumGroup
// blocks' sums in block order (kTrustLoads loads in flight; the two sums are two chains), the
// groups of a round of kTrustThreads go to shared memory, and thread 0 adds them in group order
// while the next round's groups are being summed (double buffer). One chain through every block,
// as before the groups, took one add's latency per block: 1.9 ms for the 2^18 blocks of a
// 2^24-element parameter with blocks of 64 (H100).
constexpr int kTrustThreads = 256, kTrustLoads = 16;

__device__ __forceinline__ double2 lamb_group_sum(const double2* sums, int64_t b, int64_t end) {
  double sp = 0.0, sr = 0.0;
  for (; b + kTrustLoads <= end; b += kTrustLoads) {
    double2 x[kTrustLoads];
#pragma unroll
    for (int k = 0; k < kTrustLoads; ++k) x[k] = sums[b + k];
#pragma unroll
    for (int k = 0; k < kTrustLoads; ++k) {
      sp += x[k].x;
      sr += x[k].y;
    }
  }
  for (; b < end; ++b) {
    const double2 x = sums[b];
    sp += x.x;
    sr += x.y;
  }
  return make_double2(sp, sr);
}

// A parameter's sums of p^2 and r^2 over its norm blocks [first, last) in LAMB's order, in thread 0
// (the others return zeros). Every thread of the block calls it: it synchronizes.
__device__ double2 lamb_param_sums(const double2* sums, int64_t first, int64_t last) {
  __shared__ double2 groups[2][kTrustThreads];  // two buffers: thread 0 reads one while the others fill the other
  const int64_t num_groups = (last - first + kLambSumGroup - 1) / kLambSumGroup;
  double sp = 0.0, sr = 0.0;
  int buf = 0;
  for (int64_t round = 0; round < num_groups; round += kTrustThreads, buf ^= 1) {
    const int64_t q = round + threadIdx.x;
    const int64_t b = first + q * kLambSumGroup;
    groups[buf][threadIdx.x] =
        q < num_groups ? lamb_group_sum(sums, b, b + kLambSumGroup < last ? b + kLambSumGroup : last) : make_double2(0.0, 0.0);
    // The round is whole; and thread 0 is done with the other buffer (read a round ago, before it
    // reached this barrier), which the next round fills.
    __syncthreads();
    if (threadIdx.x == 0) {
      const int n = num_groups - round < kTrustThreads ? static_cast<int>(num_groups - round) : kTrustThreads;
      const double2* t = groups[buf];
#pragma unroll 8
      for (int k = 0; k < n; ++k) {
        sp += t[k].x;
        sr += t[k].y;
      }
    }
  }
  return make_double2(sp, sr);
}

__global__ void __launch_bounds__(kTrustThreads) lamb_trust_kernel(const LOWBIT_GRID_CONSTANT Chunk chunk,
                                                                   const double* block_sums, const float* found_inf,
                                                                   ParamScalars* scalars, double* out) {
  const int i = blockIdx.x;
  if (found_inf && *found_inf != 0.0f) return;  // the same for the whole thread block
  // Block b of block_sums: (sum of p^2, sum of r^2).
  const double2 s = lamb_param_sums(reinterpret_cast<const double2*>(block_sums), chunk.first_block[i],
                                    chunk.first_block[i + 1]);
  if (threadIdx.x != 0) return;
  const int64_t g = chunk.first_param + i;
  if (out) {
    out[2 * g] = s.x;
    out[2 * g + 1] = s.y;
  } else {
    scalars[g].hyper.trust = lamb_trust(s.x, s.y);
  }
}

// lamb_add_block_sums_gpu: up to kSumRanges ranges of block sums per launch, one thread block each.
constexpr int kSumRanges = 128;
struct SumRanges {
  int64_t first[kSumRanges], count[kSumRanges];
};

__global__ void __launch_bounds__(kTrustThreads) lamb_add_block_sums_kernel(const LOWBIT_GRID_CONSTANT SumRanges r,
                                                                            const double* block_sums, double* out) {
  const int i = blockIdx.x;
  const double2 s =
      lamb_param_sums(reinterpret_cast<const double2*>(block_sums), r.first[i], r.first[i] + r.count[i]);
  if (threadIdx.x != 0) return;
  out[2 * i] = s.x;
  out[2 * i + 1] = s.y;
}

cudaError_t launch_lamb_trust(const Chunk& c, const Args& a, const float* found_inf, double* out, cudaStream_t stream) {
  lamb_trust_kernel<<<c.count, kTrustThreads, 0, stream>>>(c, a.block_sums, found_inf, a.scalars, out);
  return cudaGetLastError();
}

template <typename T, int FAMILY, int WARP>
cudaError_t launch_lamb_sums_typed(const Chunk& c, const Args& a, int64_t wanted, cudaStream_t stream) {
  constexpr auto kernel = lamb_sums_kernel<T, FAMILY, WARP>;
  kernel<<<wave_grid<kernel>(wanted), kThreads, 0, stream>>>(c, a);
  return cudaGetLastError();
}

template <typename T, int WARP>
cudaError_t launch_lamb_sums_warp(const Chunk& c, const Args& a, int family, int64_t wanted, cudaStream_t stream) {
  switch (family) {
    case kF32: return launch_lamb_sums_typed<T, kF32, WARP>(c, a, wanted, stream);
    case kBF16: return launch_lamb_sums_typed<T, kBF16, WARP>(c, a, wanted, stream);
    case kCodes8: return launch_lamb_sums_typed<T, kCodes8, WARP>(c, a, wanted, stream);
    case kCodes4: return launch_lamb_sums_typed<T, kCodes4, WARP>(c, a, wanted, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_lamb_sums(const Chunk& c, const Args& a, int family, int warp, int64_t wanted, cudaStream_t stream) {
#define LOWBIT_LAMB_SUMS_WARP(W) \
  if (warp == W) return launch_lamb_sums_warp<T, W>(c, a, family, wanted, stream);
  LOWBIT_FOR_EACH_WARP_SIZE(LOWBIT_LAMB_SUMS_WARP)
#undef LOWBIT_LAMB_SUMS_WARP
  return cudaErrorInvalidValue;
}

// The Companions a chunk's kernel fixes (step_args.cuh): for bf16 parameters whose
// gradients are all bf16, the one way the step stores them; else kAnyCompanions.
int companions_of(const Chunk& c, const Args& a, ElemType param_type) {
  if (param_type != ElemType::BF16) return kAnyCompanions;
  for (int i = 0; i < c.count; ++i)
    if (c.p[i].grad_type != ElemType::BF16) return kAnyCompanions;
  if (a.correction_bits == 16) return kMaster32;
  if (a.correction_bits == 8) return kMaster24;
  return a.stochastic_round ? kStochastic : kNearest;
}

cudaError_t launch_rule(Rule r, const Chunk& c, const Args& a, ElemType t, int family, int warp, int64_t wanted,
                        cudaStream_t stream) {
  const int ns = carried_slots(r, a.used_mask);
  const int cs = companions_of(c, a, t);
  switch (r) {
    case Rule::Adam: return launch_step<Rule::Adam>(c, a, t, family, warp, ns, cs, wanted, stream);
    case Rule::AdamW: return launch_step<Rule::AdamW>(c, a, t, family, warp, ns, cs, wanted, stream);
    case Rule::SGD: return launch_step<Rule::SGD>(c, a, t, family, warp, ns, cs, wanted, stream);
    case Rule::Lion: return launch_step<Rule::Lion>(c, a, t, family, warp, ns, cs, wanted, stream);
    case Rule::RMSprop: return launch_step<Rule::RMSprop>(c, a, t, family, warp, ns, cs, wanted, stream);
    case Rule::Adagrad: return launch_step<Rule::Adagrad>(c, a, t, family, warp, ns, cs, wanted, stream);
    case Rule::AdEMAMix: return launch_step<Rule::AdEMAMix>(c, a, t, family, warp, ns, cs, wanted, stream);
    case Rule::LAMB: return launch_step<Rule::LAMB>(c, a, t, family, warp, ns, cs, wanted, stream);
  }
  return cudaErrorInvalidValue;
}

// What a launch group needs besides its parameters: the state family, the tables, the scratch.
struct Plan {
  Args args;
  int family = kF32;
  int warp = 32;
  int64_t unit = 256;
};

const char* make_plan(const StepLaunch& s, cudaStream_t stream, Plan* plan) {
  DeviceInfo dev;
  cudaError_t e = query_device(&dev);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  plan->warp = dev.warp_size;
  Args& a = plan->args;
  a = Args{};
  a.config = s.config;
  a.block_size = s.block_size;
  a.block_shift = 0;
  while ((int64_t(1) << a.block_shift) < s.block_size) ++a.block_shift;
  a.found_inf = s.found_inf;
  a.stochastic_round = s.stochastic_round;
  a.nonneg_mask = Tuning::nonneg_skip ? nonneg_update_slots(s.config) : 0;
  const SlotStorage corr = s.num_slots > kCorrectionSlot ? s.slots[kCorrectionSlot].storage : SlotStorage::None;
  a.correction_bits = corr == SlotStorage::Int16 ? 16 : (corr == SlotStorage::Int8 ? 8 : 0);
  if (a.correction_bits != 0 && s.param_type != ElemType::BF16) return "a master-weight correction needs bf16 parameters";
  int family = -1;
  for (int k = 0; k < s.num_slots && k < kMomentSlots; ++k) {
    const SlotType& t = s.slots[k];
    if (t.storage == SlotStorage::None) continue;
    const int f = t.storage == SlotStorage::F32    ? kF32
                  : t.storage == SlotStorage::BF16 ? kBF16
                  : format_bits(t.format) == 8      ? kCodes8
                                                    : kCodes4;
    if (family >= 0 && f != family) return "every slot of a GPU step must be stored the same way";
    family = f;
    a.used_mask |= 1 << k;
    if (t.storage != SlotStorage::Quant) continue;
    if (format_is_signed(t.format)) a.slot_signed_mask |= 1 << k;
    // The format's staged table: one already staged, or one more (at most two per layout).
    const DeviceFormat* df = nullptr;
    e = device_format(t.format, stream, &df);
    if (e == cudaErrorStreamCaptureUnsupported)
      return "the quantization tables are made by a device's first step: run one step before capturing a graph";
    if (e != cudaSuccess) return cudaGetErrorString(e);
    int found = -1;
    for (int q = 0; q < a.num_distinct; ++q)
      if (a.distinct[q] == df) found = q;
    if (found < 0) {
      if (a.num_distinct == 2) return "a GPU step takes at most two quantization formats";
      a.distinct[a.num_distinct] = df;
      found = a.num_distinct++;
    }
    a.format_of_slot[k] = found;
  }
  plan->family = family < 0 ? kF32 : family;
  const bool quant = is_quant_family(plan->family);
  plan->unit = quant ? std::max<int64_t>(s.block_size, 8 * plan->warp) : 8 * plan->warp;
  a.unit = plan->unit;
  a.scalars = static_cast<ParamScalars*>(s.scratch);
  const size_t head = (sizeof(ParamScalars) * static_cast<size_t>(s.n) + 255) / 256 * 256;
  a.block_sums = reinterpret_cast<double*>(static_cast<char*>(s.scratch) + head);
  return nullptr;
}

// Fills chunk from parameters [first, first + count).
void fill_chunk(const StepLaunch& s, const Plan& plan, int64_t first, Chunk* c) {
  c->count = static_cast<int>(std::min<int64_t>(kChunk, s.n - first));
  c->first_param = first;
  c->first_unit[0] = c->first_block[0] = 0;
  for (int i = 0; i < c->count; ++i) {
    c->p[i] = s.params[first + i];
    const int64_t numel = c->p[i].numel;
    c->first_unit[i + 1] = c->first_unit[i] + (numel + plan.unit - 1) / plan.unit;
    c->first_block[i + 1] = c->first_block[i] + (numel + s.block_size - 1) / s.block_size;
  }
}

// Blocks a launch has work for (wave_grid caps them at one wave).
int64_t blocks_for(int64_t work, int per_block) { return (work + per_block - 1) / per_block; }

// Fills a prologue's chunk from parameters [first, first + count) and launches it.
cudaError_t launch_prologue(const StepLaunch& s, int64_t first, int64_t count, const Scalars& sc, const Args& a,
                            cudaStream_t stream) {
  PrologueChunk c;
  c.first_param = first;
  c.count = static_cast<int>(count);
  for (int i = 0; i < c.count; ++i) {
    c.counters[i] = s.params[first + i].counters;
    c.rng_key[i] = s.params[first + i].rng_key;
  }
  prologue_kernel<<<(c.count + 127) / 128, 128, 0, stream>>>(c, sc, s.found_inf, a.scalars);
  return cudaGetLastError();
}

// A second stream per device and host thread, with the two events that fork it from a launch's
// stream and join it back (thread_local: two host threads stepping at once each fork their own).
// Never destroyed: one per thread that steps, and CUDA may be torn down before thread exit.
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};
constexpr int kMaxDevices = 64;

cudaError_t side_stream(SideStream** out) {
  thread_local SideStream side[kMaxDevices];
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 0 || dev >= kMaxDevices) return cudaErrorInvalidValue;
  SideStream& x = side[dev];
  if (!x.stream) {
    if ((e = cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking)) != cudaSuccess) return e;
    if ((e = cudaEventCreateWithFlags(&x.fork, cudaEventDisableTiming)) != cudaSuccess) return e;
    if ((e = cudaEventCreateWithFlags(&x.join, cudaEventDisableTiming)) != cudaSuccess) return e;
  }
  *out = &x;
  return cudaSuccess;
}

const char* run(const StepLaunch& s, cudaStream_t stream, double* lamb_out) {
  if (s.n == 0) return nullptr;
  Plan plan;
  if (const char* err = make_plan(s, stream, &plan)) return err;
  Args& a = plan.args;
  Scalars sc{s.config, s.lr, s.lr_is_double, s.grad_sumsq, s.max_grad_norm, s.grad_scale, s.lamb_norms, s.seed,
             lamb_out == nullptr};
  const bool lamb_pass = s.config.rule == Rule::LAMB && (lamb_out != nullptr || s.lamb_norms == nullptr);
  if (lamb_out) sc.lamb_norms = nullptr;
  Chunk chunk;
  // Every chunk's per-step values first (each parameter has its own scratch entry), so the step
  // kernels then run back to back: a small prologue between two large launches costs a drain
  // and a refill of the device per chunk. LAMB's chunks share their norm scratch: one at a time.
  if (!lamb_pass) {
    for (int64_t first = 0; first < s.n; first += kPrologueParams) {
      const cudaError_t e = launch_prologue(s, first, std::min<int64_t>(kPrologueParams, s.n - first), sc, a, stream);
      if (e != cudaSuccess) return cudaGetErrorString(e);
    }
  }
  // The step kernels of a launch group's chunks take turns on two streams: each fills one wave of
  // the device, and while its last blocks finish, the next chunk's kernel starts on the SMs they
  // leave. Chunks write disjoint memory, so the order between them changes no bit. LAMB's chunks
  // share their norm scratch and stay on one stream. Under stream capture, fork and join are edges.
  SideStream* side = nullptr;
  if (!lamb_pass && s.n > kChunk) {
    cudaError_t e = side_stream(&side);
    if (e == cudaSuccess) e = cudaEventRecord(side->fork, stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(side->stream, side->fork, 0);
    if (e != cudaSuccess) return cudaGetErrorString(e);
  }
  // The side stream's work joins the launch's stream whatever happens next (an unjoined fork would
  // also end a stream capture with an error).
  const auto join = [&]() -> cudaError_t {
    if (!side) return cudaSuccess;
    cudaError_t e = cudaEventRecord(side->join, side->stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, side->join, 0);
    side = nullptr;
    return e;
  };
  for (int64_t first = 0; first < s.n; first += kChunk) {
    fill_chunk(s, plan, first, &chunk);
    cudaError_t e = cudaSuccess;
    const cudaStream_t on = side && (first / kChunk) % 2 == 1 ? side->stream : stream;
    if (lamb_pass) {
      e = launch_prologue(s, first, chunk.count, sc, a, stream);
      if (e != cudaSuccess) return cudaGetErrorString(e);
      const int64_t wanted = blocks_for(chunk.first_block[chunk.count], kThreads / plan.warp);
      switch (s.param_type) {
        case ElemType::F32: e = launch_lamb_sums<float>(chunk, a, plan.family, plan.warp, wanted, stream); break;
        case ElemType::BF16: e = launch_lamb_sums<bf16_t>(chunk, a, plan.family, plan.warp, wanted, stream); break;
        case ElemType::F16: e = launch_lamb_sums<f16_t>(chunk, a, plan.family, plan.warp, wanted, stream); break;
      }
      if (e != cudaSuccess) return cudaGetErrorString(e);
      e = launch_lamb_trust(chunk, a, s.found_inf, lamb_out, stream);
      if (e != cudaSuccess) return cudaGetErrorString(e);
    }
    if (lamb_out) continue;
    const int64_t wanted = blocks_for(chunk.first_unit[chunk.count], kThreads / plan.warp);
    e = launch_rule(s.config.rule, chunk, a, s.param_type, plan.family, plan.warp, wanted, on);
    if (e != cudaSuccess) {
      (void)join();  // the launch's own error is the one to report
      return cudaGetErrorString(e);
    }
  }
  const cudaError_t e = join();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace
}  // namespace gpu_step

size_t gpu_step_scratch_bytes(const StepLaunch& s) {
  const size_t head = (sizeof(gpu_step::ParamScalars) * static_cast<size_t>(s.n) + 255) / 256 * 256;
  int64_t blocks = 0;
  if (s.config.rule == Rule::LAMB) {
    // Per chunk, reused by the next: the most norm blocks any chunk holds.
    for (int64_t first = 0; first < s.n; first += gpu_step::kChunk) {
      int64_t b = 0;
      for (int64_t i = first; i < std::min<int64_t>(s.n, first + gpu_step::kChunk); ++i)
        b += (s.params[i].numel + s.block_size - 1) / s.block_size;
      blocks = std::max(blocks, b);
    }
  }
  return head + static_cast<size_t>(blocks) * 2 * sizeof(double) + 16;
}

const char* optim_step_gpu(const StepLaunch& s, void* stream) {
  return gpu_step::run(s, static_cast<cudaStream_t>(stream), nullptr);
}

const char* lamb_norms_gpu(const StepLaunch& s, double* out, void* stream) {
  if (s.config.rule != Rule::LAMB) return "lamb_norms_gpu needs the LAMB rule";
  return gpu_step::run(s, static_cast<cudaStream_t>(stream), out);
}

const char* lamb_add_block_sums_gpu(const double* block_sums, const int64_t* first, const int64_t* count, int64_t n,
                                    double* out, void* stream) {
  for (int64_t done = 0; done < n; done += gpu_step::kSumRanges) {
    gpu_step::SumRanges r;
    const int k = static_cast<int>(std::min<int64_t>(n - done, gpu_step::kSumRanges));
    for (int i = 0; i < k; ++i) {
      r.first[i] = first[done + i];
      r.count[i] = count[done + i];
    }
    gpu_step::lamb_add_block_sums_kernel<<<k, gpu_step::kTrustThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        r, block_sums, out + 2 * done);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return cudaGetErrorString(e);
  }
  return nullptr;
}

namespace gpu_step {
namespace {
__global__ void speculative_arith_kernel(const float* a, const float* b, int64_t n, float* quotient, float* root,
                                         float* reciprocal, uint8_t* ok) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    SpeculativeArith d, r;
    quotient[i] = d.div(a[i], b[i]);
    root[i] = r.sqrt(a[i]);
#if defined(__CUDA_ARCH__) && !defined(__HIPCC__)
    reciprocal[i] = short_rcp(a[i]);
    const bool rcp_ok = short_rcp_exact(a[i]);
#else
    reciprocal[i] = 1.0f / a[i];
    const bool rcp_ok = true;
#endif
    ok[i] = static_cast<uint8_t>((d.ok ? 1 : 0) | (r.ok ? 2 : 0) | (rcp_ok ? 4 : 0));
  }
}
}  // namespace
}  // namespace gpu_step

const char* speculative_arith_gpu(const float* a, const float* b, int64_t n, float* quotient, float* root,
                                  float* reciprocal, uint8_t* ok, void* stream) {
  if (n <= 0) return nullptr;
  const int grid = static_cast<int>(std::min<int64_t>((n + 255) / 256, 65536));
  gpu_step::speculative_arith_kernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(a, b, n, quotient, root,
                                                                                          reciprocal, ok);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace kernels
}  // namespace lowbit
