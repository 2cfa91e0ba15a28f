// init_from_env's parser: each launcher's variables, and clear errors for missing or inconsistent ones.
#include "dist_util.h"

namespace lowbit_test {
namespace {

using Env = std::map<std::string, std::string>;

std::string launch_error_of(const Env& e) {
  try {
    ld::parse_launch_env(e);
  } catch (const c10::Error& err) {
    return err.what_without_backtrace();
  }
  return "";
}

TEST(LaunchEnv, ReadsEachLauncher) {
  auto e = ld::parse_launch_env({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.source, "Open MPI");
  e = ld::parse_launch_env({{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}});
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.source, "PMI");
  e = ld::parse_launch_env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.source, "Slurm");
  e = ld::parse_launch_env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}});
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.source, "torchrun");
  e = ld::parse_launch_env({});
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.source, "none");
  // A local rank from another launcher's set fills in one that has none.
  e = ld::parse_launch_env({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(e.local_rank, 1);
}

TEST(LaunchEnv, MissingOrInconsistentValuesAreClearErrors) {
  EXPECT_NE(launch_error_of({{"RANK", "1"}}).find("RANK=1 is set but WORLD_SIZE is not"), std::string::npos) << launch_error_of({{"RANK", "1"}});
  EXPECT_NE(launch_error_of({{"WORLD_SIZE", "4"}}).find("WORLD_SIZE=4 is set but RANK is not"), std::string::npos);
  EXPECT_NE(launch_error_of({{"LOCAL_RANK", "0"}}).find("LOCAL_RANK=0 is set but RANK and WORLD_SIZE are not"), std::string::npos);
  EXPECT_NE(launch_error_of({{"RANK", "x1"}, {"WORLD_SIZE", "2"}}).find("RANK='x1' is not an integer"), std::string::npos);
  EXPECT_NE(launch_error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("RANK=2 is outside [0, WORLD_SIZE=2)"), std::string::npos);
  EXPECT_NE(launch_error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}}).find("SLURM_NTASKS=0 must be >= 1"), std::string::npos);
  const std::string e = launch_error_of({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}});
  EXPECT_NE(e.find("Open MPI says rank 1 of 2 but torchrun says rank 0 of 2"), std::string::npos) << e;
  const std::string l = launch_error_of({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                  {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}});
  EXPECT_NE(l.find("local rank 1 but torchrun says 0"), std::string::npos) << l;
}

TEST(LaunchEnv, CopyEngineGathersOutsideCudaAreRefusedBeforeAnythingCollective) {
  ld::InitOptions o;
  o.copy_engine_gathers = true;  // device_type CPU
  const std::string e = error_of([&] { ld::init_from_env(o); });
  EXPECT_NE(e.find("init_from_env: copy_engine_gathers is NCCL's (device_type CUDA); device_type is cpu"),
            std::string::npos) << e;
}

TEST(LaunchEnv, CopyEngineReductionsOutsideCudaOrWithoutTheGathersAreRefusedBeforeAnythingCollective) {
  ld::InitOptions o;
  o.copy_engine_reductions = true;  // device_type CPU, the gathers unset
  std::string e = error_of([&] { ld::init_from_env(o); });
  EXPECT_NE(e.find("init_from_env: copy_engine_reductions is NCCL's (device_type CUDA); device_type is cpu"),
            std::string::npos) << e;
  o.device_type = c10::DeviceType::CUDA;
  o.copy_engine_gathers = false;
  e = error_of([&] { ld::init_from_env(o); });
  EXPECT_NE(e.find("init_from_env: copy_engine_reductions reduces from the buffers copy_engine_gathers makes: set both"),
            std::string::npos) << e;
}

TEST(LaunchEnv, ThisJobAgreesWithTheCommunicator) {
  const ld::LaunchEnv e = ld::launch_env();
  EXPECT_EQ(e.rank, comm().rank());
  EXPECT_EQ(e.world_size, comm().size());
}

}  // namespace
}  // namespace lowbit_test
