// NcclCommunicator: MPI bootstrap; collectives enqueued on an own stream, ordered by events, that
// return without waiting; a watchdog thread per communicator that enforces the timeout and NCCL's
// asynchronous errors (ncclCommAbort, then the job ends or later calls throw).
#include "nccl_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#include <nccl_device.h>
#endif

#include "copy_engine_support.h"
#include "rank_agreement.h"

namespace lowbit {
namespace distributed {

namespace {

constexpr const char* kNccl = "NcclCommunicator";

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The watchdog's polling while collectives are in flight: slow when only the timeout is at stake,
// fast while a thread waits for them (synchronize(), barrier(), the destructor).
constexpr std::chrono::microseconds kPollIdle(1000);
constexpr std::chrono::microseconds kPollWaited(50);
constexpr int kInitialEvents = 8;  // the completion events made up front; more when more are in flight
// Backpressure: with this many collectives in flight (the GPU that far behind, or hung), a call
// waits for the oldest to finish, the watchdog enforcing the timeout meanwhile. It bounds the event
// pool, and keeps NCCL's own queues from filling behind a hung collective: an enqueue that blocked
// inside NCCL would hold nccl_mu and so keep the watchdog from aborting. (NCCL 2.28 passes a lone
// collective's work in the kernel's arguments rather than its work FIFO, and its proxy thread takes
// posted operations off their pool without waiting for the network, so this is a backstop.)
constexpr size_t kMaxInFlight = 512;

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
    default: TORCH_CHECK(false, kNccl, ": dtype ", t, " is not supported");
  }
}

// Reductions of bfloat16 / float16 go through float32 (the Communicator's documented rounding, the
// same bits as MpiCommunicator); everything else reduces in its own type.
bool reduces_natively(at::ScalarType t) { return t != at::kHalf && t != at::kBFloat16 && t != at::kBool; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// State shared by the calling threads and the watchdog
// ---------------------------------------------------------------------------------------------
// Two locks, always taken in this order when both are needed:
//   nccl_mu: held around every NCCL call on `comm` (enqueue, ncclCommGetAsyncError, ncclCommAbort,
//     ncclCommDestroy): NCCL lets several threads use a communicator only one at a time (NCCL user
//     guide, "Thread Safety"), and an abort must not race an enqueue (ncclCommAbort frees what a
//     call in progress still uses). `comm` is a blocking communicator: a non-blocking one starts a
//     thread for every collective (NCCL 2.28, src/group.cc) and cost the overlapped step 2x (bench/
//     HISTORY.md). A blocking enqueue returns at once except where NCCL connects to a peer (the
//     first use of an algorithm); one that a dead peer keeps inside NCCL past the timeout (`busy`)
//     cannot be aborted under this lock, and ending the process is then the only way out of a hang.
//   mu: the collectives in flight, the NCCL call in progress, the event pool, the recorded failure,
//     the waiters and `stop`.
//     No CUDA or NCCL call that can block is made under it (cudaEventQuery does not block).

struct InFlight {
  cudaEvent_t done;
  int64_t number;  // its place in issue order, from 1 (collectives_issued())
  Clock::time_point start;
  const char* collective;  // a string literal
  int64_t numel;
};

// NcclOptions::copy_engine_gathers: the buffers gather_buffer() gave out, registered as symmetric
// windows on the copy-engine communicator. Shared with the tensors' deleters, which may run after
// the communicator is gone: a buffer dropped before that waits for the next request of its size (a
// second registration would be collective, and deregistration too); one dropped after it is freed.
struct SymmetricBuffers {
  struct Buffer {
    char* base;
    size_t bytes;
    bool in_use;
  };
  std::mutex mu;
  std::vector<Buffer> buffers;
  bool communicator_gone = false;

  // [p, p + bytes) lies in one buffer in use. mu held.
  bool holds(const void* p, size_t bytes) const {
    const char* c = static_cast<const char*>(p);
    for (const Buffer& b : buffers)
      if (b.in_use && c >= b.base && c + bytes <= b.base + b.bytes) return true;
    return false;
  }
  void drop(void* p) {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t k = 0; k < buffers.size(); ++k) {
      if (buffers[k].base != p) continue;
      if (communicator_gone) {
        ncclMemFree(p);
        buffers.erase(buffers.begin() + static_cast<std::ptrdiff_t>(k));
      } else {
        buffers[k].in_use = false;
      }
      return;
    }
  }
  // With the communicator (and the windows with it) gone: free what nobody holds.
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    communicator_gone = true;
    std::vector<Buffer> kept;
    for (const Buffer& b : buffers) {
      if (b.in_use) kept.push_back(b);
      else ncclMemFree(b.base);
    }
    buffers = std::move(kept);
  }
};

struct NcclCommunicator::Impl {
  explicit Impl(c10::cuda::CUDAStream s) : stream(s) {}
  ~Impl();

  c10::cuda::CUDAStream stream;  // the own stream every collective runs on
  int device = 0, rank = 0, size = 1;
  double timeout_s = 300.0;
  bool abort_on_failure = true;
  MPI_Comm bootstrap = MPI_COMM_NULL;
  bool mpi_thread_multiple = false;  // MPI was initialized with MPI_THREAD_MULTIPLE
  std::thread::id mpi_main;          // the thread that initialized MPI, where known

