// MpiCommunicator: non-blocking MPI collectives polled against a timeout.
#include "mpi_communicator.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace lowbit {
namespace distributed {

namespace {

constexpr const char* kMpi = "MpiCommunicator";

MPI_Datatype mpi_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kChar: return MPI_INT8_T;
    case at::kBool: return MPI_UINT8_T;
    case at::kBFloat16:
    case at::kHalf: return MPI_UINT16_T;  // moved as bits; reductions go through float32
    default: TORCH_CHECK(false, kMpi, ": dtype ", t, " is not supported");
  }
}

// MPI counts are int: larger tensors need several calls, which lowbit does not make yet.
int count_of(const char* collective, int64_t numel) {
  TORCH_CHECK(numel <= INT32_MAX, kMpi, ": ", collective, ": ", numel, " elements exceed MPI's int count (",
              INT32_MAX, ")");
  return static_cast<int>(numel);
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

void init_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  // MPI_THREAD_MULTIPLE: NcclCommunicator's watchdog ends a failed job with MPI_Abort from its own
  // thread (nccl_communicator.cpp, end_job). MpiCommunicator itself calls MPI from one thread at a
  // time. A lower level provided is not an error.
  const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  TORCH_CHECK(rc == MPI_SUCCESS, kMpi, ": MPI_Init_thread failed with code ", rc);
  std::atexit(finalize_at_exit);
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, MpiOptions options) : options_(options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  TORCH_CHECK(initialized, kMpi, ": MPI is not initialized; call lowbit::distributed::init_mpi() or MPI_Init first");
  set_timeout(options.timeout_s);
  TORCH_CHECK(MPI_Comm_dup(comm, &comm_) == MPI_SUCCESS, kMpi, ": MPI_Comm_dup failed");
  // Errors come back as return codes (then reported with the collective's name), not MPI's abort.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // A communicator with a collective still in flight (after a thrown failure) is left to MPI.
  if (!finalized && comm_ != MPI_COMM_NULL && broken_.empty()) MPI_Comm_free(&comm_);
}

void MpiCommunicator::set_timeout(double seconds) {
  TORCH_CHECK(seconds > 0, kMpi, ": the timeout must be > 0 seconds, got ", seconds);
  options_.timeout_s = seconds;
}

void MpiCommunicator::fail(const std::string& message) {
  if (options_.abort_on_failure) {
    std::fprintf(stderr, "lowbit: %s; aborting the job\n", message.c_str());
    std::fflush(stderr);
    MPI_Abort(comm_, 3);
  }
  broken_ = message;
  TORCH_CHECK(false, message);
}

void MpiCommunicator::check_usable(const char* collective) const {
  TORCH_CHECK(broken_.empty(), kMpi, ": ", collective, " on a communicator that failed before: ", broken_);
}

void MpiCommunicator::check_rc(int rc, const char* collective) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(c10::str(kMpi, ": ", collective, " failed on rank ", rank_, " of ", size_, ": ", text));
}

void MpiCommunicator::wait(MPI_Request& request, const char* collective, int64_t numel) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  int done = 0;
  for (int64_t polls = 0;; ++polls) {
    check_rc(MPI_Test(&request, &done, MPI_STATUS_IGNORE), collective);
    if (done) return;
    const double waited = std::chrono::duration<double>(clock::now() - start).count();
    if (waited > options_.timeout_s)
      fail(c10::str(kMpi, ": ", collective, " of ", numel, " elements did not finish within ", options_.timeout_s,
                    " s on rank ", rank_, " of ", size_, " (a peer rank died, hangs, or skipped the collective)"));
    // Spin briefly (short collectives), then yield the core: ranks may share cores (--oversubscribe).
    if (polls > 64) std::this_thread::sleep_for(std::chrono::microseconds(polls > 4096 ? 500 : 20));
  }
}

