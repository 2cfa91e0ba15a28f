// parse_launch_env: the launchers' variables, checked for completeness and agreement.
#include "launch_env.h"

#include <c10/util/Exception.h>

#include <unistd.h>  // environ

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <vector>

namespace lowbit {
namespace distributed {

namespace {

struct Source {
  const char* name;
  const char *rank, *size, *local;  // local may be absent (then 0 unless another set gives it)
};

constexpr Source kSources[] = {
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
};

std::optional<int> read_int(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  const std::string& v = it->second;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  TORCH_CHECK(!v.empty() && end && *end == '\0' && errno == 0 && x >= INT32_MIN && x <= INT32_MAX,
              "init_from_env: ", name, "='", v, "' is not an integer");
  return static_cast<int>(x);
}

}  // namespace

LaunchEnv parse_launch_env(const std::map<std::string, std::string>& env) {
  std::vector<LaunchEnv> found;
  for (const Source& s : kSources) {
    const auto rank = read_int(env, s.rank), size = read_int(env, s.size), local = read_int(env, s.local);
    if (!rank && !size) {
      TORCH_CHECK(!local, "init_from_env: ", s.local, "=", *local, " is set but ", s.rank, " and ", s.size,
                  " are not (", s.name, ")");
      continue;
    }
    TORCH_CHECK(rank, "init_from_env: ", s.size, "=", *size, " is set but ", s.rank, " is not (", s.name, ")");
    TORCH_CHECK(size, "init_from_env: ", s.rank, "=", *rank, " is set but ", s.size, " is not (", s.name, ")");
    TORCH_CHECK(*size >= 1, "init_from_env: ", s.size, "=", *size, " must be >= 1");
    TORCH_CHECK(*rank >= 0 && *rank < *size, "init_from_env: ", s.rank, "=", *rank, " is outside [0, ", s.size, "=",
                *size, ")");
    if (local) TORCH_CHECK(*local >= 0 && *local <= *rank, "init_from_env: ", s.local, "=", *local,
                           " must be in [0, ", s.rank, "=", *rank, "]");
    LaunchEnv e;
    e.rank = *rank;
    e.world_size = *size;
    e.local_rank = local ? *local : -1;
    e.source = s.name;
    found.push_back(e);
  }
  if (found.empty()) return LaunchEnv{};
  LaunchEnv first = found[0];
  for (size_t k = 1; k < found.size(); ++k) {
    const LaunchEnv& o = found[k];
    TORCH_CHECK(o.rank == first.rank && o.world_size == first.world_size, "init_from_env: inconsistent launch "
                "variables: ", first.source, " says rank ", first.rank, " of ", first.world_size, " but ", o.source,
                " says rank ", o.rank, " of ", o.world_size);
    if (o.local_rank >= 0 && first.local_rank >= 0)
      TORCH_CHECK(o.local_rank == first.local_rank, "init_from_env: inconsistent launch variables: ", first.source,
                  " says local rank ", first.local_rank, " but ", o.source, " says ", o.local_rank);
    if (first.local_rank < 0) first.local_rank = o.local_rank;
  }
  if (first.local_rank < 0) first.local_rank = 0;  // no launcher said: one process per host is assumed
  return first;
}

LaunchEnv launch_env() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv(*e);
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return parse_launch_env(env);
}

}  // namespace distributed
}  // namespace lowbit