  std::mutex nccl_mu;
  // Under nccl_mu; null once aborted or destroyed. `setup` is the non-blocking communicator whose
  // initialization the timeout bounds; `comm`, split from it, the blocking one every collective uses.
  ncclComm_t setup = nullptr;
  ncclComm_t comm = nullptr;
  // copy_engine_gathers: split from `comm` at the first gather_buffer(), with NCCL_CTA_POLICY_ZERO;
  // the all-gathers whose tensors lie in `symmetric` buffers run on it (same own stream).
  ncclComm_t ce = nullptr;
  std::atomic<bool> copy_engines_made{false};  // `ce` made: read by the watchdog without nccl_mu
  std::shared_ptr<SymmetricBuffers> symmetric = std::make_shared<SymmetricBuffers>();
  // copy_engine_reductions: the all-to-all's receive buffer per size in bytes (symmetric, kept).
  std::mutex scratch_mu;
  std::map<size_t, at::Tensor> scratch;
  // Whether a reduce-scatter of `input` runs on the copy engines; nccl_mu held.
  bool reduces_on_copy_engines(const at::Tensor& input) {
    if (!ce || input.scalar_type() != at::kFloat) return false;
    std::lock_guard<std::mutex> lock(symmetric->mu);
    return symmetric->holds(input.data_ptr(), input.nbytes());
  }
  cudaEvent_t ready = nullptr;  // under nccl_mu: the caller's stream position, for the next enqueue
  cudaEvent_t joined = nullptr;  // under nccl_mu: the own stream's position, for order_after_collectives
  std::atomic<bool> defer{false};  // defer_stream_waits
  struct Timed {
    std::string what;
    int64_t numel;
    cudaEvent_t start, end;  // one event for a mark
    Clock::time_point host_start, host_end;
  };
  bool timing = false;             // under nccl_mu: the timeline is recording
  cudaEvent_t origin = nullptr;    // under nccl_mu: start_timeline()'s position
  Clock::time_point host_origin;   // under nccl_mu
  std::vector<Timed> timed;        // under nccl_mu
  cudaEvent_t timing_event();      // a new timing event, kept in `timed` or `origin` until timeline()

  std::mutex mu;
  std::condition_variable wake;     // to the watchdog: work in flight, a waiter, or stop
  std::condition_variable settled;  // to waiters: a collective finished, or a failure
  std::deque<InFlight> in_flight;   // in enqueue order, which is their order on the own stream
  int64_t issued = 0;               // collectives enqueued so far
  std::vector<cudaEvent_t> pool;    // completion events not in use
  std::vector<cudaEvent_t> events;  // every completion event made (destroyed with Impl)
  std::string broken;               // the first failure; nothing runs after it
  const char* busy = nullptr;       // the NCCL call a calling thread is inside (a literal), or null
  Clock::time_point busy_since;
  int waiters = 0;
  bool stop = false;
  std::thread watchdog;

  std::string where() const { return c10::str(" on rank ", rank, " of ", size); }
  cudaEvent_t take_event();
  void watch();
  // The first failure is recorded (printed first with abort_on_failure, so it reaches the log
  // whatever happens next) and wakes every waiter; later ones are dropped.
  void record(const std::string& message);
  // Ends this rank's NCCL kernels, which would otherwise spin on a dead peer. nccl_mu held.
  void abort_comm() {
    if (ce) ncclCommAbort(ce);
    if (comm) ncclCommAbort(comm);
    if (setup) ncclCommAbort(setup);
    comm = setup = ce = nullptr;
  }
  // The copy-engine communicator when every tensor lies in one of its buffers; else `comm`.
  // nccl_mu held.
  ncclComm_t gather_comm(const std::vector<at::Tensor>& tensors) {
    if (!ce) return comm;
    std::lock_guard<std::mutex> lock(symmetric->mu);
    for (const at::Tensor& t : tensors)
      if (!symmetric->holds(t.data_ptr(), t.nbytes())) return comm;
    return ce;
  }
  // Brackets a blocking NCCL call (nccl_mu held) for the watchdog's timeout.
  void enter(const char* call) {
    std::lock_guard<std::mutex> lock(mu);
    busy = call;
    busy_since = Clock::now();
    if (in_flight.empty()) wake.notify_all();  // otherwise the watchdog is polling already
  }
  void leave() {
    std::lock_guard<std::mutex> lock(mu);
    busy = nullptr;
  }
  [[noreturn]] void end_job() const;
};

NcclCommunicator::Impl::~Impl() {
  if (origin) cudaEventDestroy(origin);
  for (const Timed& t : timed) {
    cudaEventDestroy(t.start);
    if (t.end != t.start) cudaEventDestroy(t.end);
  }
  if (ready) cudaEventDestroy(ready);
  if (joined) cudaEventDestroy(joined);
  // An event still pending on a stream is released by CUDA once it completes.
  for (cudaEvent_t e : events) cudaEventDestroy(e);
}

cudaEvent_t NcclCommunicator::Impl::timing_event() {
  cudaEvent_t e = nullptr;
  TORCH_CHECK(cudaEventCreate(&e) == cudaSuccess, kNccl, ": cudaEventCreate failed", where());
  return e;
}

cudaEvent_t NcclCommunicator::Impl::take_event() {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!pool.empty()) {
      cudaEvent_t e = pool.back();
      pool.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  TORCH_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess, kNccl,
              ": cudaEventCreate failed", where());
  std::lock_guard<std::mutex> lock(mu);
  events.push_back(e);
  return e;
}

void NcclCommunicator::Impl::record(const std::string& message) {
  std::lock_guard<std::mutex> lock(mu);
  if (!broken.empty()) return;
  if (abort_on_failure) {
    std::fprintf(stderr, "lowbit: %s; aborting the job\n", message.c_str());
    std::fflush(stderr);
  }
  broken = message;
  settled.notify_all();
  wake.notify_all();
}

// MPI_Abort ends every rank of the job, the hung one too. The MPI standard lets a thread call MPI
// only as the level MPI was initialized with allows: any thread with MPI_THREAD_MULTIPLE, the
// thread that initialized MPI with MPI_THREAD_FUNNELED (which lowbit used to ask for). The watchdog
// is never that thread, and Open MPI 4.1 (Debian's) called from it under MPI_THREAD_FUNNELED does
// abort, but garbles its own error report ("ORTE_ERROR_LOG: Data unpack would read past end of
// buffer" in show_help.c, tried with 2 ranks). So init_mpi() asks for MPI_THREAD_MULTIPLE (Open MPI
// 4.1 provides it: ompi_info "MPI_THREAD_MULTIPLE: yes"), and where MPI provides less (a program
// that initialized MPI itself) a thread that may not call MPI ends its process with std::_Exit:
// mpirun then ends the job (a rank that exited without MPI_Finalize, non-zero), and every other
// rank still waiting for this one runs into its own watchdog's timeout.
void NcclCommunicator::Impl::end_job() const {
  if (mpi_thread_multiple || std::this_thread::get_id() == mpi_main) MPI_Abort(bootstrap, 3);
  std::_Exit(3);
}

