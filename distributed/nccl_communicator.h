// NcclCommunicator: the Communicator for CUDA tensors over NCCL (RCCL under ROCm), bootstrapped by
// MPI (ncclGetUniqueId on rank 0, MPI_Bcast to the others). Collectives run on the communicator's
// own stream, ordered after the caller's current stream by an event and before the caller's later
// work by another; a call returns once its collective is enqueued, without waiting for it. A
// watchdog thread watches every collective in flight: one that does not finish within the timeout,
// or an asynchronous NCCL error (a dead or hung peer), aborts the NCCL communicator (ncclCommAbort)
// and ends the job with an error naming the collective and the rank (or, without abort_on_failure,
// makes every later call throw it); never a hang. The communicator is set up non-blocking (bounded
// by the timeout) and split into a blocking one for the collectives: NCCL's non-blocking mode
// starts a thread per call, which made the overlapped sharded step 2x slower.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "communicator.h"
#include "mpi_communicator.h"

namespace lowbit {
namespace distributed {

struct NcclOptions {
  double timeout_s = 300.0;      // per collective (from its enqueue), and for the communicator's setup
  // As MpiOptions: end the job (MPI_Abort) after ncclCommAbort; false: the failure is recorded and
  // the next call on this communicator (or synchronize()) throws it, on this rank only. A call kept
  // inside NCCL past the timeout (connecting to a dead peer at an algorithm's first use) ends the
  // job either way: NCCL cannot abort a communicator another thread is inside. So does any failure
  // once the copy engines are in use (after the first gather_buffer() with copy_engines().gathers):
  // their collectives wait for the peers in stream memory operations, which ncclCommAbort cannot
  // cancel.
  bool abort_on_failure = true;
  // The copy engines. Each option unset (the default) is on where NCCL runs the collectives there,
  // off elsewhere; true / false force it. NCCL does so on one node, with NCCL 2.28 or later, a driver
  // of CUDA 12.5 or later, and every pair of the node's GPUs reaching the other directly (NVLink, or
  // PCIe peer-to-peer where NCCL allows it; not with NCCL_P2P_DISABLE, NCCL_WIN_ENABLE=0 or
  // NCCL_CUMEM_ENABLE=0): decided at construction by asking NCCL (copy_engine_support.h), the same
  // on every rank; copy_engines() says what it came to, and why not.
  //
  // gathers: gather_buffer() memory from ncclMemAlloc, registered as NCCL symmetric windows on a
  // third communicator whose CTA policy is NCCL_CTA_POLICY_ZERO: an all_gather whose input and
  // output lie in such buffers runs on the copy engines (elsewhere NCCL runs its kernels), leaving
  // every SM to the kernels beside it. Measured on 2 H200s (bench/nccl_probe): 1.19x the kernels'
  // all-gather, and a memory-bound kernel beside it slowed 2.5x less. The buffers are held by the
  // communicator until it is destroyed (registration is collective, so they are not registered
  // again): one dropped is given to the next request of its size, which every rank must make at the
  // same point.
  std::optional<bool> copy_engine_gathers;
  // reductions (with the gathers; unset and the gathers forced off, it is off): a float32
  // reduce_scatter whose input lies in a gather_buffer() (the sharded optimizer's gradient buckets)
  // exchanges its chunks on the copy engines (all-to-all into a symmetric scratch buffer of the
  // input's size, one per size, held like the buffers) and sums what it received with one kernel per
  // rank beyond the first, in rank order: it takes no compute units from backward's kernels beside it
  // but that sum's. Deterministic; its sums are in another order than NCCL's ring for 3 ranks or
  // more. On 2 H200s over NVLink (bench_sharded_step, 268M parameters) the sharded step 0.94-0.95x,
  // the overlapped backward + step 0.93-0.96x. Forced on where NCCL has no copy engines, the
  // all-to-all runs on NCCL's kernels, slower than its reduce-scatter (kept off NVLink: the step
  // 1.06x, the overlap 1.0-1.25x).
  std::optional<bool> copy_engine_reductions;
};

// What NcclOptions' copy-engine options came to.
struct CopyEngineUse {
  bool gathers = false, reductions = false;
  bool automatic = false;  // decided by the support check (an option was unset)
  std::string why_not;     // automatic and off: why (the first reason, naming its rank)
  // "all-gathers and reduce-scatters on the copy engines (automatic)", "NCCL's kernels (forced)",
  // "NCCL's kernels (automatic: NCCL_P2P_DISABLE=1 on rank 0)": for logs and benches.
  std::string describe() const;
};

class NcclCommunicator : public Communicator {
 public:
  // device: this rank's CUDA device index. bootstrap: the MPI communicator of the same ranks.
  NcclCommunicator(std::shared_ptr<MpiCommunicator> bootstrap, int device, NcclOptions options = {});
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  const char* backend() const override { return "nccl"; }
  int device() const { return device_; }
  const CopyEngineUse& copy_engines() const { return copy_engines_; }

  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op = ReduceOp::Sum) override;
  void all_gather(const at::Tensor& input, at::Tensor& output) override;
  // One NCCL group: the pairs' kernels launched together, one completion for all of them.
  void all_gather_many(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) override;
  // One NCCL group of a send and a receive per rank (NCCL's own all-to-all is the same underneath).
  void all_to_all(const at::Tensor& input, at::Tensor& output) override;
  void broadcast(at::Tensor& tensor, int root = 0) override;
  // Waits on the host too (it ends with synchronize()): every rank has reached it when it returns.
  void barrier() override;

