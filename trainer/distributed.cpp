#include "trainer/distributed.h"

// ProcessGroupGloo.hpp compiles to nothing unless USE_C10D_GLOO is defined (torch's own build
// defines it); the Gloo headers come from Debian's libgloo-dev, the Gloo code is in libtorch_cpu.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <ATen/Parallel.h>
// ProcessGroupNCCL: only in builds with QLORA_WITH_NCCL (CMakeLists.txt, QLORA_NCCL), which also
// define USE_C10D_NCCL and put the wheel's nccl.h on this file's include path. The code is in
// libtorch_cuda.
#ifdef QLORA_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Logging.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <exception>
#include <future>
#include <iomanip>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/format.h"
#include "common/log.h"

namespace qlora {

namespace {

/// `name`'s value as a decimal integer in [lo, hi]; `fallback` when unset. Throws qlora::Error
/// naming the variable otherwise.
int env_int(const std::function<const char*(const char*)>& getenv, const char* name, long lo, long hi, int fallback) {
  const char* v = getenv(name);
  if (!v) return fallback;
  const std::string s(v);
  QLORA_CHECK(!s.empty() && s.find_first_not_of("0123456789") == std::string::npos, name,
              ": expected a non-negative decimal integer, got '", s, "'");
  errno = 0;
  const long n = std::strtol(s.c_str(), nullptr, 10);
  QLORA_CHECK(errno == 0 && n >= lo && n <= hi, name, "=", s, ": must be in ", lo, "..", hi);
  return static_cast<int>(n);
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

}  // namespace

namespace {
/// What made this process a rank, for its first log line: "qlora --nproc-per-node" (our launcher),
/// "RANK/WORLD_SIZE" (torchrun's variables, whoever set them), "SLURM", or "QLORA_DIST_FORCE_PG".
std::string started_by(const DistEnv& env) {
  if (env.source.empty()) return "QLORA_DIST_FORCE_PG";
  if (std::getenv("QLORA_LAUNCHED_NPROC")) return "qlora --nproc-per-node";
  return env.source == "torchrun" ? "RANK/WORLD_SIZE" : env.source;
}
}  // namespace

DistEnv read_dist_env(const std::function<const char*(const char*)>& getenv) {
  DistEnv e;
  const bool torchrun = getenv("RANK") || getenv("WORLD_SIZE");
  const bool slurm = !torchrun && (getenv("SLURM_PROCID") || getenv("SLURM_NTASKS"));
  const char* rank_var = torchrun ? "RANK" : "SLURM_PROCID";
  const char* world_var = torchrun ? "WORLD_SIZE" : "SLURM_NTASKS";
  const char* local_var = torchrun ? "LOCAL_RANK" : "SLURM_LOCALID";
  e.force_pg = env_int(getenv, "QLORA_DIST_FORCE_PG", 0, 1, 0) == 1;
  const auto master_addr = [&](const std::string& why) {
    const char* addr = getenv("MASTER_ADDR");
    QLORA_CHECK(addr && *addr, "MASTER_ADDR: not set while ", why,
                " (the host of rank 0, e.g. 127.0.0.1 on one node; torchrun sets it)");
    e.master_addr = addr;
  };
  if (!torchrun && !slurm) {
    e.timeout = std::chrono::seconds(env_int(getenv, "QLORA_DIST_TIMEOUT_S", 1, INT_MAX, 1800));
    if (e.force_pg) {  // rank 0 of 1, with a process group
      master_addr("QLORA_DIST_FORCE_PG=1");
      e.master_port = env_int(getenv, "MASTER_PORT", 1, 65535, 29500);
    }
    return e;  // a single process
  }
  e.source = torchrun ? "torchrun" : "SLURM";
  QLORA_CHECK(getenv(rank_var), rank_var, ": not set while ", world_var, "=", getenv(world_var),
              " is (set both, or neither for a single process)");
  QLORA_CHECK(getenv(world_var), world_var, ": not set while ", rank_var, "=", getenv(rank_var),
              " is (set both, or neither for a single process)");
  e.world_size = env_int(getenv, world_var, 1, 1 << 20, 1);
  e.rank = env_int(getenv, rank_var, 0, INT_MAX, 0);
  QLORA_CHECK(e.rank < e.world_size, rank_var, "=", e.rank, " must be < ", world_var, "=", e.world_size,
              " (ranks are 0 .. ", world_var, "-1)");
  e.local_rank = env_int(getenv, local_var, 0, e.world_size - 1, e.rank);
  e.master_port = env_int(getenv, "MASTER_PORT", 1, 65535, 29500);
  e.timeout = std::chrono::seconds(env_int(getenv, "QLORA_DIST_TIMEOUT_S", 1, INT_MAX, 1800));
  if (e.world_size > 1)
    master_addr(std::string(world_var) + "=" + std::to_string(e.world_size));
  else if (e.force_pg)
    master_addr("QLORA_DIST_FORCE_PG=1");
  return e;
}

torch::Device training_device(const DistEnv& env) {
  if (!torch::cuda::is_available()) return torch::Device(torch::kCPU);
  if (env.source.empty() && !env.force_pg) return torch::Device(torch::kCUDA);  // a plain single process
  const int n = static_cast<int>(torch::cuda::device_count());
  QLORA_CHECK(env.local_rank < n, env.source == "SLURM" ? "SLURM_LOCALID" : "LOCAL_RANK", "=", env.local_rank,
              ": this node has ", n, " visible CUDA device(s) (one per local rank: cuda:LOCAL_RANK; check "
              "CUDA_VISIBLE_DEVICES and --nproc-per-node)");
  const torch::Device d(torch::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(d);  // the kernels launch on the current device
  return d;
}

struct Distributed::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> pg;  ///< ProcessGroupGloo (CPU) or ProcessGroupNCCL (CUDA)
  torch::Device device{torch::kCPU};     ///< where the collectives' tensors must lie (NCCL: the GPU)
  ~Impl() {
    // NCCL: release the communicators before the store goes (torch warns at exit otherwise). While
    // an error unwinds (a peer may be lost, a collective may never finish) abort them instead:
    // shutdown would wait for the pending work.
    if (pg && device.is_cuda()) {
      try {
        if (std::uncaught_exceptions() > 0)
          pg->abort();
        else
          pg->shutdown();
      } catch (const std::exception& e) {
        log::warn("distributed: NCCL shutdown: ", first_line(e.what()));
      }
    }
  }
};

namespace {
/// c10's own log lines (a "[W ... TCPStore.cpp] ... retrying" and the exception's backtrace per
/// connection attempt) silenced while it lives, unless the user set TORCH_CPP_LOG_LEVEL: the
/// rendezvous says what happens in its own lines, and a failure is one qlora::Error.
class QuietC10Log {
 public:
  QuietC10Log() : saved_(FLAGS_caffe2_log_level) {
    if (!std::getenv("TORCH_CPP_LOG_LEVEL")) FLAGS_caffe2_log_level = 3;  // FATAL only
  }
  ~QuietC10Log() { FLAGS_caffe2_log_level = saved_; }
  QuietC10Log(const QuietC10Log&) = delete;
  QuietC10Log& operator=(const QuietC10Log&) = delete;