// ---------------------------------------------------------------------------------------------
// The watchdog
// ---------------------------------------------------------------------------------------------
// Idle (no collective in flight, no NCCL call in progress): a condition-variable wait. Otherwise it
// polls, oldest first: finished collectives give their event back to the pool; then NCCL's
// asynchronous error and the oldest one's age against the timeout, and the age of a blocking call
// in progress. A failure is recorded, the NCCL communicator aborted, and with abort_on_failure the
// job ended; without, every later call throws the recorded message. A calling thread still inside
// NCCL past the timeout ends the job either way: aborting the communicator would free what it uses;
// so does any failure once the copy engines are in use (gather_buffer() made their communicator).
void NcclCommunicator::Impl::watch() {
  cudaSetDevice(device);
  // Event queries from this thread must stay legal while another thread captures a CUDA graph in
  // the global mode (the default); they touch no capturing stream.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    wake.wait(lock, [&] { return stop || ((!in_flight.empty() || busy) && broken.empty()); });
    if (stop) return;
    std::string failure;
    while (!in_flight.empty()) {
      const InFlight& f = in_flight.front();
      const cudaError_t q = cudaEventQuery(f.done);
      if (q == cudaErrorNotReady) break;
      if (q != cudaSuccess) {
        failure = c10::str(kNccl, ": ", f.collective, " of ", f.numel, " elements failed", where(), ": ",
                           cudaGetErrorString(q));
        break;
      }
      pool.push_back(f.done);
      in_flight.pop_front();
      if (waiters > 0) settled.notify_all();
    }
    if (in_flight.empty() && !busy) continue;
    const bool stuck = busy && seconds_since(busy_since) > timeout_s;
    if (stuck)
      failure = c10::str(kNccl, ": ", busy, " did not finish within ", timeout_s, " s", where(),
                         " (inside NCCL, connecting to a peer rank that died or hangs)");
    if (failure.empty() && !in_flight.empty()) {
      const InFlight oldest = in_flight.front();  // only this thread removes entries
      lock.unlock();
      ncclResult_t async = ncclSuccess;
      {
        // Not while a calling thread is inside NCCL with nccl_mu (connecting to a peer): the
        // watchdog would wait for it, and the stuck check above must stay reachable.
        std::unique_lock<std::mutex> nccl(nccl_mu, std::try_to_lock);
        if (nccl.owns_lock() && comm) {
          const ncclResult_t q = ncclCommGetAsyncError(comm, &async);
          if (q != ncclSuccess) async = q;
        }
      }
      lock.lock();
      if (!broken.empty()) continue;  // a calling thread failed meanwhile
      if (async != ncclSuccess && async != ncclInProgress)
        failure = c10::str(kNccl, ": ", oldest.collective, " of ", oldest.numel, " elements failed", where(), ": ",
                           ncclGetErrorString(async));
      else if (seconds_since(oldest.start) > timeout_s && cudaEventQuery(oldest.done) == cudaErrorNotReady)
        failure = c10::str(kNccl, ": ", oldest.collective, " of ", oldest.numel, " elements did not finish within ",
                           timeout_s, " s", where(), " (a peer rank died, hangs, or skipped the collective)");
    }
    if (!failure.empty()) {
      lock.unlock();
      record(failure);
      // Nor can a copy-engine collective be aborted: it waits for its peers in a stream memory
      // operation, which ncclCommAbort would wait for, forever where a peer hangs.
      if (stuck || copy_engines_made) {
        if (!abort_on_failure) std::fprintf(stderr, "lowbit: %s; ending the process\n", failure.c_str());
        end_job();
      }
      {
        std::lock_guard<std::mutex> nccl(nccl_mu);
        abort_comm();
      }
      if (abort_on_failure) end_job();
      lock.lock();
      in_flight.clear();  // their events complete once the aborted kernels have ended; not reused
      continue;
    }
    wake.wait_for(lock, waiters > 0 ? kPollWaited : kPollIdle);
  }
}

