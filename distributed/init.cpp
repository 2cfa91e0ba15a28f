// init_from_env: launcher variables -> MPI -> the communicator of the requested device type.
#include "init.h"

#include <cstdio>
#include <cstdlib>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <lowbit/build_config.h>

#include "mpi_communicator.h"
#if LOWBIT_WITH_NCCL
#include "nccl_communicator.h"
#endif

namespace lowbit {
namespace distributed {

std::shared_ptr<Communicator> init_from_env(const InitOptions& options) {
  // Before anything collective, so that every rank refuses alike.
  for (const auto& [name, option] : {std::pair{"copy_engine_gathers", options.copy_engine_gathers},
                                     std::pair{"copy_engine_reductions", options.copy_engine_reductions}})
    TORCH_CHECK(option != true || options.device_type == c10::DeviceType::CUDA, "init_from_env: ", name,
                " is NCCL's (device_type CUDA); device_type is ", options.device_type);
  TORCH_CHECK(!(options.copy_engine_reductions == true && options.copy_engine_gathers == false),
              "init_from_env: copy_engine_reductions reduces from the buffers copy_engine_gathers makes: set both");
  const LaunchEnv env = launch_env();
  init_mpi();
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  TORCH_CHECK(env.source == "none" || (env.rank == rank && env.world_size == size), "init_from_env: the ",
              env.source, " variables say rank ", env.rank, " of ", env.world_size, " but MPI says rank ", rank,
              " of ", size, "; start the job with mpirun or srun (lowbit's communicators are bootstrapped by MPI)");
  MpiOptions mo;
  mo.timeout_s = options.timeout_s;
  mo.abort_on_failure = options.abort_on_failure;
  auto mpi = std::make_shared<MpiCommunicator>(MPI_COMM_WORLD, mo);
  if (options.device_type == c10::DeviceType::CPU) return mpi;
  TORCH_CHECK(options.device_type == c10::DeviceType::CUDA, "init_from_env: device_type ", options.device_type,
              " is not supported; use CPU (MPI) or CUDA (NCCL)");
#if LOWBIT_WITH_NCCL
  const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  const int devices = static_cast<int>(guard->deviceCount());
  TORCH_CHECK(devices > 0, "init_from_env: device_type CUDA but no CUDA device is visible on rank ", rank);
  const int device = env.local_rank % devices;
  guard->setDevice(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
  NcclOptions no;
  no.timeout_s = options.timeout_s;
  no.copy_engine_gathers = options.copy_engine_gathers;
  no.copy_engine_reductions = options.copy_engine_reductions;
  return std::make_shared<NcclCommunicator>(mpi, device, no);
#else
  TORCH_CHECK(false, "init_from_env: device_type CUDA needs NCCL, and this build of lowbit has none (LOWBIT_NCCL)");
#endif
}

void abort_job(int status, const std::string& why) {
  int initialized = 0, finalized = 0, rank = -1, size = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const bool live = initialized && !finalized;
  if (live) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::fprintf(stderr, "lowbit: rank %d of %d ends the job: %s\n", rank, size, why.c_str());
  } else {
    std::fprintf(stderr, "lowbit: %s\n", why.c_str());
  }
  std::fflush(stderr);
  if (live) MPI_Abort(MPI_COMM_WORLD, status);
  std::_Exit(status);
}

}  // namespace distributed
}  // namespace lowbit
