// copy_engine_support (copy_engine_support.h).
#include "copy_engine_support.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include <ATen/ATen.h>

#include "rank_agreement.h"

namespace lowbit {
namespace distributed {

namespace {

// Why this rank rules the copy engines out, as a code and a value all-gathered with it.
enum Reason : int64_t { kNone = 0, kNcclVersion, kDriverVersion, kP2pDisabled, kWindowsDisabled, kCuMemDisabled };

// "2.28.3" from NCCL's version code (major * 10000 + minor * 100 + patch since 2.9).
std::string nccl_version_name(int64_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

std::string describe(int64_t reason, int64_t value) {
  switch (reason) {
    case kNcclVersion: return "NCCL " + nccl_version_name(value) + " (2.28 or later runs all-gathers on the copy engines)";
    case kDriverVersion:
      return "the driver's CUDA " + std::to_string(value / 1000) + "." + std::to_string(value % 1000 / 10) +
             " (NCCL's copy-engine collectives need 12.5 or later)";
    case kP2pDisabled: return "NCCL_P2P_DISABLE=" + std::to_string(value);
    case kWindowsDisabled: return "NCCL_WIN_ENABLE=0";
    case kCuMemDisabled: return "NCCL_CUMEM_ENABLE=0";
    default: return "reason " + std::to_string(reason);
  }
}

// An NCCL variable set to an integer, as NCCL reads it; `fallback` when unset.
int64_t nccl_variable(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : fallback;
}

// What this rank alone can rule out: {reason, value}.
std::pair<int64_t, int64_t> ruled_out_here(int nccl_version, int driver_version) {
  if (nccl_version < 22800) return {kNcclVersion, nccl_version};
  if (driver_version < 12050) return {kDriverVersion, driver_version};
  if (const int64_t p2p = nccl_variable("NCCL_P2P_DISABLE", 0)) return {kP2pDisabled, p2p};
  if (nccl_variable("NCCL_WIN_ENABLE", 1) == 0) return {kWindowsDisabled, 0};
  if (nccl_variable("NCCL_CUMEM_ENABLE", 1) == 0) return {kCuMemDisabled, 0};
  return {kNone, 0};
}

// Equal on two ranks exactly when they share a node: the host name and this boot of it (NCCL's
// host hash is made the same way).
int64_t node_identity() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  const std::string boot_id((std::istreambuf_iterator<char>(boot)), std::istreambuf_iterator<char>());
  return static_cast<int64_t>(std::hash<std::string>{}(std::string(host) + '\n' + boot_id));
}

}  // namespace

CopyEngineSupport copy_engine_support(Communicator& bootstrap, int nccl_version, int driver_version,
                                      const std::function<bool()>& nccl_agrees) {
  const int n = bootstrap.size();
  if (n < 2) return {false, "one rank"};
  const auto [reason, value] = ruled_out_here(nccl_version, driver_version);
  const std::vector<int64_t> all = gather_values(bootstrap, at::kCPU, {reason, value, node_identity()});
  // Every rank holds every rank's answer, so every rank finds the same first reason.
  for (int r = 0; r < n; ++r)
    if (all[3 * r] != kNone) return {false, describe(all[3 * r], all[3 * r + 1]) + " on rank " + std::to_string(r)};
  for (int r = 1; r < n; ++r)
    if (all[3 * r + 2] != all[2]) return {false, "ranks 0 and " + std::to_string(r) + " are on different nodes"};
  const std::vector<int64_t> agreed = gather_values(bootstrap, at::kCPU, {nccl_agrees() ? 1 : 0});
  for (int r = 0; r < n; ++r)
    if (!agreed[static_cast<size_t>(r)])
      return {false, "NCCL has no symmetric memory between this node's GPUs (not every pair reaches the other "
                     "directly) on rank " + std::to_string(r)};
  return {true, ""};
}

}  // namespace distributed
}  // namespace lowbit