void MpiCommunicator::all_reduce(at::Tensor& tensor, ReduceOp op) {
  const char* name = "all_reduce";
  check_usable(name);
  check_collective_tensor(kMpi, name, "tensor", tensor);
  TORCH_CHECK(tensor.is_cpu(), kMpi, ": ", name, ": tensor is on ", tensor.device(), "; MPI carries CPU tensors");
  at::Tensor buf = host_sums_natively(tensor.scalar_type()) ? tensor : tensor.to(at::kFloat);
  MPI_Request req;
  check_rc(MPI_Iallreduce(MPI_IN_PLACE, buf.data_ptr(), count_of(name, buf.numel()), mpi_type(buf.scalar_type()),
                          MPI_SUM, comm_, &req),
           name);
  wait(req, name, buf.numel());
  if (op == ReduceOp::Avg) buf.div_(size_);
  if (!buf.is_same(tensor)) tensor.copy_(buf);
}

void MpiCommunicator::reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) {
  const char* name = "reduce_scatter";
  check_usable(name);
  check_chunked_collective(kMpi, name, input, output, size_, /*input_is_whole=*/true);
  TORCH_CHECK(input.is_cpu(), kMpi, ": ", name, ": input is on ", input.device(), "; MPI carries CPU tensors");
  const bool native = host_sums_natively(input.scalar_type());
  const at::Tensor in = native ? input : input.to(at::kFloat);
  at::Tensor out = native ? output : at::empty({output.numel()}, input.options().dtype(at::kFloat));
  MPI_Request req;
  check_rc(MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), count_of(name, in.numel()) / size_,
                                     mpi_type(in.scalar_type()), MPI_SUM, comm_, &req),
           name);
  wait(req, name, in.numel());
  if (op == ReduceOp::Avg) out.div_(size_);
  if (!native) output.copy_(out.view(output.sizes()));
}

void MpiCommunicator::all_gather(const at::Tensor& input, at::Tensor& output) {
  const char* name = "all_gather";
  check_usable(name);
  check_chunked_collective(kMpi, name, input, output, size_, /*input_is_whole=*/false);
  TORCH_CHECK(input.is_cpu(), kMpi, ": ", name, ": input is on ", input.device(), "; MPI carries CPU tensors");
  const bool in_place = is_chunk_of(input, output, rank_);
  const MPI_Datatype type = mpi_type(input.scalar_type());
  MPI_Request req;
  check_rc(MPI_Iallgather(in_place ? MPI_IN_PLACE : input.data_ptr(), count_of(name, output.numel()) / size_, type,
                          output.data_ptr(), count_of(name, output.numel()) / size_, type, comm_, &req),
           name);
  wait(req, name, output.numel());
}

void MpiCommunicator::all_to_all(const at::Tensor& input, at::Tensor& output) {
  const char* name = "all_to_all";
  check_usable(name);
  check_all_to_all(kMpi, input, output, size_);
  TORCH_CHECK(input.is_cpu(), kMpi, ": ", name, ": input is on ", input.device(), "; MPI carries CPU tensors");
  const int chunk = count_of(name, input.numel()) / size_;
  const MPI_Datatype type = mpi_type(input.scalar_type());
  MPI_Request req;
  check_rc(MPI_Ialltoall(input.data_ptr(), chunk, type, output.data_ptr(), chunk, type, comm_, &req), name);
  wait(req, name, input.numel());
}

void MpiCommunicator::broadcast(at::Tensor& tensor, int root) {
  const char* name = "broadcast";
  check_usable(name);
  check_collective_tensor(kMpi, name, "tensor", tensor);
  TORCH_CHECK(tensor.is_cpu(), kMpi, ": ", name, ": tensor is on ", tensor.device(), "; MPI carries CPU tensors");
  TORCH_CHECK(root >= 0 && root < size_, kMpi, ": ", name, ": root must be in [0, ", size_, "), got ", root);
  MPI_Request req;
  check_rc(MPI_Ibcast(tensor.data_ptr(), count_of(name, tensor.numel()), mpi_type(tensor.scalar_type()), root,
                      comm_, &req),
           name);
  wait(req, name, tensor.numel());
}

void MpiCommunicator::barrier() {
  const char* name = "barrier";
  check_usable(name);
  MPI_Request req;
  check_rc(MPI_Ibarrier(comm_, &req), name);
  wait(req, name, 0);
}

}  // namespace distributed
}  // namespace lowbit