// ---------------------------------------------------------------------------------------------
// Setup and teardown
// ---------------------------------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(std::shared_ptr<MpiCommunicator> bootstrap, int device, NcclOptions options)
    : bootstrap_(std::move(bootstrap)), device_(device), options_(options) {
  TORCH_CHECK(bootstrap_, kNccl, ": the MPI bootstrap communicator is null");
  TORCH_CHECK(options.timeout_s > 0, kNccl, ": the timeout must be > 0 seconds, got ", options.timeout_s);
  TORCH_CHECK(!(options.copy_engine_gathers == true || options.copy_engine_reductions == true) ||
                  NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0),
              kNccl, ": NcclOptions::copy_engine_gathers / copy_engine_reductions need NCCL 2.28 or later (symmetric "
              "windows and the zero-CTA policy); this build has NCCL ", NCCL_VERSION_CODE);
  TORCH_CHECK(!(options.copy_engine_reductions == true && options.copy_engine_gathers == false), kNccl,
              ": NcclOptions::copy_engine_reductions reduces from the buffers copy_engine_gathers makes: set both");
  int devices = 0;
  TORCH_CHECK(cudaGetDeviceCount(&devices) == cudaSuccess && device >= 0 && device < devices, kNccl, ": device ",
              device, " is not one of the ", devices, " visible CUDA devices");
  // The options that decide which collectives run (a copy-engine all-to-all where a peer runs a
  // reduce-scatter, a communicator split that a peer never joins): the same on every rank, checked
  // over the bootstrap before anything of NCCL's is made.
  const auto code = [](const std::optional<bool>& o) -> int64_t { return o ? *o : -1; };
  const auto show = [](int64_t x) { return std::string(x < 0 ? "unset (automatic)" : x ? "true" : "false"); };
  require_ranks_agree(*bootstrap_, at::kCPU,
                      {{"NcclOptions::copy_engine_gathers", code(options.copy_engine_gathers), show},
                       {"NcclOptions::copy_engine_reductions", code(options.copy_engine_reductions), show}},
                      kNccl, "every rank must construct its NcclCommunicator with the same NcclOptions");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  impl_ = std::make_unique<Impl>(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(device)));
  Impl& m = *impl_;
  m.device = device;
  m.rank = bootstrap_->rank();
  m.size = bootstrap_->size();
  m.timeout_s = options_.timeout_s;
  m.abort_on_failure = options_.abort_on_failure;
  m.bootstrap = bootstrap_->comm();
  int level = MPI_THREAD_SINGLE, is_main = 0;
  MPI_Query_thread(&level);
  MPI_Is_thread_main(&is_main);
  m.mpi_thread_multiple = level == MPI_THREAD_MULTIPLE;
  if (is_main) m.mpi_main = std::this_thread::get_id();
  TORCH_CHECK(cudaEventCreateWithFlags(&m.ready, cudaEventDisableTiming) == cudaSuccess &&
                  cudaEventCreateWithFlags(&m.joined, cudaEventDisableTiming) == cudaSuccess,
              kNccl, ": cudaEventCreate failed");
  for (int k = 0; k < kInitialEvents; ++k) {
    cudaEvent_t e = nullptr;
    TORCH_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess, kNccl, ": cudaEventCreate failed");
    m.events.push_back(e);
    m.pool.push_back(e);
  }
  // The unique id from rank 0 to all, over MPI (with MPI's timeout).
  ncclUniqueId id;
  at::Tensor id_bytes = at::zeros({static_cast<int64_t>(sizeof(id))}, at::kByte);
  if (m.rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    TORCH_CHECK(r == ncclSuccess, kNccl, ": ncclGetUniqueId failed: ", ncclGetErrorString(r));
    std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
  }
  bootstrap_->broadcast(id_bytes, 0);
  std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));
  // Setup runs non-blocking, so that a peer that never arrives is a timeout rather than a hang:
  // `setup` is made non-blocking, and a split of it runs non-blocking too (NCCL queues the split on
  // the parent) while making `comm` blocking, for the collectives' speed. Each is waited for here.
  const auto settle = [&](ncclResult_t r, const char* what) {
    const auto start = Clock::now();
    while (r == ncclInProgress || (r == ncclSuccess && [&] {
             ncclResult_t a = ncclSuccess;
             ncclCommGetAsyncError(m.setup, &a);
             r = a;
             return a == ncclInProgress;
           }())) {
      if (seconds_since(start) > options_.timeout_s) {
        m.abort_comm();
        TORCH_CHECK(false, kNccl, ": setting up NCCL (", what, ") did not finish within ", options_.timeout_s, " s",
                    m.where());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (r == ncclInProgress) ncclCommGetAsyncError(m.setup, &r);
    }
    if (r != ncclSuccess) {
      m.abort_comm();
      TORCH_CHECK(false, kNccl, ": NCCL setup (", what, ") failed", m.where(), ": ", ncclGetErrorString(r));
    }
  };
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  settle(ncclCommInitRankConfig(&m.setup, m.size, id, m.rank, &config), "ncclCommInitRankConfig");
  ncclConfig_t blocking = NCCL_CONFIG_INITIALIZER;
  blocking.blocking = 1;
  settle(ncclCommSplit(m.setup, 0, m.rank, &m.comm, &blocking), "ncclCommSplit");
  TORCH_CHECK(m.comm, kNccl, ": NCCL setup (ncclCommSplit) made no communicator", m.where());
  m.watchdog = std::thread([&m] {
    try {
      m.watch();
    } catch (const std::exception& e) {  // nothing may escape a thread; the next call reports it
      m.record(c10::str(kNccl, ": the watchdog failed", m.where(), ": ", e.what()));
    }
  });
  try {
    decide_copy_engines();
  } catch (...) {  // a failed constructor runs no destructor: stop the watchdog, free NCCL's side
    {
      std::lock_guard<std::mutex> lock(m.mu);
      m.stop = true;
    }
    m.wake.notify_all();
    m.watchdog.join();
    std::lock_guard<std::mutex> nccl(m.nccl_mu);
    m.abort_comm();
    throw;
  }
}

std::string CopyEngineUse::describe() const {
  return c10::str(reductions ? "all-gathers and reduce-scatters on the copy engines"
                  : gathers  ? "all-gathers on the copy engines"
                             : "NCCL's kernels",
                  automatic ? " (automatic" : " (forced", why_not.empty() ? "" : ": " + why_not, ")");
}

void NcclCommunicator::decide_copy_engines() {
  const std::optional<bool> gathers = options_.copy_engine_gathers, reductions = options_.copy_engine_reductions;
  CopyEngineUse& use = copy_engines_;
  // Forced reductions force the gathers they reduce from; gathers forced off leave nothing to decide.
  use.automatic = (!gathers && reductions != true) || (!reductions && gathers != false);
  bool supported = false;
  if (use.automatic) {
    Impl& m = *impl_;
    int nccl_version = 0, driver_version = 0;
    ncclGetVersion(&nccl_version);
    cudaDriverGetVersion(&driver_version);
    // NCCL's own check (collective over `comm`): whether the communicator has symmetric support.
    const auto nccl_agrees = [&m] {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 2)
      ncclCommProperties_t properties = NCCL_COMM_PROPERTIES_INITIALIZER;
      std::lock_guard<std::mutex> nccl(m.nccl_mu);
      return ncclCommQueryProperties(m.comm, &properties) == ncclSuccess && properties.deviceApiSupport;
#elif NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
      // Before 2.29 NCCL says it only by refusing a device communicator (an empty one here) where it
      // has no symmetric support, before anything collective.
      ncclDevCommRequirements_t nothing{};
      ncclDevComm_t device_comm{};
      std::lock_guard<std::mutex> nccl(m.nccl_mu);
      m.enter("ncclDevCommCreate (the copy engines' support check)");
      const ncclResult_t r = ncclDevCommCreate(m.comm, &nothing, &device_comm);
      m.leave();
      if (r == ncclSuccess) ncclDevCommDestroy(m.comm, &device_comm);
      return r == ncclSuccess;
#else
      (void)m;
      return false;  // not reached: copy_engine_support rules out NCCL before 2.28 first
#endif
    };
    const CopyEngineSupport s =
        copy_engine_support(*bootstrap_, std::min(nccl_version, NCCL_VERSION_CODE), driver_version, nccl_agrees);
    supported = s.supported;
    use.why_not = s.why_not;
  }
  use.gathers = gathers.value_or(reductions == true || supported);
  use.reductions = reductions.value_or(use.gathers && supported);
}

