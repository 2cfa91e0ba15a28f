// nccl_probe (under mpirun, one GPU a rank; no torch): NCCL's collectives over the sharded step's
// bytes, three ways, each alone and beside a memory-bound kernel standing in for backward:
//   plain     buffers from cudaMalloc, the communicator as NCCL configures it;
//   window    the same on buffers from ncclMemAlloc registered as symmetric windows
//             (ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC): NCCL's symmetric kernels;
//   ce        windows on a communicator with CTAPolicy = NCCL_CTA_POLICY_ZERO: all-gather and
//             all-to-all on the copy engines, no SM taken (NCCL 2.28: one node, NVLink, driver >= 12.5).
// A reduce-scatter can also be made of an all-to-all and the owner's sum (one kernel): on the copy
// engines it leaves backward every SM but that sum's. Issue 38: the question is which of these
// gives the overlapped reduce-scatter its bandwidth without slowing backward, before any of it
// goes into NcclCommunicator. Medians of REPS, CUDA events on rank 0's streams.
//   mpirun -np 2 nccl_probe [ELEMENTS_PER_RANK=134217728] [REPS=10]
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#define CUDA_OK(x)                                                                                \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "nccl_probe: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                               \
    }                                                                                             \
  } while (0)
#define NCCL_OK(x)                                                                                \
  do {                                                                                            \
    ncclResult_t r_ = (x);                                                                        \
    if (r_ != ncclSuccess) {                                                                      \
      std::fprintf(stderr, "nccl_probe: %s: %s (line %d)\n", #x, ncclGetErrorString(r_), __LINE__); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                               \
    }                                                                                             \
  } while (0)

namespace {

// Backward's stand-in: y = a * x + y over a large buffer, pure memory traffic on every SM.
__global__ void triad(float* y, const float* x, size_t n, float a) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    y[i] = a * x[i] + y[i];
}

// The owner's sum of an all-to-all's chunks: out = sum over ranks of in[r * chunk ...].
__global__ void sum_chunks(float* out, const float* in, size_t chunk, int ranks) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < chunk; i += size_t(gridDim.x) * blockDim.x) {
    float s = in[i];
    for (int r = 1; r < ranks; ++r) s += in[r * chunk + i];
    out[i] = s;
  }
}

struct Buffers {
  float *whole = nullptr, *shard = nullptr, *received = nullptr;  // n * chunk, chunk, n * chunk
  std::vector<ncclWindow_t> windows;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const size_t per_rank = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t{134217728};
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  const size_t chunk = per_rank / n, whole = chunk * n;
  int devices = 0;
  CUDA_OK(cudaGetDeviceCount(&devices));
  CUDA_OK(cudaSetDevice(rank % devices));

  ncclUniqueId id;
  if (rank == 0) NCCL_OK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t plain_comm, ce_comm;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  NCCL_OK(ncclCommInitRankConfig(&plain_comm, n, id, rank, &config));
  ncclConfig_t ce_config = NCCL_CONFIG_INITIALIZER;
  ce_config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
  NCCL_OK(ncclCommSplit(plain_comm, 0, rank, &ce_comm, &ce_config));

