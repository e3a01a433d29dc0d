// qlora-cpp data-parallel training (docs/distributed.md): the launch environment and the process
// group. `qlora train` reads where it sits in a job from the variables torchrun or SLURM set
// (read_dist_env), and with WORLD_SIZE > 1 meets the other ranks through PyTorch's own c10d
// engine: a c10d::TCPStore hosted by rank 0 for the rendezvous, a c10d::ProcessGroupGloo for the
// collectives on CPU, a c10d::ProcessGroupNCCL on CUDA (builds with QLORA_WITH_NCCL; the GPU is
// cuda:LOCAL_RANK). WORLD_SIZE unset or 1 makes no process group (unless QLORA_DIST_FORCE_PG=1):
// every collective below is then the identity, so a single-process run computes exactly what it
// computed before this file existed.
//
// Reference: PyTorch distributed, "env://" initialisation (torch/distributed/rendezvous.py),
// torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), and
// torch/csrc/distributed/c10d/{TCPStore,ProcessGroupGloo,ProcessGroupNCCL}.hpp of the torch wheel the build links.
#pragma once
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace qlora {

/// Where this process sits in a data-parallel job, read once from the environment.
struct DistEnv {
  int rank = 0;                ///< 0 .. world_size-1; rank 0 hosts the store and writes all outputs
  int world_size = 1;          ///< processes in the job; 1 = no process group
  int local_rank = 0;          ///< rank on this node (LOCAL_RANK / SLURM_LOCALID; default: rank)
  std::string master_addr;     ///< host of rank 0's TCPStore ("" when !active())
  int master_port = 29500;     ///< its TCP port (torchrun's default when MASTER_PORT is unset)
  std::string source;          ///< "torchrun" (RANK/WORLD_SIZE), "SLURM" (SLURM_*), "" (single process)
  /// Rendezvous and collective timeout (QLORA_DIST_TIMEOUT_S, default 1800 s as torch's default).
  std::chrono::milliseconds timeout{std::chrono::seconds(1800)};
  /// QLORA_DIST_FORCE_PG=1: make the process group even at world_size 1 (a smoke test of the
  /// backend on one device: every collective then runs, as the identity computed by c10d).
  bool force_pg = false;
  bool active() const { return world_size > 1 || force_pg; }
};

/// Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (torchrun's names); when neither
/// RANK nor WORLD_SIZE is set, SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (srun's names) stand in
/// for the first three; QLORA_DIST_TIMEOUT_S; and QLORA_DIST_FORCE_PG (0 or 1; 1 with neither RANK
/// nor WORLD_SIZE set is rank 0 of 1). `getenv` is std::getenv except in tests.
/// Throws qlora::Error with one line naming the variable when: a value is not a decimal integer in
/// range (WORLD_SIZE >= 1, 0 <= RANK < WORLD_SIZE, 0 <= LOCAL_RANK < WORLD_SIZE, 1 <= MASTER_PORT
/// <= 65535, QLORA_DIST_TIMEOUT_S >= 1, QLORA_DIST_FORCE_PG 0 or 1); only one of RANK / WORLD_SIZE
/// is set; MASTER_ADDR is unset or empty while WORLD_SIZE > 1 or QLORA_DIST_FORCE_PG=1.
DistEnv read_dist_env(const std::function<const char*(const char*)>& getenv = [](const char* n) {
  return std::getenv(n);
});

/// The device this rank trains on: the CPU when no CUDA device is visible; else, in a launched job
/// (env.source set, or env.force_pg), cuda:LOCAL_RANK, made the current CUDA device (torchrun's
/// convention: one GPU per local rank), and in a plain single process the current CUDA device (as
/// before data parallelism existed). Throws qlora::Error naming LOCAL_RANK when it is not below the
/// number of visible CUDA devices.
torch::Device training_device(const DistEnv& env);

/// The collectives data-parallel training needs. Default-constructed (or from a DistEnv with
/// world_size 1): a single process, every collective is the identity and nothing is opened.
class Distributed {
 public:
  Distributed();
  /// With env.active(): rendezvous through a c10d::TCPStore at MASTER_ADDR:MASTER_PORT (rank 0
  /// hosts it and waits for all ranks), then over it a c10d::ProcessGroupNCCL when `device` is CUDA
  /// (its collectives run on `device`, cuda:LOCAL_RANK from training_device; operation timeout
  /// env.timeout), else a c10d::ProcessGroupGloo. The Gloo device binds to GLOO_SOCKET_IFNAME when
  /// set, to MASTER_ADDR when that is a loopback address (one node), else to this host's name.
  /// Throws qlora::Error: `device` is CUDA in a build without NCCL (QLORA_WITH_NCCL), MASTER_PORT
  /// cannot be bound on rank 0 (in use), the other ranks do not join within env.timeout.
  Distributed(const DistEnv& env, const torch::Device& device);
  ~Distributed();
  Distributed(const Distributed&) = delete;
  Distributed& operator=(const Distributed&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  bool is_main() const { return env_.rank == 0; }
  bool active() const { return env_.active(); }
  const DistEnv& env() const { return env_; }

  /// Element-wise sum over ranks of `values`, in place (one float64 allreduce, on the device for
  /// NCCL; exact for integer counts below 2^53).
  void sum(std::vector<double>& values);
  /// Element-wise maximum over ranks of `values`, in place (one float64 allreduce).
  void max(std::vector<double>& values);
  /// Sums the gradients of `params` over ranks in place with ONE flat allreduce: the grads
  /// (undefined = zeros; all of one dtype, fp32 for LoRA) are copied into a contiguous buffer of
  /// sum(numel) elements on their device (for NCCL: the process group's device), summed, and
  /// copied back (undefined grads become defined). Throws qlora::Error when the parameters differ
  /// in dtype or, with NCCL, lie on another device than the process group's.
  void sum_gradients(const std::vector<torch::Tensor>& params);
  /// Every rank's `value`, indexed by rank (one float64 allreduce of 2 × world_size slots, each
  /// rank filling its own two with the 32-bit halves, so the sum is exact). Inactive: {value}.
  std::vector<uint64_t> all_gather(uint64_t value);
  /// Every rank's `value` on rank 0, indexed by rank (through the store, keys "qlora/<key>/<rank>",
  /// `key` unique per call; rank 0 deletes each key once read); the other ranks get {} back.
  /// Inactive: {value}. Throws
  /// qlora::Error on rank 0 when a rank's value does not arrive within the timeout.
  std::vector<std::string> gather_to_main(const std::string& key, const std::string& value);
  /// Blocks until every rank has called it.
  void barrier();
  /// Rank 0 runs `produce` and every rank returns its result (through the store, key `key`, which
  /// must be unique per call). When `produce` throws on rank 0, rank 0 waits (at most 10 s) until
  /// every other rank has read its error, then rethrows; the other ranks throw qlora::RelayedError
  /// "rank 0 failed at <key>: <its message>" (printed by rank 0 alone under --nproc-per-node), so
  /// no rank waits for the timeout. A rank whose read fails says whether the timeout passed or
  /// rank 0's connection closed earlier (rank 0 exited or was killed).
  std::string from_main(const std::string& key, const std::function<std::string()>& produce);

 private:
  struct Impl;
  DistEnv env_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qlora