NcclCommunicator::~NcclCommunicator() {
  if (!impl_) return;
  Impl& m = *impl_;
  try {
    // Every collective in flight finishes or fails within the timeout (the watchdog sees to it:
    // with abort_on_failure a failure ends the job here); the second is the watchdog's margin.
    bool clean = false;
    {
      std::unique_lock<std::mutex> lock(m.mu);
      ++m.waiters;
      m.wake.notify_all();
      const auto limit = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(m.timeout_s + 1.0));
      m.settled.wait_for(lock, limit,
                         [&] { return m.in_flight.empty() || !m.broken.empty(); });
      --m.waiters;
      clean = m.in_flight.empty() && m.broken.empty();
      m.stop = true;
    }
    m.wake.notify_all();
    if (m.watchdog.joinable()) m.watchdog.join();
    std::lock_guard<std::mutex> nccl(m.nccl_mu);
    // ncclCommDestroy waits for the communicator's work, so only after all of it finished.
    if (clean) {
      if (m.ce) ncclCommDestroy(m.ce);
      if (m.comm) ncclCommDestroy(m.comm);
      if (m.setup) ncclCommDestroy(m.setup);
      m.comm = m.setup = m.ce = nullptr;
    } else {
      m.abort_comm();
    }
    m.symmetric->release();
  } catch (...) {  // a destructor must not throw (std::thread::join, lock failures: not expected)
  }
}

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::size() const { return impl_->size; }

void NcclCommunicator::check_usable(const char* collective) const {
  std::string broken;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    broken = impl_->broken;
  }
  if (broken.empty()) return;
  // The watchdog is ending the job already; this ends it too should the watchdog be held up (in
  // ncclCommAbort).
  if (impl_->abort_on_failure) impl_->end_job();
  TORCH_CHECK(false, kNccl, ": ", collective, " on a communicator that failed before: ", broken);
}

void NcclCommunicator::synchronize() {
  Impl& m = *impl_;
  {
    std::unique_lock<std::mutex> lock(m.mu);
    ++m.waiters;
    m.wake.notify_all();
    // Bounded: the watchdog ends every collective in flight within the timeout.
    m.settled.wait(lock, [&] { return m.in_flight.empty() || !m.broken.empty(); });
    --m.waiters;
  }
  check_usable("synchronize");
}

// ---------------------------------------------------------------------------------------------
// Enqueueing a collective
// ---------------------------------------------------------------------------------------------

void NcclCommunicator::run(const char* collective, int64_t numel, const std::vector<at::Tensor>& tensors,
                           const std::function<int(void*)>& launch, const std::function<void()>& post) {
  Impl& m = *impl_;
  const Clock::time_point called = Clock::now();
  for (const at::Tensor& t : tensors)
    TORCH_CHECK(t.is_cuda() && t.get_device() == device_, kNccl, ": ", collective, ": a tensor is on ", t.device(),
                "; this communicator carries tensors of cuda:", device_);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  const cudaStream_t caller = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
  const cudaStream_t own = m.stream.stream();
  // A graph capture would take the collective in but not run it, and its events cannot be waited
  // for during the capture: refused, before anything is enqueued (the communicator stays usable).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t c = cudaStreamIsCapturing(caller, &capture);
  TORCH_CHECK(c == cudaSuccess && capture == cudaStreamCaptureStatusNone, kNccl, ": ", collective,
              ": the caller's stream is capturing a CUDA graph (",
              c == cudaSuccess ? "capture status " + std::to_string(static_cast<int>(capture)) : cudaGetErrorString(c),
              "); NcclCommunicator's collectives cannot be captured: run them outside the capture");
  {
    std::unique_lock<std::mutex> lock(m.mu);
    if (m.in_flight.size() >= kMaxInFlight) {
      ++m.waiters;
      m.wake.notify_all();
      m.settled.wait(lock, [&] { return m.in_flight.size() < kMaxInFlight || !m.broken.empty(); });
      --m.waiters;
    }
  }
  check_usable(collective);
  cudaEvent_t done = m.take_event();
  std::string failure;
  {
    std::lock_guard<std::mutex> nccl(m.nccl_mu);
    if (!m.comm) {  // aborted by the watchdog since the collective's check_usable
      check_usable(collective);
      TORCH_CHECK(false, kNccl, ": ", collective, ": the NCCL communicator is gone");
    }
    if (cudaEventRecord(m.ready, caller) != cudaSuccess || cudaStreamWaitEvent(own, m.ready, 0) != cudaSuccess)
      failure = c10::str(kNccl, ": ", collective, ": ordering after the caller's stream failed", m.where());
    ncclResult_t r = ncclSuccess;
    // On the timeline: its entry stays m.timed.back() to the end, nccl_mu being held throughout.
    const bool timed = failure.empty() && m.timing;
    if (timed) {
      m.timed.push_back({collective, numel, m.timing_event(), m.timing_event(), called, called});
      cudaEventRecord(m.timed.back().start, own);
    }
    if (failure.empty()) {
      m.enter(collective);
      r = static_cast<ncclResult_t>(launch(own));
      m.leave();
      if (timed) cudaEventRecord(m.timed.back().end, own);
    }
    if (failure.empty() && r != ncclSuccess)
      failure = c10::str(kNccl, ": ", collective, " of ", numel, " elements failed", m.where(), ": ",
                         ncclGetErrorString(r));
    // The collective is on the own stream from here: the caching allocator must not hand these
    // tensors' memory to others before that stream is done, whatever happens next.
    if (failure.empty())
      for (size_t k = 0; k < tensors.size(); ++k) {
        const auto same = [&](const at::Tensor& u) { return u.storage().is_alias_of(tensors[k].storage()); };
        if (std::none_of(tensors.begin(), tensors.begin() + k, same)) tensors[k].record_stream(m.stream);
      }
    if (failure.empty() && post) {
      // A post-op that throws (out of memory, say) fails the collective like NCCL would: recorded,
      // the communicator aborted, the error thrown below; never a collective nobody tracks.
      try {
        c10::cuda::CUDAStreamGuard on_own(m.stream);
        post();
      } catch (const std::exception& e) {
        failure = c10::str(kNccl, ": ", collective, " of ", numel, " elements: its result's post-processing failed",
                           m.where(), ": ", e.what());
      }
    }
    if (failure.empty()) {
      if (cudaEventRecord(done, own) != cudaSuccess ||
          (!m.defer.load() && cudaStreamWaitEvent(caller, done, 0) != cudaSuccess))
        failure = c10::str(kNccl, ": ", collective, ": ordering the caller's stream after it failed", m.where());
    }
    if (failure.empty() && timed) m.timed.back().host_end = Clock::now();
    if (failure.empty()) {
      std::lock_guard<std::mutex> lock(m.mu);
      const bool idle = m.in_flight.empty();
      m.in_flight.push_back({done, ++m.issued, Clock::now(), collective, numel});
      if (idle) m.wake.notify_all();
    } else {
      m.record(failure);
      m.abort_comm();
    }
  }
  if (failure.empty()) return;
  if (m.abort_on_failure) m.end_job();
  TORCH_CHECK(false, failure);
}