  cudaStream_t s1, s2;
  CUDA_OK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  Buffers plain, sym;
  CUDA_OK(cudaMalloc(&plain.whole, whole * 4));
  CUDA_OK(cudaMalloc(&plain.shard, chunk * 4));
  CUDA_OK(cudaMalloc(&plain.received, whole * 4));
  NCCL_OK(ncclMemAlloc(reinterpret_cast<void**>(&sym.whole), whole * 4));
  NCCL_OK(ncclMemAlloc(reinterpret_cast<void**>(&sym.shard), chunk * 4));
  NCCL_OK(ncclMemAlloc(reinterpret_cast<void**>(&sym.received), whole * 4));
  for (ncclComm_t c : {plain_comm, ce_comm})
    for (std::pair<float*, size_t> b : {std::make_pair(sym.whole, whole), std::make_pair(sym.shard, chunk),
                                        std::make_pair(sym.received, whole)}) {
      ncclWindow_t w;
      NCCL_OK(ncclCommWindowRegister(c, b.first, b.second * 4, &w, NCCL_WIN_COLL_SYMMETRIC));
      sym.windows.push_back(w);
    }
  CUDA_OK(cudaMemset(plain.whole, 0, whole * 4));
  CUDA_OK(cudaMemset(sym.whole, 0, whole * 4));
  // Backward's stand-in: 2 x 256M floats (2 GiB), one triad pass ~3 GB of traffic.
  const size_t bg_n = size_t{1} << 28;
  float *bx, *by;
  CUDA_OK(cudaMalloc(&bx, bg_n * 4));
  CUDA_OK(cudaMalloc(&by, bg_n * 4));
  CUDA_OK(cudaMemset(bx, 0, bg_n * 4));
  CUDA_OK(cudaMemset(by, 0, bg_n * 4));
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, rank % devices));
  const int bg_passes = 4;
  const auto background = [&](cudaStream_t s) {
    for (int k = 0; k < bg_passes; ++k) triad<<<sms * 8, 256, 0, s>>>(by, bx, bg_n, 0.5f);
  };

  using Op = std::function<void(cudaStream_t)>;
  const auto rs = [&](ncclComm_t c, Buffers& b) -> Op {
    return [&, c](cudaStream_t s) { NCCL_OK(ncclReduceScatter(b.whole, b.shard, chunk, ncclFloat, ncclSum, c, s)); };
  };
  const auto ag = [&](ncclComm_t c, Buffers& b) -> Op {
    return [&, c](cudaStream_t s) { NCCL_OK(ncclAllGather(b.shard, b.whole, chunk, ncclFloat, c, s)); };
  };
  const auto ar = [&](ncclComm_t c, Buffers& b) -> Op {
    return [&, c](cudaStream_t s) { NCCL_OK(ncclAllReduce(b.whole, b.whole, whole, ncclFloat, ncclSum, c, s)); };
  };
  const auto a2a = [&](ncclComm_t c, Buffers& b) -> Op {
    return [&, c](cudaStream_t s) {
      NCCL_OK(ncclAlltoAll(b.whole, b.received, chunk, ncclFloat, c, s));
    };
  };
  const auto a2a_sum = [&](ncclComm_t c, Buffers& b) -> Op {  // a reduce-scatter made of both
    return [&, c](cudaStream_t s) {
      NCCL_OK(ncclAlltoAll(b.whole, b.received, chunk, ncclFloat, c, s));
      sum_chunks<<<sms * 4, 256, 0, s>>>(b.shard, b.received, chunk, n);
    };
  };

  cudaEvent_t e0, e1, e2;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  CUDA_OK(cudaEventCreate(&e2));
  // Alone: the op on s1. Beside: the background on s2 from the same start; returns (op end, both end).
  const auto time_alone = [&](const Op& op) {
    op(s1);
    CUDA_OK(cudaStreamSynchronize(s1));
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      CUDA_OK(cudaEventRecord(e0, s1));
      op(s1);
      CUDA_OK(cudaEventRecord(e1, s1));
      CUDA_OK(cudaEventSynchronize(e1));
      float t = 0;
      CUDA_OK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    return median(ms);
  };
  const auto time_beside = [&](const Op& op, double* op_end, double* bg_end) {
    std::vector<double> a, b;
    for (int r = 0; r < reps; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      CUDA_OK(cudaEventRecord(e0, s1));
      CUDA_OK(cudaStreamWaitEvent(s2, e0, 0));
      background(s2);
      op(s1);
      CUDA_OK(cudaEventRecord(e1, s1));
      CUDA_OK(cudaEventRecord(e2, s2));
      CUDA_OK(cudaEventSynchronize(e1));
      CUDA_OK(cudaEventSynchronize(e2));
      float t1 = 0, t2 = 0;
      CUDA_OK(cudaEventElapsedTime(&t1, e0, e1));
      CUDA_OK(cudaEventElapsedTime(&t2, e0, e2));
      a.push_back(t1);
      b.push_back(t2);
    }
    *op_end = median(a);
    *bg_end = median(b);
  };

  const double bg_ms = time_alone([&](cudaStream_t s) { background(s); });
  const double gb = whole * 4.0 * (n - 1) / n / 1e9;  // bytes each rank moves in RS / AG / a2a
  struct Row {
    std::string what;
    Op op;
    double busbw_factor;  // of gb: 1 for RS / AG / a2a, 2 for all-reduce
  };
  const std::vector<Row> rows = {
      {"reduce_scatter   plain", rs(plain_comm, plain), 1},
      {"reduce_scatter   window", rs(plain_comm, sym), 1},
      {"reduce_scatter   ce", rs(ce_comm, sym), 1},
      {"all_gather       plain", ag(plain_comm, plain), 1},
      {"all_gather       window", ag(plain_comm, sym), 1},
      {"all_gather       ce", ag(ce_comm, sym), 1},
      {"all_reduce       plain", ar(plain_comm, plain), 2},
      {"all_reduce       window", ar(plain_comm, sym), 2},
      {"all_to_all       plain", a2a(plain_comm, plain), 1},
      {"all_to_all       window", a2a(plain_comm, sym), 1},
      {"all_to_all       ce", a2a(ce_comm, sym), 1},
      {"a2a + sum (= rs) plain", a2a_sum(plain_comm, plain), 1},
      {"a2a + sum (= rs) window", a2a_sum(plain_comm, sym), 1},
      {"a2a + sum (= rs) ce", a2a_sum(ce_comm, sym), 1},
  };
  if (rank == 0) {
    int version = 0;
    ncclGetVersion(&version);
    std::printf("nccl_probe: %d ranks, NCCL %d, %zu floats per rank (%.3f GB moved per rank per RS/AG), %d reps\n", n,
                version, whole, gb, reps);
    std::printf("  background alone (backward's stand-in, %d triad passes over 2 x 1 GiB): %.3f ms\n", bg_passes, bg_ms);
    std::printf("  %-24s %9s %9s   %-34s\n", "collective", "alone ms", "busbw", "beside the background: op end / background end (ms)");
  }
  for (const Row& row : rows) {
    const double alone = time_alone(row.op);
    double op_end = 0, bg_end = 0;
    time_beside(row.op, &op_end, &bg_end);
    if (rank == 0)
      std::printf("  %-24s %9.3f %9.1f   %9.3f / %9.3f   (background +%.3f ms, op +%.3f ms)\n", row.what.c_str(), alone,
                  gb * row.busbw_factor / (alone * 1e-3), op_end, bg_end, bg_end - bg_ms, op_end - alone);
  }
  // The overlap as the sharded optimizer makes it: backward's stand-in in `buckets` pieces on s2, and
  // after each piece that bucket's reduce-scatter on s1 (waiting for the piece); the time from the
  // start until both streams are done, against max(background, reduce-scatters alone). Per row.
  const int buckets = 32;
  const size_t bucket = chunk / buckets;  // elements of each rank's chunk per bucket
  std::vector<cudaEvent_t> ready(buckets);
  for (auto& e : ready) CUDA_OK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const auto bucket_rs = [&](int how, int b, cudaStream_t s) {  // 0 plain, 1 window, 2 ce a2a + sum
    Buffers& buf = how == 0 ? plain : sym;
    ncclComm_t c = how == 2 ? ce_comm : plain_comm;
    // Bucket b: the b-th slice of every rank's chunk; a strided layout as a flat buffer per bucket
    // would have, here slice b of `whole` laid out as n pieces of `bucket` elements.
    float* in = buf.whole + size_t(b) * bucket * n;
    float* out = buf.shard + size_t(b) * bucket;
    if (how < 2) {
      NCCL_OK(ncclReduceScatter(in, out, bucket, ncclFloat, ncclSum, c, s));
    } else {
      float* rec = buf.received + size_t(b) * bucket * n;
      NCCL_OK(ncclAlltoAll(in, rec, bucket, ncclFloat, c, s));
      sum_chunks<<<sms, 256, 0, s>>>(out, rec, bucket, n);
    }
  };
  const auto piece = [&](int b) {  // backward's stand-in, piece b: bg_passes triads over 1/buckets of it
    const size_t m = bg_n / buckets;
    for (int k = 0; k < bg_passes; ++k) triad<<<sms * 8, 256, 0, s2>>>(by + b * m, bx + b * m, m, 0.5f);
  };
  const auto overlap = [&](int how, double* total, double* rs_only, double* bg_only) {
    std::vector<double> t, r, g;
    for (int rep = 0; rep < reps + 1; ++rep) {
      // Reduce-scatters alone, then the background alone in pieces, then both.
      MPI_Barrier(MPI_COMM_WORLD);
      CUDA_OK(cudaEventRecord(e0, s1));
      for (int b = 0; b < buckets; ++b) bucket_rs(how, b, s1);
      CUDA_OK(cudaEventRecord(e1, s1));
      CUDA_OK(cudaEventSynchronize(e1));
      float rs_ms = 0;
      CUDA_OK(cudaEventElapsedTime(&rs_ms, e0, e1));
      CUDA_OK(cudaEventRecord(e0, s2));
      for (int b = 0; b < buckets; ++b)
        piece(b);
      CUDA_OK(cudaEventRecord(e2, s2));
      CUDA_OK(cudaEventSynchronize(e2));
      float bg = 0;
      CUDA_OK(cudaEventElapsedTime(&bg, e0, e2));
      MPI_Barrier(MPI_COMM_WORLD);
      CUDA_OK(cudaEventRecord(e0, s2));
      for (int b = 0; b < buckets; ++b) {
        piece(b);
        CUDA_OK(cudaEventRecord(ready[b], s2));
        CUDA_OK(cudaStreamWaitEvent(s1, ready[b], 0));
        bucket_rs(how, b, s1);
      }
      CUDA_OK(cudaEventRecord(e1, s1));
      CUDA_OK(cudaEventSynchronize(e1));
      float both = 0;
      CUDA_OK(cudaEventElapsedTime(&both, e0, e1));
      if (rep == 0) continue;  // warm-up
      t.push_back(both);
      r.push_back(rs_ms);
      g.push_back(bg);
    }
    *total = median(t);
    *rs_only = median(r);
    *bg_only = median(g);
  };
  if (rank == 0)
    std::printf("  overlap: %d buckets, backward's stand-in in %d pieces (%d triad passes), each bucket's reduce-scatter "
                "after its piece\n", buckets, buckets, bg_passes);
  for (int how = 0; how < 3; ++how) {
    double total = 0, rs_only = 0, bg_only = 0;
    overlap(how, &total, &rs_only, &bg_only);
    if (rank == 0)
      std::printf("    %-26s both %8.3f ms   reduce-scatters alone %8.3f   background alone %8.3f   both / max %.2f\n",
                  how == 0 ? "plain reduce_scatter" : how == 1 ? "window reduce_scatter" : "ce all_to_all + sum", total,
                  rs_only, bg_only, total / std::max(rs_only, bg_only));
  }
  for (auto& e : ready) CUDA_OK(cudaEventDestroy(e));
  CUDA_OK(cudaDeviceSynchronize());
  size_t k = 0;
  for (ncclComm_t c : {plain_comm, ce_comm})
    for (int j = 0; j < 3; ++j) NCCL_OK(ncclCommWindowDeregister(c, sym.windows[k++]));
  NCCL_OK(ncclMemFree(sym.whole));
  NCCL_OK(ncclMemFree(sym.shard));
  NCCL_OK(ncclMemFree(sym.received));
  ncclCommDestroy(ce_comm);
  ncclCommDestroy(plain_comm);
  MPI_Finalize();
  return 0;
}
