// bench/step_kernel_probe: the GPU step kernels alone, without torch or the op layer, so that a
// tuning variant (step_probe_tuning.cuh's definitions, e.g. -DLOWBIT_STEP_MIN_BLOCKS=2; CMake's
// LOWBIT_STEP_PROBE_VARIANTS) builds in a minute and runs beside the library's kernels in one device
// call (scripts/gpu_session probe).
// Prints ms per step (median of CUDA-event timings) and % of a device copy of the bytes the step
// moves (p read + written, g read, each state slot read + written; no gradient pre-pass here: the
// full op's numbers come from bench/optim_step_gpu). PROBE_BLOCK=N: another quantization block.
//   step_kernel_probe <state: q8|c8|q4|fp8|f32|bf16> <param: f32|bf16|bf16n|bf16m24|bf16m32> [tensors=64] [numel=16777216] [reps=20]
//                     [rule: adamw|lamb|ademamix]  (LAMB: both passes; bytes counted for one)
// param: bf16 rounds stochastically, bf16n to nearest, bf16m24 / bf16m32 keep an 8-bit / 16-bit
// correction (24-bit / 32-bit master weights).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../kernels/cuda/optim_step_cuda.h"

using namespace lowbit;
using namespace lowbit::kernels;

namespace {

#define PROBE_CHECK(x)                                                                         \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                            \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

void* dev_alloc(size_t bytes) {
  void* p = nullptr;
  PROBE_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  PROBE_CHECK(cudaMemset(p, 0, std::max<size_t>(bytes, 16)));
  return p;
}

// Random-looking values without curand: small gradients, unit parameters.
__global__ void fill_kernel(float* out, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    out[i] = scale * (static_cast<float>(h & 0xFFFFFF) / 8388608.0f - 1.0f);
  }
}