void NcclCommunicator::all_reduce(at::Tensor& tensor, ReduceOp op) {
  const char* name = "all_reduce";
  check_usable(name);
  check_collective_tensor(kNccl, name, "tensor", tensor);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  at::Tensor buf = reduces_natively(tensor.scalar_type()) ? tensor : tensor.to(at::kFloat);
  run(name, buf.numel(), {buf, tensor}, [&](void* s) {
    return static_cast<int>(ncclAllReduce(buf.data_ptr(), buf.data_ptr(), static_cast<size_t>(buf.numel()),
                                          nccl_type(buf.scalar_type()), ncclSum, impl_->comm, static_cast<cudaStream_t>(s)));
  }, [&] {
    // Sum, then one division: the same rounding as MpiCommunicator (ncclAvg may pre-scale).
    if (op == ReduceOp::Avg) buf.div_(impl_->size);
    if (!buf.is_same(tensor)) tensor.copy_(buf);
  });
}

void NcclCommunicator::reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) {
  const char* name = "reduce_scatter";
  check_usable(name);
  check_chunked_collective(kNccl, name, input, output, impl_->size, /*input_is_whole=*/true);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  bool copy_engines = false;
  if (copy_engines_.reductions && impl_->size > 1 && input.numel() > 0) {
    std::lock_guard<std::mutex> nccl(impl_->nccl_mu);
    copy_engines = impl_->reduces_on_copy_engines(input);
  }
  if (copy_engines) return reduce_scatter_on_copy_engines(input, output, op);
  const bool native = reduces_natively(input.scalar_type());
  const at::Tensor in = native ? input : input.to(at::kFloat);
  at::Tensor out = native ? output : at::empty({output.numel()}, in.options());
  run(name, in.numel(), {in, out, output}, [&](void* s) {
    return static_cast<int>(ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                                              nccl_type(in.scalar_type()), ncclSum, impl_->comm, static_cast<cudaStream_t>(s)));
  }, [&] {
    if (op == ReduceOp::Avg) out.div_(impl_->size);
    if (!native) output.copy_(out.view(output.sizes()));
  });
}

void NcclCommunicator::reduce_scatter_on_copy_engines(const at::Tensor& input, at::Tensor& output, ReduceOp op) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)  // copy_engine_gathers is refused below that
  Impl& m = *impl_;
  const int n = m.size;
  const size_t bytes = input.nbytes();
  at::Tensor received;
  {
    std::lock_guard<std::mutex> lock(m.scratch_mu);
    auto it = m.scratch.find(bytes);
    if (it != m.scratch.end()) received = it->second;
  }
  if (!received.defined()) {  // collective: every rank reduces the same buckets in the same order
    received = make_gather_buffer(input.numel(), input.options());
    std::lock_guard<std::mutex> lock(m.scratch_mu);
    m.scratch[bytes] = received;
  }
  const int64_t chunk = output.numel();
  run("reduce_scatter", input.numel(), {input, output, received}, [&](void* s) {
    return static_cast<int>(ncclAlltoAll(input.data_ptr(), received.data_ptr(), static_cast<size_t>(chunk), ncclFloat,
                                         m.ce, static_cast<cudaStream_t>(s)));
  }, [&] {
    // Rank r's chunk from every rank, added in rank order.
    at::Tensor out = output.view({chunk});
    at::add_out(out, received.narrow(0, 0, chunk), received.narrow(0, chunk, chunk));
    for (int r = 2; r < n; ++r) out.add_(received.narrow(0, r * chunk, chunk));
    if (op == ReduceOp::Avg) out.div_(n);
  });
#else
  (void)input, (void)output, (void)op;
  TORCH_INTERNAL_ASSERT(false, "copy_engine_reductions below NCCL 2.28");
#endif
}

