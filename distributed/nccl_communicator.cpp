// NcclCommunicator: MPI bootstrap, event-ordered collectives on an own stream, completion polled
// against a timeout with NCCL's asynchronous errors checked, ncclCommAbort on failure.
#include "nccl_communicator.h"

#include <chrono>
#include <cstring>
#include <cstdio>
#include <functional>
#include <thread>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

namespace lowbit {
namespace distributed {

namespace {

constexpr const char* kWho = "NcclCommunicator";

ncclDataType_t nccl_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kByte:
    case at::kBool: return ncclUint8;
    case at::kChar: return ncclInt8;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    default: TORCH_CHECK(false, kWho, ": dtype ", t, " is not supported");
  }
}

// Reductions of bfloat16 / float16 go through float32 (the Communicator's documented rounding, the
// same bits as MpiCommunicator); everything else reduces in its own type.
bool reduces_natively(at::ScalarType t) { return t != at::kHalf && t != at::kBFloat16 && t != at::kBool; }

}  // namespace

struct NcclCommunicator::Impl {
  ncclComm_t comm = nullptr;
  c10::cuda::CUDAStream stream;
  cudaEvent_t ready = nullptr, done = nullptr;
  int rank = 0, size = 1;
  std::string broken;
  explicit Impl(c10::cuda::CUDAStream s) : stream(s) {}
};

NcclCommunicator::NcclCommunicator(std::shared_ptr<MpiCommunicator> bootstrap, int device, NcclOptions options)
    : bootstrap_(std::move(bootstrap)), device_(device), options_(options) {
  TORCH_CHECK(bootstrap_, kWho, ": the MPI bootstrap communicator is null");
  TORCH_CHECK(options.timeout_s > 0, kWho, ": the timeout must be > 0 seconds, got ", options.timeout_s);
  int devices = 0;
  TORCH_CHECK(cudaGetDeviceCount(&devices) == cudaSuccess && device >= 0 && device < devices, kWho, ": device ",
              device, " is not one of the ", devices, " visible CUDA devices");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  impl_ = std::make_unique<Impl>(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(device)));
  impl_->rank = bootstrap_->rank();
  impl_->size = bootstrap_->size();
  TORCH_CHECK(cudaEventCreateWithFlags(&impl_->ready, cudaEventDisableTiming) == cudaSuccess &&
                  cudaEventCreateWithFlags(&impl_->done, cudaEventDisableTiming) == cudaSuccess,
              kWho, ": cudaEventCreate failed");
  // The unique id from rank 0 to all, over MPI (with MPI's timeout).
  ncclUniqueId id;
  at::Tensor id_bytes = at::zeros({static_cast<int64_t>(sizeof(id))}, at::kByte);
  if (impl_->rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    TORCH_CHECK(r == ncclSuccess, kWho, ": ncclGetUniqueId failed: ", ncclGetErrorString(r));
    std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
  }
  bootstrap_->broadcast(id_bytes, 0);
  std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));
  // Non-blocking setup, so that a peer that never arrives is a timeout rather than a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&impl_->comm, impl_->size, id, impl_->rank, &config);
  const auto start = std::chrono::steady_clock::now();
  while (r == ncclInProgress || (r == ncclSuccess && [&] {
           ncclResult_t a = ncclSuccess;
           ncclCommGetAsyncError(impl_->comm, &a);
           r = a;
           return a == ncclInProgress;
         }())) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > options_.timeout_s) {
      ncclCommAbort(impl_->comm);
      impl_->comm = nullptr;
      TORCH_CHECK(false, kWho, ": setting up NCCL did not finish within ", options_.timeout_s, " s on rank ",
                  impl_->rank, " of ", impl_->size);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (r == ncclInProgress) ncclCommGetAsyncError(impl_->comm, &r);
  }
  TORCH_CHECK(r == ncclSuccess, kWho, ": NCCL setup failed on rank ", impl_->rank, " of ", impl_->size, ": ",
              ncclGetErrorString(r));
}

NcclCommunicator::~NcclCommunicator() {
  if (!impl_) return;
  if (impl_->comm) {
    if (impl_->broken.empty())
      ncclCommDestroy(impl_->comm);
    else
      ncclCommAbort(impl_->comm);
  }
  if (impl_->ready) cudaEventDestroy(impl_->ready);
  if (impl_->done) cudaEventDestroy(impl_->done);
}

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::size() const { return impl_->size; }

void NcclCommunicator::fail(const std::string& message) {
  // Abort first: it ends this rank's NCCL kernels, which would otherwise spin on the dead peer.
  if (impl_->comm) ncclCommAbort(impl_->comm);
  impl_->comm = nullptr;
  impl_->broken = message;
  if (options_.abort_on_failure) {
    std::fprintf(stderr, "lowbit: %s; aborting the job\n", message.c_str());
    std::fflush(stderr);
    MPI_Abort(bootstrap_->comm(), 3);
  }
  TORCH_CHECK(false, message);
}

void NcclCommunicator::check_usable(const char* collective) const {
  TORCH_CHECK(impl_->broken.empty(), kWho, ": ", collective, " on a communicator that failed before: ", impl_->broken);
}

