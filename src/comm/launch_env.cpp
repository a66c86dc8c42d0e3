#include "zero/launch_env.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>

namespace zero::comm {

namespace {

class EnvReader {
 public:
  EnvReader(const GetEnv& getenv, std::string launcher) : getenv_(getenv), launcher_(std::move(launcher)) {}

  bool has(const char* name) const {
    const char* v = getenv_(name);
    return v && *v;
  }

  std::string str(const char* name) const {
    const char* v = getenv_(name);
    if (!v || !*v)
      throw std::runtime_error("launch environment (" + launcher_ + "): " + name +
                               " is not set" + hint(name));
    return v;
  }

  int integer(const char* name, int min) const {
    std::string s = str(name);
    char* end = nullptr;
    errno = 0;
    long v = std::strtol(s.c_str(), &end, 10);
    if (errno || end == s.c_str() || *end || v < min || v > 1 << 30)
      throw std::runtime_error("launch environment (" + launcher_ + "): " + name + "=" + s +
                               " is not an integer >= " + std::to_string(min));
    return static_cast<int>(v);
  }

  int integer_or(const char* name, int min, int fallback) const {
    return has(name) ? integer(name, min) : fallback;
  }

 private:
  static std::string hint(const std::string& name) {
    if (name == "MASTER_ADDR") return " (the address of the host running rank 0)";
    if (name == "MASTER_PORT") return " (a free TCP port on the host of rank 0)";
    return "";
  }
  const GetEnv& getenv_;
  std::string launcher_;
};

void check_rank(const std::string& launcher, const char* rank_var, int rank, const char* size_var,
                int size) {
  if (rank >= size)
    throw std::runtime_error("launch environment (" + launcher + "): " + rank_var + "=" +
                             std::to_string(rank) + " is not below " + size_var + "=" +
                             std::to_string(size));
}

}  // namespace

LaunchEnv read_launch_env(const GetEnv& getenv) {
  LaunchEnv e;
  auto set = [&](const char* v) { return v && *v; };
  const char* rank_var;
  const char* size_var;
  const char* lrank_var;
  const char* lsize_var;
  if (set(getenv("RANK")) || set(getenv("WORLD_SIZE"))) {
    e.launcher = "torchrun";
    rank_var = "RANK", size_var = "WORLD_SIZE", lrank_var = "LOCAL_RANK", lsize_var = "LOCAL_WORLD_SIZE";
  } else if (set(getenv("OMPI_COMM_WORLD_RANK"))) {
    e.launcher = "mpirun";
    rank_var = "OMPI_COMM_WORLD_RANK", size_var = "OMPI_COMM_WORLD_SIZE",
    lrank_var = "OMPI_COMM_WORLD_LOCAL_RANK", lsize_var = "OMPI_COMM_WORLD_LOCAL_SIZE";
  } else if (set(getenv("SLURM_PROCID"))) {
    e.launcher = "srun";
    rank_var = "SLURM_PROCID", size_var = "SLURM_NTASKS", lrank_var = "SLURM_LOCALID",
    lsize_var = "SLURM_NTASKS_PER_NODE";
  } else {
    e.launcher = "none";
    e.job_id = set(getenv("ZERO_JOB_ID")) ? getenv("ZERO_JOB_ID") : "single";
    return e;
  }
  EnvReader env(getenv, e.launcher);
  e.world_size = env.integer(size_var, 1);
  e.rank = env.integer(rank_var, 0);
  check_rank(e.launcher, rank_var, e.rank, size_var, e.world_size);
  // Local rank/size matter only for same-host fast paths, which also check
  // host ids through the store; a launcher that omits them gives 0 (unknown).
  e.local_rank = env.integer_or(lrank_var, 0, 0);
  e.local_world_size = 0;
  if (env.has(lsize_var)) {
    try {
      e.local_world_size = env.integer(lsize_var, 1);
    } catch (const std::runtime_error&) {
      if (e.launcher != "srun") throw;  // SLURM may write a list like "2(x3)"
    }
  }
  if (e.local_world_size > 0)
    check_rank(e.launcher, lrank_var, e.local_rank, lsize_var, e.local_world_size);
  if (e.world_size > 1 || env.has("MASTER_ADDR")) {
    e.master_addr = env.str("MASTER_ADDR");
    e.master_port = env.integer("MASTER_PORT", 1);
    if (e.master_port > 65535)
      throw std::runtime_error("launch environment (" + e.launcher + "): MASTER_PORT=" +
                               std::to_string(e.master_port) + " is not a TCP port (1-65535)");
  }
  for (const char* id : {"ZERO_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"})
    if (set(getenv(id))) {
      e.job_id = getenv(id);
      break;
    }
  if (e.job_id.empty()) e.job_id = e.master_addr + "_" + std::to_string(e.master_port);
  return e;
}

LaunchEnv read_launch_env() {
  return read_launch_env([](const char* name) { return std::getenv(name); });
}

std::string shm_segment_prefix(const std::string& job_id) {
  std::string safe = job_id;
  for (char& c : safe)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') c = '_';
  return "zero-" + safe;
}

bool says_peer_lost(const std::string& error) {
  // Gloo's TCP pairs (a peer's socket closed, reset, or written to after it
  // closed) and the shared-memory lane's liveness check (shm/lane.cpp).
  for (const char* s : {"Connection closed by peer", "Connection reset by peer", "Broken pipe",
                        ") exited while this rank waited for it"})
    if (error.find(s) != std::string::npos) return true;
  return false;
}

void note_peer_lost(const std::string& error) {
  static std::atomic<bool> noted{false};
  const char* v = std::getenv(kRunNoteFdVariable);
  if (!v || !*v || noted.exchange(true)) return;
  char* end = nullptr;
  const long fd = std::strtol(v, &end, 10);
  if (*end || fd < 0 || fd > 1 << 20) return;
  std::string line = kPeerLostNote + error.substr(0, std::min(error.find('\n'), size_t{400})) + "\n";
  // One write of under PIPE_BUF bytes: whole or not at all, and it never
  // blocks for long (the agent reads it when this process exits).
  [[maybe_unused]] const ssize_t n = write(static_cast<int>(fd), line.data(), line.size());
}

}  // namespace zero::comm