void NcclCommunicator::all_gather(const at::Tensor& input, at::Tensor& output) {
  const char* name = "all_gather";
  check_usable(name);
  check_chunked_collective(kNccl, name, input, output, impl_->size, /*input_is_whole=*/false);
  // In place when input is output's own chunk (NCCL reads sendbuff == recvbuff + rank * count).
  run(name, output.numel(), {input, output}, [&](void* s) {
    return static_cast<int>(ncclAllGather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                                          nccl_type(input.scalar_type()), impl_->gather_comm({input, output}),
                                          static_cast<cudaStream_t>(s)));
  });
}

void NcclCommunicator::all_gather_many(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) {
  const char* name = "all_gather_many";
  check_usable(name);
  TORCH_CHECK(inputs.size() == outputs.size(), kNccl, ": ", name, ": ", inputs.size(), " inputs but ", outputs.size(),
              " outputs");
  if (inputs.empty()) return;
  int64_t numel = 0;
  std::vector<at::Tensor> tensors;
  for (size_t k = 0; k < inputs.size(); ++k) {
    check_chunked_collective(kNccl, name, inputs[k], outputs[k], impl_->size, /*input_is_whole=*/false);
    numel += outputs[k].numel();
    tensors.push_back(inputs[k]);
    tensors.push_back(outputs[k]);
  }
  run(name, numel, tensors, [&](void* s) {
    const ncclComm_t c = impl_->gather_comm(tensors);  // one communicator for the whole group
    ncclResult_t first = ncclGroupStart();
    for (size_t k = 0; k < inputs.size() && first == ncclSuccess; ++k)
      first = ncclAllGather(inputs[k].data_ptr(), outputs[k].data_ptr(), static_cast<size_t>(inputs[k].numel()),
                            nccl_type(inputs[k].scalar_type()), c, static_cast<cudaStream_t>(s));
    const ncclResult_t end = ncclGroupEnd();  // always: a group once started must be ended
    return static_cast<int>(first != ncclSuccess ? first : end);
  });
}

void NcclCommunicator::all_to_all(const at::Tensor& input, at::Tensor& output) {
  const char* name = "all_to_all";
  check_usable(name);
  check_all_to_all(kNccl, input, output, impl_->size);
  if (input.numel() == 0) return;  // every rank has the same numel: none of them sends anything
  const int n = impl_->size;
  const size_t chunk = static_cast<size_t>(input.numel() / n);
  const size_t chunk_bytes = chunk * input.element_size();
  const ncclDataType_t type = nccl_type(input.scalar_type());
  run(name, input.numel(), {input, output}, [&](void* s) {
    const auto stream = static_cast<cudaStream_t>(s);
    const char* in = static_cast<const char*>(input.data_ptr());
    char* out = static_cast<char*>(output.data_ptr());
    ncclResult_t first = ncclGroupStart();
    for (int r = 0; r < n && first == ncclSuccess; ++r) {
      first = ncclSend(in + r * chunk_bytes, chunk, type, r, impl_->comm, stream);
      if (first == ncclSuccess) first = ncclRecv(out + r * chunk_bytes, chunk, type, r, impl_->comm, stream);
    }
    const ncclResult_t end = ncclGroupEnd();  // always: a group once started must be ended
    return static_cast<int>(first != ncclSuccess ? first : end);
  });
}

at::Tensor NcclCommunicator::make_gather_buffer(int64_t numel, const at::TensorOptions& options) {
  if (!copy_engines_.gathers) return Communicator::make_gather_buffer(numel, options);
  const char* name = "gather_buffer";
  check_usable(name);
  TORCH_CHECK(options.device().is_cuda() && options.device().index() == device_, kNccl, ": ", name,
              ": the buffer must be on this communicator's device cuda:", device_, ", got ", options.device());
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)  // the constructor refuses the option below that
  Impl& m = *impl_;
  const size_t bytes = std::max<size_t>(1, static_cast<size_t>(numel) * c10::elementSize(options.dtype().toScalarType()));
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  char* base = nullptr;
  {
    std::lock_guard<std::mutex> nccl(m.nccl_mu);
    TORCH_CHECK(m.comm, kNccl, ": ", name, ": the NCCL communicator is gone", m.where());
    {
      std::lock_guard<std::mutex> lock(m.symmetric->mu);
      for (SymmetricBuffers::Buffer& b : m.symmetric->buffers)
        if (!b.in_use && b.bytes == bytes) {
          b.in_use = true;
          base = b.base;
          break;
        }
    }
    if (!base) {
      ncclResult_t r = ncclSuccess;
      if (!m.ce) {  // collective, as the split of `comm` at setup; bounded by the watchdog
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 1;
        config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
        m.enter("ncclCommSplit (copy-engine gathers)");
        r = ncclCommSplit(m.comm, 0, m.rank, &m.ce, &config);
        m.leave();
        TORCH_CHECK(r == ncclSuccess && m.ce, kNccl, ": ", name, ": splitting the copy-engine communicator failed",
                    m.where(), ": ", ncclGetErrorString(r));
        m.copy_engines_made = true;
      }
      void* p = nullptr;
      r = ncclMemAlloc(&p, bytes);
      TORCH_CHECK(r == ncclSuccess && p, kNccl, ": ", name, ": ncclMemAlloc of ", bytes, " bytes failed", m.where(),
                  ": ", ncclGetErrorString(r));
      ncclWindow_t window = nullptr;
      m.enter("ncclCommWindowRegister");
      r = ncclCommWindowRegister(m.ce, p, bytes, &window, NCCL_WIN_COLL_SYMMETRIC);
      m.leave();
      if (r != ncclSuccess) {
        ncclMemFree(p);
        TORCH_CHECK(false, kNccl, ": ", name, ": registering ", bytes, " bytes as a symmetric window failed", m.where(),
                    ": ", ncclGetErrorString(r));
      }
      std::lock_guard<std::mutex> lock(m.symmetric->mu);
      m.symmetric->buffers.push_back({static_cast<char*>(p), bytes, true});
      base = static_cast<char*>(p);
    }
  }
  // A buffer given back may still be read by a collective on the own stream: the caller's work
  // with it comes after every collective issued so far.
  order_after_collectives();
  std::shared_ptr<SymmetricBuffers> symmetric = m.symmetric;
  return at::from_blob(
      base, {numel}, [symmetric](void* p) { symmetric->drop(p); }, options);