void NcclCommunicator::run(const char* collective, int64_t numel, const std::vector<at::Tensor>& tensors,
                           const std::function<int(void*)>& launch) {
  for (const at::Tensor& t : tensors)
    TORCH_CHECK(t.is_cuda() && t.get_device() == device_, kWho, ": ", collective, ": a tensor is on ", t.device(),
                "; this communicator carries tensors of cuda:", device_);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  const cudaStream_t caller = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
  const cudaStream_t own = impl_->stream.stream();
  const auto where = [&] { return c10::str(" on rank ", impl_->rank, " of ", impl_->size); };
  if (cudaEventRecord(impl_->ready, caller) != cudaSuccess || cudaStreamWaitEvent(own, impl_->ready, 0) != cudaSuccess)
    fail(c10::str(kWho, ": ", collective, ": ordering after the caller's stream failed", where()));
  ncclResult_t r = static_cast<ncclResult_t>(launch(own));
  if (r != ncclSuccess && r != ncclInProgress)
    fail(c10::str(kWho, ": ", collective, " of ", numel, " elements failed", where(), ": ", ncclGetErrorString(r)));
  // The caching allocator must not hand these tensors' memory to others before the own stream is done.
  for (const at::Tensor& t : tensors) t.record_stream(impl_->stream);
  if (cudaEventRecord(impl_->done, own) != cudaSuccess)
    fail(c10::str(kWho, ": ", collective, ": cudaEventRecord failed", where()));
  const auto start = std::chrono::steady_clock::now();
  for (int64_t polls = 0;; ++polls) {
    const cudaError_t q = cudaEventQuery(impl_->done);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady)
      fail(c10::str(kWho, ": ", collective, " of ", numel, " elements failed", where(), ": ", cudaGetErrorString(q)));
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(impl_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      fail(c10::str(kWho, ": ", collective, " of ", numel, " elements failed", where(), ": ", ncclGetErrorString(async)));
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > options_.timeout_s)
      fail(c10::str(kWho, ": ", collective, " of ", numel, " elements did not finish within ", options_.timeout_s,
                    " s", where(), " (a peer rank died, hangs, or skipped the collective)"));
    if (polls > 64) std::this_thread::sleep_for(std::chrono::microseconds(polls > 4096 ? 500 : 20));
  }
  if (cudaStreamWaitEvent(caller, impl_->done, 0) != cudaSuccess)
    fail(c10::str(kWho, ": ", collective, ": ordering the caller's stream after it failed", where()));
}

void NcclCommunicator::all_reduce(at::Tensor& tensor, ReduceOp op) {
  const char* name = "all_reduce";
  check_usable(name);
  check_collective_tensor(kWho, name, "tensor", tensor);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  at::Tensor buf = reduces_natively(tensor.scalar_type()) ? tensor : tensor.to(at::kFloat);
  run(name, buf.numel(), {buf}, [&](void* s) {
    return static_cast<int>(ncclAllReduce(buf.data_ptr(), buf.data_ptr(), static_cast<size_t>(buf.numel()),
                                          nccl_type(buf.scalar_type()), ncclSum, impl_->comm, static_cast<cudaStream_t>(s)));
  });
  // Sum, then one division: the same rounding as MpiCommunicator (ncclAvg may pre-scale).
  if (op == ReduceOp::Avg) buf.div_(impl_->size);
  if (!buf.is_same(tensor)) tensor.copy_(buf);
}

void NcclCommunicator::reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) {
  const char* name = "reduce_scatter";
  check_usable(name);
  check_chunked_collective(kWho, name, input, output, impl_->size, /*input_is_whole=*/true);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  const bool native = reduces_natively(input.scalar_type());
  const at::Tensor in = native ? input : input.to(at::kFloat);
  at::Tensor out = native ? output : at::empty({output.numel()}, in.options());
  run(name, in.numel(), {in, out}, [&](void* s) {
    return static_cast<int>(ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                                              nccl_type(in.scalar_type()), ncclSum, impl_->comm, static_cast<cudaStream_t>(s)));
  });
  if (op == ReduceOp::Avg) out.div_(impl_->size);
  if (!native) output.copy_(out.view(output.sizes()));
}

void NcclCommunicator::all_gather(const at::Tensor& input, at::Tensor& output) {
  const char* name = "all_gather";
  check_usable(name);
  check_chunked_collective(kWho, name, input, output, impl_->size, /*input_is_whole=*/false);
  // In place when input is output's own chunk (NCCL reads sendbuff == recvbuff + rank * count).
  run(name, output.numel(), {input, output}, [&](void* s) {
    return static_cast<int>(ncclAllGather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                                          nccl_type(input.scalar_type()), impl_->comm, static_cast<cudaStream_t>(s)));
  });
}

void NcclCommunicator::broadcast(at::Tensor& tensor, int root) {
  const char* name = "broadcast";
  check_usable(name);
  check_collective_tensor(kWho, name, "tensor", tensor);
  TORCH_CHECK(root >= 0 && root < impl_->size, kWho, ": ", name, ": root must be in [0, ", impl_->size, "), got ", root);
  run(name, tensor.numel(), {tensor}, [&](void* s) {
    return static_cast<int>(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                                          nccl_type(tensor.scalar_type()), root, impl_->comm, static_cast<cudaStream_t>(s)));
  });
}

void NcclCommunicator::barrier() {
  // A one-element all_reduce on the device: it orders the GPUs' streams, not only the hosts.
  at::Tensor t = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
  all_reduce(t);
}

}  // namespace distributed
}  // namespace lowbit