 private:
  int saved_;
};

/// The store key every rank adds 1 to once it is connected; rank 0 waits for WORLD_SIZE.
constexpr const char* kJoinedKey = "qlora/joined";
constexpr const char* kWorldSizeKey = "qlora/world_size";  ///< rank 0's WORLD_SIZE, set before any join
constexpr const char* kJoinErrorKey = "qlora/join_error";  ///< why a rank refused to join: rank 0 fails with it

/// When a waiting rank says that it still waits: 10 s in, then every 60 s.
bool say_still_waiting(std::chrono::steady_clock::duration waited, int64_t* said) {
  const int64_t s = std::chrono::duration_cast<std::chrono::seconds>(waited).count();
  const int64_t due = *said == 0 ? 10 : *said + 60;
  if (s < due) return false;
  *said = s;
  return true;
}

/// The TCPStore rendezvous at MASTER_ADDR:MASTER_PORT (torch's init_method="env://"): rank 0 hosts
/// it and waits until all WORLD_SIZE ranks have joined; the others connect to it. Each waiting rank
/// says so 10 s in and every 60 s after (rank 0: how many ranks are still missing). Rank 0 gives up
/// after QLORA_DIST_TIMEOUT_S; the others after torch's connection attempts (a first one of up to
/// QLORA_DIST_TIMEOUT_S, a random delay, one more). Throws qlora::Error, one line naming
/// MASTER_PORT (rank 0 cannot listen), MASTER_ADDR (this rank cannot connect), or the ranks that
/// did not join.
c10::intrusive_ptr<c10d::Store> rendezvous(const DistEnv& env, const std::string& where) {
  using clock = std::chrono::steady_clock;
  const int64_t timeout_s = env.timeout.count() / 1000;
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(env.master_port);
  so.isServer = env.rank == 0;
  so.numWorkers = env.world_size;
  so.waitWorkers = false;  // the joins are counted below, saying who is missing
  so.timeout = env.timeout;
  const QuietC10Log quiet;
  c10::intrusive_ptr<c10d::Store> store;
  if (env.rank == 0) {
    try {
      store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
    } catch (const std::exception& e) {
      fail("MASTER_PORT=", env.master_port, ": rank 0 cannot host the rendezvous at ", where,
           " (port in use, or MASTER_ADDR is not this host?): ", first_line(e.what()));
    }
    store->set(kWorldSizeKey, std::to_string(env.world_size));
    store->add("qlora/rank/0", 1);
    store->add(kJoinedKey, 1);
    const auto start = clock::now();
    int64_t said = 0;
    for (int64_t joined = 1;; joined = store->add(kJoinedKey, 0)) {
      // A rank that refused to join (another WORLD_SIZE, a RANK taken) said why: rank 0 fails at
      // once with it instead of waiting out the timeout for a rank that never comes.
      if (store->check({kJoinErrorKey}))
        fail("distributed: ", store->get_to_str(kJoinErrorKey), " (rendezvous ", where, ")");
      if (joined >= env.world_size) break;
      const int64_t missing = env.world_size - joined;
      QLORA_CHECK(clock::now() - start < env.timeout, "distributed: not all ", env.world_size,
                  " ranks joined the rendezvous at ", where, " within ", timeout_s, " s (QLORA_DIST_TIMEOUT_S): ",
                  joined, " did, ", missing, " did not (were they started, with this MASTER_ADDR, MASTER_PORT and "
                  "WORLD_SIZE?)");
      if (say_still_waiting(clock::now() - start, &said))
        log::info("distributed: rank 0 waiting for ", missing, " more rank", missing == 1 ? "" : "s", " to join the "
                  "rendezvous at ", where, " (", joined, " of ", env.world_size, " joined, ", said, " s; gives up after ",
                  timeout_s, " s, QLORA_DIST_TIMEOUT_S)");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return store;
  }
  // A client connects, retrying until rank 0 listens or the timeout: in a thread, so that this
  // one can say that it waits.
  auto connecting = std::async(std::launch::async, [&] { return c10::make_intrusive<c10d::TCPStore>(env.master_addr, so); });
  const auto start = clock::now();
  int64_t said = 0;
  while (connecting.wait_for(std::chrono::milliseconds(200)) != std::future_status::ready)
    if (say_still_waiting(clock::now() - start, &said))
      log::warn("distributed: rank ", env.rank, " waiting for rank 0's rendezvous at ", where, " (", said,
                " s so far; torch's connection attempts wait up to QLORA_DIST_TIMEOUT_S=", timeout_s, " s each)");
  try {
    store = connecting.get();
  } catch (const std::exception& e) {
    const auto waited = std::chrono::duration_cast<std::chrono::seconds>(clock::now() - start).count();
    fail("MASTER_ADDR=", env.master_addr, ": rank ", env.rank, " cannot reach rank 0's rendezvous at ", where,
         " (gave up after ", waited, " s, QLORA_DIST_TIMEOUT_S=", timeout_s, " s per attempt; is rank 0 started, "
         "with this MASTER_ADDR and MASTER_PORT?): ", first_line(e.what()));
  }
  // Who this rank claims to be, checked against rank 0 before it counts as joined (trial 18: another
  // WORLD_SIZE on one rank, a RANK given twice, or a second job on a running job's MASTER_PORT
  // each waited out the timeout, then blamed a "lost rank").
  auto refuse = [&](const std::string& why) {
    try {
      store->set(kJoinErrorKey, why);
    } catch (const std::exception&) {  // rank 0 is gone: this rank's own error still says why
    }
    fail("distributed: ", why, " (rendezvous ", where, ")");
  };
  const std::string ws0 = store->get_to_str(kWorldSizeKey);
  if (ws0 != std::to_string(env.world_size))
    refuse("rank " + std::to_string(env.rank) + " has WORLD_SIZE=" + std::to_string(env.world_size) + " but rank 0 has " +
           "WORLD_SIZE=" + ws0 + ": every rank of a job needs the same WORLD_SIZE");
  if (store->add("qlora/rank/" + std::to_string(env.rank), 1) > 1)
    refuse("RANK=" + std::to_string(env.rank) + " joined twice: another process of this rendezvous already is rank " +
           std::to_string(env.rank) + " (a RANK given to two processes, or MASTER_PORT=" + std::to_string(env.master_port) +
           " is another running job's)");
  store->add(kJoinedKey, 1);
  // Then wait, as rank 0 does, until all have joined (or one refused): the process group is made
  // only by a complete job, so a missing rank is said here in one line, not as Gloo's timeout.
  const auto joined_start = clock::now();
  try {
    for (int64_t joined = store->add(kJoinedKey, 0); joined < env.world_size; joined = store->add(kJoinedKey, 0)) {
      if (store->check({kJoinErrorKey}))
        fail("distributed: ", store->get_to_str(kJoinErrorKey), " (rendezvous ", where, ")");
      QLORA_CHECK(clock::now() - joined_start < env.timeout, "distributed: rank ", env.rank, ": not all ",
                  env.world_size, " ranks joined the rendezvous at ", where, " within ", timeout_s,
                  " s (QLORA_DIST_TIMEOUT_S): ", joined, " did, ", env.world_size - joined,
                  " did not (were they started, with this MASTER_ADDR, MASTER_PORT and WORLD_SIZE?)");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("distributed: rank ", env.rank, " lost rank 0's rendezvous at ", where, " while the ranks joined (rank 0 "
         "exited or was killed; its log says why): ", first_line(e.what()));
  }
  return store;
}
}  // namespace

Distributed::Distributed() = default;
Distributed::~Distributed() = default;

Distributed::Distributed(const DistEnv& env, const torch::Device& device) : env_(env) {
  if (!env_.active()) return;
#ifndef QLORA_WITH_NCCL
  QLORA_CHECK(!device.is_cuda(), "distributed: WORLD_SIZE=", env_.world_size, " on ", device.str(),
              ": this build has no NCCL backend (configure with a CUDA torch, nvcc and nccl.h: QLORA_NCCL, "
              "docs/distributed.md); run the ranks on CPU (CUDA_VISIBLE_DEVICES=) or as a single process");
#endif
  impl_ = std::make_unique<Impl>();
  impl_->device = device;
  const std::string where = env_.master_addr + ":" + std::to_string(env_.master_port);
  impl_->store = rendezvous(env_, where);
#ifdef QLORA_WITH_NCCL
  if (device.is_cuda()) {
    QLORA_CHECK(device.has_index(), "distributed: internal: the NCCL device has no index (training_device)");
    auto nopts = c10d::ProcessGroupNCCL::Options::create();
    nopts->timeout = env_.timeout;
    try {
      impl_->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl_->store, env_.rank, env_.world_size, nopts);
    } catch (const std::exception& e) {
      fail("distributed: rank ", env_.rank, " could not create the NCCL process group (", env_.world_size,
           " ranks, rendezvous ", where, ", ", device.str(), "): ", first_line(e.what()));
    }
    log::info("distributed: rank ", env_.rank, " of ", env_.world_size, " (local rank ", env_.local_rank, ", from ",
              started_by(env_), "), NCCL on ", device.str(),
              ", rendezvous ", where);
    return;
  }
#endif
  auto opts = c10d::ProcessGroupGloo::Options::create(env_.timeout);
  try {
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else if (is_loopback(env_.master_addr))
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(env_.master_addr));
    else
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, env_.rank, env_.world_size, opts);
  } catch (const std::exception& e) {
    fail("distributed: rank ", env_.rank, " could not connect the Gloo process group (", env_.world_size,
         " ranks, rendezvous ", where, "): ", first_line(e.what()));
  }
  log::info("distributed: rank ", env_.rank, " of ", env_.world_size, " (local rank ", env_.local_rank, ", from ",
            started_by(env_), "), Gloo on CPU, rendezvous ", where);
  // torch's default is every core for every process: N ranks on one host then oversubscribe it N
  // times (torchrun and qlora --nproc-per-node set 1 per rank).
  if (env_.world_size > 1 && !std::getenv("OMP_NUM_THREADS"))
    log::warn("distributed: OMP_NUM_THREADS is not set, so each rank computes with all ", at::get_num_threads(),
              " threads torch found on its host; with several ranks on a host set OMP_NUM_THREADS to the cores of "
              "the host / its ranks, as torchrun (1) and qlora --nproc-per-node (1) do");
}

namespace {
/// Why a store read of `key` from `peer`, started at `since`, failed: the timeout when the read
/// waited that long, else the connection's end after the seconds it did wait (the peer exited or
/// was killed; its own log says why), not a timeout it never reached.
std::string why_no_value(const DistEnv& env, const std::string& peer, const std::string& key,
                         std::chrono::steady_clock::time_point since) {
  const auto waited_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since).count();
  const int64_t timeout_ms = env.timeout.count();
  std::ostringstream os;
  if (waited_ms + 1000 >= timeout_ms)
    os << "nothing within " << timeout_ms / 1000 << " s (QLORA_DIST_TIMEOUT_S; " << peer << " is stuck or was stopped?)";
  else
    os << peer << "'s connection closed after " << std::fixed << std::setprecision(1) << waited_ms / 1000.0
       << " s, before this rank got '" << key << "': " << peer << " exited or was killed (its log says why)";
  return os.str();
}

/// Runs one collective; a failure (a peer closed its connection: exited or was killed; or the
/// timeout) becomes one qlora::Error naming this rank and the rank(s) it lost.
template <typename F>
void collective(const DistEnv& env, const char* what, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    const std::string lost = env.world_size == 2 ? "rank " + std::to_string(1 - env.rank)
                                                 : "another rank (see their logs)";
    fail("distributed: ", what, " failed on rank ", env.rank, " of ", env.world_size, ": lost ", lost,
         " (it exited, was killed, or did not answer within ", env.timeout.count() / 1000,
         " s, QLORA_DIST_TIMEOUT_S): ", first_line(e.what()));
  }
}