__global__ void to_bf16_kernel(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t u;
    std::memcpy(&u, &in[i], 4);
    out[i] = static_cast<uint16_t>(u >> 16);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename Fn>
double time_ms(Fn fn, int reps) {
  cudaEvent_t a, b;
  PROBE_CHECK(cudaEventCreate(&a));
  PROBE_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    PROBE_CHECK(cudaEventRecord(a));
    fn();
    PROBE_CHECK(cudaEventRecord(b));
    PROBE_CHECK(cudaEventSynchronize(b));
    float t = 0;
    PROBE_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  return median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string state = argc > 1 ? argv[1] : "q8";
  const std::string ptype = argc > 2 ? argv[2] : "f32";
  const int64_t tensors = argc > 3 ? std::atoll(argv[3]) : 64;
  const int64_t numel = argc > 4 ? std::atoll(argv[4]) : 16777216;
  const int reps = argc > 5 ? std::atoi(argv[5]) : 20;
  // bf16m24: bf16 parameters with an 8-bit master-weight correction (24-bit master weights), no
  // stochastic rounding; bf16: stochastic rounding alone; bf16n: rounded to nearest.
  const bool master24 = ptype == "bf16m24", master32 = ptype == "bf16m32";
  const bool bf16_params = ptype == "bf16" || ptype == "bf16n" || master24 || master32;
  const std::string rule = argc > 6 ? argv[6] : "adamw";

  StepLaunch s;
  s.config.rule = rule == "lamb" ? Rule::LAMB : (rule == "ademamix" ? Rule::AdEMAMix : Rule::AdamW);
  s.config.weight_decay = 0.01;
  const int slots = rule == "ademamix" ? 3 : 2;
  s.num_slots = slots;
  double slot_bytes = 4;
  if (state == "q8") {
    s.slots[0] = {SlotStorage::Quant, QuantFormat::Dyn8Signed};
    s.slots[1] = {SlotStorage::Quant, slots == 3 ? QuantFormat::Dyn8Signed : QuantFormat::Dyn8Unsigned};
    s.slots[2] = {SlotStorage::Quant, QuantFormat::Dyn8Unsigned};
    s.block_size = 256;
    slot_bytes = 1 + 4.0 / 256;
  } else if (state == "c8") {
    s.slots[0] = {SlotStorage::Quant, QuantFormat::Pow8Signed};
    s.slots[1] = {SlotStorage::Quant, slots == 3 ? QuantFormat::Pow8Signed : QuantFormat::Pow8Unsigned};
    s.slots[2] = {SlotStorage::Quant, QuantFormat::Pow8Unsigned};
    s.block_size = 64;
    slot_bytes = 1 + 4.0 / 64;
  } else if (state == "q4") {
    s.slots[0] = {SlotStorage::Quant, QuantFormat::DE4Signed};
    s.slots[1] = {SlotStorage::Quant, QuantFormat::Linear4Unsigned};
    s.block_size = 128;
    slot_bytes = 0.5 + 4.0 / 128;
  } else if (state == "fp8") {
    s.slots[0] = {SlotStorage::Quant, QuantFormat::FP8E4M3};
    s.slots[1] = {SlotStorage::Quant, QuantFormat::FP8E4M3};
    s.block_size = 256;
    slot_bytes = 1 + 4.0 / 256;
  } else if (state == "bf16") {
    s.slots[0] = s.slots[1] = {SlotStorage::BF16, QuantFormat::Dyn8Signed};
    s.block_size = 1024;
    slot_bytes = 2;
  } else {
    s.slots[0] = s.slots[1] = {SlotStorage::F32, QuantFormat::Dyn8Signed};
    s.block_size = 1024;
  }
  const bool quant = s.slots[0].storage == SlotStorage::Quant;
  if (quant && std::getenv("PROBE_BLOCK")) {  // another quantization block, e.g. to compare formats at one size
    const int64_t b = std::atoll(std::getenv("PROBE_BLOCK"));
    slot_bytes += 4.0 / b - 4.0 / s.block_size;
    s.block_size = b;
  }
  const bool four_bit = state == "q4";
  s.param_type = bf16_params ? ElemType::BF16 : ElemType::F32;
  s.stochastic_round = ptype == "bf16";
  if (master24 || master32) {
    for (int k = slots; k < kCorrectionSlot; ++k) s.slots[k] = SlotType{};
    s.slots[kCorrectionSlot] = {master32 ? SlotStorage::Int16 : SlotStorage::Int8, QuantFormat::Dyn8Signed};
    s.num_slots = kCorrectionSlot + 1;  // slots between the moments and the correction stay None
  }
  s.seed = 1234;
  double* lr = static_cast<double*>(dev_alloc(8));
  const double lr_host = 1e-3;
  PROBE_CHECK(cudaMemcpy(lr, &lr_host, 8, cudaMemcpyHostToDevice));
  s.lr = lr;
  s.lr_is_double = true;

  const size_t pbytes = bf16_params ? 2 : 4;
  float* staging = static_cast<float*>(dev_alloc(numel * 4));
  std::vector<StepParamRef> params(tensors);
  for (int64_t t = 0; t < tensors; ++t) {
    StepParamRef& P = params[t];
    P.numel = numel;
    P.param = dev_alloc(numel * pbytes);
    P.grad = dev_alloc(numel * pbytes);
    P.grad_type = s.param_type;
    fill_kernel<<<1024, 256>>>(staging, numel, 17 + t, 1.0f);
    if (bf16_params) to_bf16_kernel<<<1024, 256>>>(staging, static_cast<uint16_t*>(P.param), numel);
    else PROBE_CHECK(cudaMemcpy(P.param, staging, numel * 4, cudaMemcpyDeviceToDevice));
    fill_kernel<<<1024, 256>>>(staging, numel, 99 + t, 1e-2f);
    if (bf16_params) to_bf16_kernel<<<1024, 256>>>(staging, static_cast<uint16_t*>(const_cast<void*>(P.grad)), numel);
    else PROBE_CHECK(cudaMemcpy(const_cast<void*>(P.grad), staging, numel * 4, cudaMemcpyDeviceToDevice));
    for (int k = 0; k < slots; ++k) {
      if (quant) {
        P.slot[k] = dev_alloc(four_bit ? (numel + 1) / 2 : numel);
        P.absmax[k] = static_cast<float*>(dev_alloc((numel + s.block_size - 1) / s.block_size * 4));
      } else {
        P.slot[k] = dev_alloc(numel * (state == "bf16" ? 2 : 4));
      }
    }
    if (master24 || master32) P.correction = dev_alloc(numel * (master32 ? 2 : 1));
    P.counters = static_cast<int64_t*>(dev_alloc(16));
    P.rng_key = t;
    P.aligned = 1;
  }
  PROBE_CHECK(cudaDeviceSynchronize());
  s.params = params.data();
  s.n = tensors;
  s.scratch = dev_alloc(gpu_step_scratch_bytes(s));

  const double ms = time_ms([&] {
    const char* err = optim_step_gpu(s, nullptr);
    if (err) {
      std::fprintf(stderr, "optim_step_gpu: %s\n", err);
      std::exit(1);
    }
  }, reps);
  const double bytes_per_param = 3.0 * pbytes + 2 * slots * slot_bytes + (master24 ? 2 : 0) + (master32 ? 4 : 0);
  const double total = bytes_per_param * numel * tensors;
  // A device copy of the same bytes (half read, half written).
  void* a = dev_alloc(static_cast<size_t>(total / 2));
  void* b = dev_alloc(static_cast<size_t>(total / 2));
  const double copy_ms = time_ms([&] { PROBE_CHECK(cudaMemcpyAsync(b, a, static_cast<size_t>(total / 2), cudaMemcpyDeviceToDevice)); }, reps);
  std::printf("%-8s %-4s state, %-4s params, %lld x %lld: %8.3f ms  %7.1f GB/s  %5.1f %% copy (copy %.3f ms)\n",
              rule.c_str(), state.c_str(), ptype.c_str(), static_cast<long long>(tensors), static_cast<long long>(numel), ms,
              total / (ms * 1e6), 100.0 * copy_ms / ms, copy_ms);
  return 0;
}