  // Waits on the host until every collective issued so far has finished on the GPU (and with it
  // the callers' work each was ordered after); throws the recorded error if one failed (with
  // abort_on_failure, the job ends instead). Reading a result through the caller's stream (.cpu(),
  // .item()) needs no synchronize().
  void synchronize();

  // A timeline for benchmarks (CUDA timing events, recorded only while on): from start_timeline(),
  // each collective's start and end on the own stream, and mark()s recorded on the caller's stream,
  // in ms from start_timeline()'s position on the caller's stream; and on the host, when each call
  // was made and returned, in ms from start_timeline()'s call. timeline() waits for the device,
  // returns them in order of issue and stops recording.
  struct TimelineEntry {
    std::string what;  // the collective, or the mark's label
    int64_t numel = 0;  // the collective's elements; 0 for a mark
    double start_ms = 0, end_ms = 0;  // on the GPU; a mark: both its time
    double host_start_ms = 0, host_end_ms = 0;  // the call (a collective's: run() from its checks to its return)
  };
  void start_timeline();
  void mark(const std::string& label);
  std::vector<TimelineEntry> timeline();

  void defer_stream_waits(bool defer) override;
  void order_after_collectives() override;
  int64_t collectives_issued() const override;
  void order_after_collective(int64_t n) override;
  void wait_for_collective(int64_t n) override;


 protected:
  at::Tensor make_gather_buffer(int64_t numel, const at::TensorOptions& options) override;

 private:
  struct Impl;  // NCCL and CUDA handles, the watchdog: no nccl.h in this header
  // Enqueues launch(stream) (returns an ncclResult_t) on the own stream after the caller's work,
  // then `post` (the result's division or conversion, torch ops) with the own stream current;
  // orders the caller's stream after both (unless deferred), hands them to the watchdog, returns.
  void run(const char* collective, int64_t numel, const std::vector<at::Tensor>& tensors,
           const std::function<int(void* stream)>& launch, const std::function<void()>& post = {});
  void check_usable(const char* collective) const;
  void reduce_scatter_on_copy_engines(const at::Tensor& input, at::Tensor& output, ReduceOp op);
  void decide_copy_engines();  // copy_engines_ from options_ (collective when automatic)
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<MpiCommunicator> bootstrap_;
  int device_ = 0;
  NcclOptions options_;
  CopyEngineUse copy_engines_;
};

}  // namespace distributed
}  // namespace lowbit