/// `values` reduced over ranks in place: a float64 tensor over them (a copy on the GPU for NCCL,
/// which reduces device memory only; the copy back waits for the collective on the current stream).
void allreduce_doubles(const DistEnv& env, c10d::Backend& pg, const torch::Device& device,
                       std::vector<double>& values, c10d::ReduceOp op) {
  if (values.empty()) return;
  const torch::Tensor host = torch::from_blob(values.data(), {static_cast<int64_t>(values.size())}, torch::kFloat64);
  std::vector<at::Tensor> t{device.is_cuda() ? host.to(device) : host};
  c10d::AllreduceOptions o;
  o.reduceOp = op;
  collective(env, "allreduce", [&] { pg.allreduce(t, o)->wait(); });
  if (device.is_cuda()) host.copy_(t[0]);
}
}  // namespace

void Distributed::sum(std::vector<double>& values) {
  if (active()) allreduce_doubles(env_, *impl_->pg, impl_->device, values, c10d::ReduceOp::SUM);
}

void Distributed::max(std::vector<double>& values) {
  if (active()) allreduce_doubles(env_, *impl_->pg, impl_->device, values, c10d::ReduceOp::MAX);
}

void Distributed::sum_gradients(const std::vector<torch::Tensor>& params) {
  if (!active() || params.empty()) return;
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& p : params) {
    QLORA_CHECK(p.scalar_type() == params[0].scalar_type(), "distributed: trainable parameters of mixed dtypes (",
                p.scalar_type(), " and ", params[0].scalar_type(), ") cannot share one allreduce buffer");
    QLORA_CHECK(!impl_->device.is_cuda() || p.device() == impl_->device, "distributed: a trainable parameter on ",
                p.device().str(), " while the NCCL process group is on ", impl_->device.str());
    flat.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
  }
  std::vector<at::Tensor> buf{torch::cat(flat)};
  collective(env_, "gradient allreduce", [&] { impl_->pg->allreduce(buf)->wait(); });
  torch::NoGradGuard ng;
  int64_t at = 0;
  for (const torch::Tensor& p : params) {
    torch::Tensor g = buf[0].narrow(0, at, p.numel()).view(p.sizes());
    if (p.grad().defined())
      p.mutable_grad().copy_(g);
    else
      p.mutable_grad() = g.clone();
    at += p.numel();
  }
}