#else
  TORCH_INTERNAL_ASSERT(false, "copy_engine_gathers below NCCL 2.28");
#endif
}

void NcclCommunicator::broadcast(at::Tensor& tensor, int root) {
  const char* name = "broadcast";
  check_usable(name);
  check_collective_tensor(kNccl, name, "tensor", tensor);
  TORCH_CHECK(root >= 0 && root < impl_->size, kNccl, ": ", name, ": root must be in [0, ", impl_->size, "), got ", root);
  run(name, tensor.numel(), {tensor}, [&](void* s) {
    return static_cast<int>(ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                                          nccl_type(tensor.scalar_type()), root, impl_->comm, static_cast<cudaStream_t>(s)));
  });
}

void NcclCommunicator::start_timeline() {
  Impl& m = *impl_;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  std::lock_guard<std::mutex> nccl(m.nccl_mu);
  if (!m.origin) m.origin = m.timing_event();
  TORCH_CHECK(cudaEventRecord(m.origin, c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream()) ==
                  cudaSuccess, kNccl, ": start_timeline: cudaEventRecord failed", m.where());
  m.timing = true;
  m.host_origin = Clock::now();
}

void NcclCommunicator::mark(const std::string& label) {
  Impl& m = *impl_;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  std::lock_guard<std::mutex> nccl(m.nccl_mu);
  if (!m.timing) return;
  const cudaEvent_t e = m.timing_event();
  const Clock::time_point now = Clock::now();
  m.timed.push_back({label, 0, e, e, now, now});
  TORCH_CHECK(cudaEventRecord(e, c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream()) ==
                  cudaSuccess, kNccl, ": mark: cudaEventRecord failed", m.where());
}

std::vector<NcclCommunicator::TimelineEntry> NcclCommunicator::timeline() {
  Impl& m = *impl_;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  std::vector<Impl::Timed> timed;
  cudaEvent_t origin = nullptr;
  Clock::time_point host_origin;
  {
    std::lock_guard<std::mutex> nccl(m.nccl_mu);
    m.timing = false;
    timed.swap(m.timed);
    origin = m.origin;
    host_origin = m.host_origin;
  }
  const auto host_ms = [&](Clock::time_point t) { return std::chrono::duration<double, std::milli>(t - host_origin).count(); };
  std::vector<TimelineEntry> out;
  const auto ms = [&](cudaEvent_t e) {
    float v = 0;
    TORCH_CHECK(cudaEventSynchronize(e) == cudaSuccess && cudaEventElapsedTime(&v, origin, e) == cudaSuccess, kNccl,
                ": timeline: a timing event failed", m.where());
    return static_cast<double>(v);
  };
  for (const Impl::Timed& t : timed) {
    out.push_back({t.what, t.numel, ms(t.start), ms(t.end), host_ms(t.host_start), host_ms(t.host_end)});
    cudaEventDestroy(t.start);
    if (t.end != t.start) cudaEventDestroy(t.end);
  }
  return out;
}

void NcclCommunicator::defer_stream_waits(bool defer) { impl_->defer.store(defer); }

void NcclCommunicator::order_after_collectives() {
  Impl& m = *impl_;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  const cudaStream_t caller = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
  {
    std::lock_guard<std::mutex> nccl(m.nccl_mu);
    TORCH_CHECK(cudaEventRecord(m.joined, m.stream.stream()) == cudaSuccess &&
                    cudaStreamWaitEvent(caller, m.joined, 0) == cudaSuccess,
                kNccl, ": order_after_collectives: ordering the caller's stream failed", m.where());
  }
  // A deferred collective that failed already is this call's error too: the caller is about to use
  // the results.
  check_usable("order_after_collectives");
}

int64_t NcclCommunicator::collectives_issued() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->issued;
}

void NcclCommunicator::order_after_collective(int64_t n) {
  Impl& m = *impl_;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
  const cudaStream_t caller = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
  {
    // Under mu the watchdog cannot hand the event back to the pool (and a later collective record
    // it again) between the lookup and the wait. A collective no longer in flight has finished.
    std::lock_guard<std::mutex> lock(m.mu);
    TORCH_CHECK(n >= 0 && n <= m.issued, kNccl, ": order_after_collective(", n, "): ", m.issued,
                " collectives were issued", m.where());
    for (const InFlight& f : m.in_flight) {
      if (f.number < n) continue;
      if (f.number == n)
        TORCH_CHECK(cudaStreamWaitEvent(caller, f.done, 0) == cudaSuccess, kNccl, ": order_after_collective: ordering "
                    "the caller's stream after ", f.collective, " failed", m.where());
      break;
    }
  }
  check_usable("order_after_collective");
}

void NcclCommunicator::wait_for_collective(int64_t n) {
  Impl& m = *impl_;
  {
    std::unique_lock<std::mutex> lock(m.mu);
    TORCH_CHECK(n >= 0 && n <= m.issued, kNccl, ": wait_for_collective(", n, "): ", m.issued,
                " collectives were issued", m.where());
    // Bounded: the watchdog ends every collective in flight within the timeout.
    ++m.waiters;
    m.wake.notify_all();
    m.settled.wait(lock, [&] { return m.in_flight.empty() || m.in_flight.front().number > n || !m.broken.empty(); });
    --m.waiters;
  }
  check_usable("wait_for_collective");
}

void NcclCommunicator::barrier() {
  // A one-element all_reduce on the device orders the GPUs' streams; waiting for it, the hosts
  // (callers rely on that: a checkpoint's files are all written when save() returns).
  at::Tensor t = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_));
  all_reduce(t);
  synchronize();
}

}  // namespace distributed
}  // namespace lowbit
