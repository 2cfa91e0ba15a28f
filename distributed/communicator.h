// The collectives lowbit's sharded optimizer needs, on tensors, whatever carries them (MPI for CPU
// tensors, NCCL/RCCL for GPU tensors, a c10d process group). Every call is collective: all ranks make
// it in the same order with the same sizes. A failure (a dead or hung peer, a timeout) is an error on
// every rank that names the collective and the rank; it never hangs.
#pragma once

#include <ATen/ATen.h>

#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace lowbit {
namespace distributed {

// Avg = the sum divided by size(), each rounded once in the tensor's precision (float32 for
// bfloat16 / float16 tensors, which are summed in float32 and rounded back).
enum class ReduceOp { Sum, Avg };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;  // "mpi", "nccl", ...

  // In place: every rank ends with the reduction over ranks of `tensor`.
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;
  // input holds size() chunks of output.numel() elements; rank r receives the reduction of chunk r.
  virtual void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op = ReduceOp::Sum) = 0;
  // output receives size() chunks, chunk r = rank r's input. input may be output's chunk rank()
  // (in place: no copy).
  virtual void all_gather(const at::Tensor& input, at::Tensor& output) = 0;
  // all_gather(inputs[k], outputs[k]) for each k, in order; a backend may launch them as one (NCCL:
  // one group, whose kernels reach the bus bandwidth that small all-gathers alone do not).
  virtual void all_gather_many(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs);
  // input and output hold size() chunks of equal size each: input's chunk r goes to rank r, and
  // output's chunk r is what rank r sent this rank (the exchange of a quantized reduce-scatter,
  // whose receiver sums the chunks itself). Any dtype; input and output must not share memory.
  virtual void all_to_all(const at::Tensor& input, at::Tensor& output) = 0;
  // In place: every rank ends with root's `tensor`.
  virtual void broadcast(at::Tensor& tensor, int root = 0) = 0;
  virtual void barrier() = 0;

  // A flat buffer of `numel` elements that all_gather will fill, or reduce_scatter read, again and
  // again (the sharded optimizer's parameters and gradients). A backend that gathers faster into
  // memory of its own gives that (NcclOptions::copy_engine_gathers: NCCL symmetric memory, gathered
  // and with copy_engine_reductions exchanged by the copy engines, without taking compute units from
  // the kernels beside them); the others at::empty. Collective: every rank asks for the same sizes
  // in the same order. Uninitialized.
  at::Tensor gather_buffer(int64_t numel, const at::TensorOptions& options) {
    TORCH_CHECK(numel >= 0, backend(), ": gather_buffer: numel must be >= 0, got ", numel);
    return make_gather_buffer(numel, options);
  }

  // Overlap (CUDA streams): a collective orders the caller's current stream after itself before it
  // returns, so its results are ready for the caller's next kernel. While defer_stream_waits(true)
  // is in effect, collectives skip that, so the caller's stream runs on (computing what does not
  // touch their tensors); order_after_collectives() then orders the current stream after every
  // collective issued so far. Backends that complete collectives before returning ignore both.
  virtual void defer_stream_waits(bool defer) { (void)defer; }
  virtual void order_after_collectives() {}
  // The finer wait: collectives_issued() counts the collectives issued so far, and
  // order_after_collective(n) orders the caller's stream after the n-th of them (so after every
  // earlier one too: a backend runs them in issue order) but not after later ones, which then run
  // under the caller's next kernels (a prefetched all-gather awaited while a reduce-scatter issued
  // after it still runs). Backends that complete collectives before returning count nothing.
  virtual int64_t collectives_issued() const { return 0; }
  // The host waits until the n-th collective has finished (and every earlier one): a bound on how
  // far the host runs ahead of the device (memory a collective used is reusable once it finished).
  // Within the timeout like every wait; n beyond collectives_issued() is an error.
  virtual void wait_for_collective(int64_t n) { (void)n; }
  virtual void order_after_collective(int64_t n) {
    (void)n;
    order_after_collectives();
  }

 protected:
  // gather_buffer's memory, numel checked.
  virtual at::Tensor make_gather_buffer(int64_t numel, const at::TensorOptions& options) {
    return at::empty({numel}, options);
  }
};

// defer_stream_waits(true) for a scope. A scope left by an exception also orders the caller's
// stream after the collectives it deferred: whoever catches the error may read their tensors.
class DeferredStreamWaits {
 public:
  explicit DeferredStreamWaits(Communicator& c) : c_(c), exceptions_(std::uncaught_exceptions()) {
    c_.defer_stream_waits(true);
  }
  ~DeferredStreamWaits() {
    c_.defer_stream_waits(false);
    if (std::uncaught_exceptions() > exceptions_) {
      try {
        c_.order_after_collectives();
      } catch (...) {  // the communicator failed: the error in flight says more
      }
    }
  }
  DeferredStreamWaits(const DeferredStreamWaits&) = delete;
  DeferredStreamWaits& operator=(const DeferredStreamWaits&) = delete;

 private:
  Communicator& c_;
  int exceptions_;
};

// Checks shared by the backends; errors name the backend, the collective and the argument.
void check_collective_tensor(const char* who, const char* collective, const char* arg, const at::Tensor& t);
void check_same_kind(const char* who, const char* collective, const at::Tensor& a, const at::Tensor& b);
// reduce_scatter (input_is_whole) and all_gather (output is whole): both tensors checked, of one
// kind, and the whole one holding `size` chunks of the other's numel.
void check_chunked_collective(const char* who, const char* collective, const at::Tensor& input,
                              const at::Tensor& output, int size, bool input_is_whole);
// all_to_all: both tensors checked, of one kind, of the same numel divisible by `size`, not sharing memory.
void check_all_to_all(const char* who, const at::Tensor& input, const at::Tensor& output, int size);
// True when `input` is exactly output's chunk `rank` of `chunks` (all_gather in place).
bool is_chunk_of(const at::Tensor& input, const at::Tensor& output, int rank);
// The dtypes the host backends (MPI, and c10d's, to give MPI's bits) sum as they are; every other
// dtype is summed in float32 and rounded back.
bool host_sums_natively(at::ScalarType t);

}  // namespace distributed
}  // namespace lowbit