std::vector<uint64_t> Distributed::all_gather(uint64_t value) {
  if (!active()) return {value};
  std::vector<double> slots(2 * static_cast<size_t>(env_.world_size), 0.0);
  slots[2 * env_.rank] = static_cast<double>(value >> 32);
  slots[2 * env_.rank + 1] = static_cast<double>(value & 0xffffffffu);
  allreduce_doubles(env_, *impl_->pg, impl_->device, slots, c10d::ReduceOp::SUM);
  std::vector<uint64_t> out(env_.world_size);
  for (int r = 0; r < env_.world_size; ++r)
    out[r] = (static_cast<uint64_t>(slots[2 * r]) << 32) | static_cast<uint64_t>(slots[2 * r + 1]);
  return out;
}

std::vector<std::string> Distributed::gather_to_main(const std::string& key, const std::string& value) {
  if (!active()) return {value};
  if (!is_main()) {
    impl_->store->set("qlora/" + key + "/" + std::to_string(env_.rank), value);
    return {};
  }
  std::vector<std::string> out{value};
  for (int r = 1; r < env_.world_size; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const std::string k = "qlora/" + key + "/" + std::to_string(r);
      out.push_back(impl_->store->get_to_str(k));
      impl_->store->deleteKey(k);  // the store lives as long as the job: keep it small
    } catch (const std::exception& e) {
      fail("distributed: rank 0 got no '", key, "' from rank ", r, ": ",
           why_no_value(env_, "rank " + std::to_string(r), key, t0), ": ", first_line(e.what()));
    }
  }
  return out;
}

void Distributed::barrier() {
  if (!active()) return;
  c10d::BarrierOptions o;
  if (impl_->device.is_cuda()) o.device_ids = {impl_->device.index()};  // NCCL: the barrier's allreduce runs there
  collective(env_, "barrier", [&] { impl_->pg->barrier(o)->wait(); });
}

std::string Distributed::from_main(const std::string& key, const std::function<std::string()>& produce) {
  if (!active()) return produce();
  const std::string k = "qlora/" + key;
  if (is_main()) {
    std::string value;
    try {
      value = produce();
    } catch (const std::exception& e) {
      impl_->store->set(k, "E" + first_line(e.what()));
      // The store lives in this process: stay until every rank has read the error (each says so),
      // at most 10 s, so a slower rank relays it instead of finding the store gone.
      try {
        std::vector<std::string> read;
        for (int r = 1; r < env_.world_size; ++r) read.push_back(k + "/read/" + std::to_string(r));
        impl_->store->wait(read, std::chrono::seconds(10));
      } catch (const std::exception&) {
        // a rank that is gone or slower: this rank's error stands as it is
      }
      throw;
    }
    impl_->store->set(k, "V" + value);
    return value;
  }
  std::string got;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    got = impl_->store->get_to_str(k);
  } catch (const std::exception& e) {
    fail("distributed: rank ", env_.rank, " got no '", key, "' from rank 0: ", why_no_value(env_, "rank 0", key, t0), ": ",
         first_line(e.what()));
  }
  if (got.empty() || got[0] != 'V') {
    try {
      impl_->store->set(k + "/read/" + std::to_string(env_.rank), "1");  // rank 0 may exit now
    } catch (const std::exception&) {
      // rank 0 is gone already
    }
    throw RelayedError("distributed: rank 0 failed at " + key + ": " + got.substr(got.empty() ? 0 : 1));
  }
  return got.substr(1);
}

}  // namespace qlora
