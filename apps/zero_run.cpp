// zero-run: start the ranks of a program, like torchrun.
//
//   zero-run -n 2 [--master-port P] [--timeout S] -- ./prog args...        this host
//   zero-run --nnodes H --node-rank K -n N --master-addr A --master-port P -- ./prog ...
//                                                          one host of H (run on each)
//   zero-run --hostfile FILE [--host-exec TEMPLATE] [--master-addr A] -- ./prog ...
//                                    every host of a DeepSpeed hostfile, from here
//
// Each rank gets the torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) plus ZERO_JOB_ID,
// and its output lines are prefixed with "[rank r] ". When any rank fails
// (non-zero exit or a signal), the others get SIGTERM and, 3 s later,
// SIGKILL, and zero-run exits non-zero: a dead rank never leaves the job
// hanging. On several hosts the agents (one zero-run per host) tell each
// other through node 0's (launch/job_control.h), so a failure on one host
// stops every host's ranks, with a message naming host and rank. At the end
// it removes any shared-memory segment of the job a killed rank left.
// SIGINT/SIGTERM sent to zero-run are forwarded to every rank.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/shm/segment.h"
#include "launch/hostfile.h"
#include "launch/job_control.h"
#include "zero/launch_env.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kGrace = std::chrono::seconds(3);  // SIGTERM -> SIGKILL

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

constexpr const char* kUsage =
    "usage: zero-run -n N [--master-addr A] [--master-port P] [--timeout SECONDS] -- prog [args...]\n"
    "       zero-run --nnodes H --node-rank K -n N --master-addr A --master-port P [...] -- prog [args...]\n"
    "       zero-run --hostfile FILE [--host-exec TEMPLATE] [--master-addr A] [--master-port P] -- prog [args...]\n";

// Errors: stderr, exit 2. --help: stdout, exit 0 (it was asked for).
[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "zero-run: %s\n%s", why, kUsage);
  std::exit(2);
}

[[noreturn]] void help() {
  std::printf("%s"
              "Starts N ranks of prog on this host with torchrun's variables (RANK, WORLD_SIZE,\n"
              "LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT), or a job's\n"
              "ranks on several hosts; when one rank fails every rank of the job is stopped\n"
              "and zero-run exits non-zero.\n"
              "  -n N                ranks to start on this host (also --nproc, --nproc-per-node)\n"
              "  --master-addr A     rendezvous address (default 127.0.0.1; with --hostfile the first host)\n"
              "  --master-port P     rendezvous port (default: a free one); the agents of a\n"
              "                      several-host job also use P+1 on node 0\n"
              "  --timeout SECONDS   stop the whole job after this long (exit 124)\n"
              "  --nnodes H          hosts in the job (torchrun's); run zero-run on each with\n"
              "  --node-rank K       this host's index, 0 being MASTER_ADDR's host; ranks are\n"
              "                      K*N .. K*N+N-1 unless --rank-offset/--world-size say otherwise\n"
              "  --hostfile FILE     DeepSpeed's hostfile (\"HOST slots=N\" lines): starts one\n"
              "                      zero-run per host, through\n"
              "  --host-exec T       the command that runs a program on a host, {host} replaced\n"
              "                      (default \"ssh -o BatchMode=yes {host}\"; e.g. \"ip netns exec {host}\")\n"
              "  -h, --help          this text\n",
              kUsage);
  std::exit(0);
}

int parse_int(const char* s, const char* what, int min, int max) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (end == s || *end || v < min || v > max) {
    std::string msg = std::string(what) + " must be an integer in [" + std::to_string(min) + ", " +
                      std::to_string(max) + "], got '" + s + "'";
    usage(msg.c_str());
  }
  return static_cast<int>(v);
}

// A port the OS says is free now (the usual race with other binders applies,
// as with torchrun's own choice).
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("zero-run: cannot find a free port");
    std::exit(1);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// One output stream of one rank, forwarded line by line with a prefix.
struct Stream {
  int fd = -1;
  int out_fd = 1;
  std::string prefix;
  std::string pending;

  void emit(const std::string& line) {
    std::string s = prefix + line;
    for (size_t off = 0; off < s.size();) {
      ssize_t n = write(out_fd, s.data() + off, s.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
  }
  // Returns false at EOF.
  bool pump() {
    char buf[65536];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) {
      if (n < 0 && errno == EINTR) return true;
      if (!pending.empty()) emit(pending + "\n");
      pending.clear();
      close(fd);
      fd = -1;
      return false;
    }
    pending.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1)
      emit(pending.substr(start, nl - start + 1));
    pending.erase(0, start);
    return true;
  }
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
};

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

// Ranks unlink their shared-memory segments once every rank has mapped
// them; a rank killed during that setup window can leave one behind. The
// job is over here, so anything with its prefix goes.
void remove_shared_memory_of(const std::string& job_id) {
  const std::string dir = zero::comm::shm::Segment::directory();
  const std::string prefix = zero::comm::shm_segment_prefix(job_id);
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  while (dirent* e = readdir(d))
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) unlink((dir + "/" + e->d_name).c_str());
  closedir(d);
}

namespace {

struct Options {
  int nproc = 0, port = 0, timeout_s = 0;
  std::string addr;
  int nnodes = 1, node_rank = 0;
  int rank_offset = -1, world_size = -1;  // -1: node_rank * nproc, nnodes * nproc
  std::string hostfile, host_exec = "ssh -o BatchMode=yes {host}", host_name, job_id, chdir;
  std::vector<std::string> env;  // K=V set for every rank (passed to remote agents)
  int prog = 0;                  // argv index of the program
};

Options parse(int argc, char** argv) {
  Options o;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) {
      if (i + 1 >= argc) usage((std::string(flag) + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--") { ++i; break; }
    if (a == "-n" || a == "--nproc" || a == "--nproc-per-node") o.nproc = parse_int(value("-n"), "-n", 1, 1024);
    else if (a == "--master-port") o.port = parse_int(value("--master-port"), "--master-port", 1, 65534);
    else if (a == "--master-addr") o.addr = value("--master-addr");
    else if (a == "--timeout") o.timeout_s = parse_int(value("--timeout"), "--timeout", 1, 1 << 30);
    else if (a == "--nnodes") o.nnodes = parse_int(value("--nnodes"), "--nnodes", 1, 4096);
    else if (a == "--node-rank") o.node_rank = parse_int(value("--node-rank"), "--node-rank", 0, 4095);
    else if (a == "--rank-offset") o.rank_offset = parse_int(value("--rank-offset"), "--rank-offset", 0, 1 << 30);
    else if (a == "--world-size") o.world_size = parse_int(value("--world-size"), "--world-size", 1, 1 << 30);
    else if (a == "--hostfile") o.hostfile = value("--hostfile");
    else if (a == "--host-exec") o.host_exec = value("--host-exec");
    else if (a == "--host-name") o.host_name = value("--host-name");
    else if (a == "--job-id") o.job_id = value("--job-id");
    else if (a == "--chdir") o.chdir = value("--chdir");
    else if (a == "--env") o.env.push_back(value("--env"));
    else if (a == "-h" || a == "--help") help();
    else usage(("unknown option " + a).c_str());
  }
  if (i >= argc) usage("no program given after --");
  o.prog = i;
  if (!o.hostfile.empty()) {
    if (o.nproc || o.nnodes > 1) usage("--hostfile gives the hosts and their slots: no -n or --nnodes with it");
    return o;
  }
  if (o.nproc < 1) usage("-n N is required");
  if (o.node_rank >= o.nnodes) usage("--node-rank must be less than --nnodes");
  if (o.nnodes > 1 && (o.addr.empty() || o.port == 0))
    usage("--nnodes > 1 needs --master-addr and --master-port (the same on every host)");
  if (o.rank_offset < 0) o.rank_offset = o.node_rank * o.nproc;
  if (o.world_size < 0) o.world_size = o.nnodes * o.nproc;
  if (o.rank_offset + o.nproc > o.world_size) usage("--rank-offset + -n exceeds --world-size");
  if (o.addr.empty()) o.addr = "127.0.0.1";
  return o;
}

std::string this_host_name() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// Variables a remote agent needs to start its ranks as this one would
// (ssh passes no environment; DeepSpeed's launcher exports the same kinds).
std::vector<std::string> forwarded_env() {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    for (const char* p : {"ZERO_", "GLOO_", "NCCL_", "TORCH_", "OMP_NUM_THREADS=", "CUDA_VISIBLE_DEVICES=",
                          "LD_LIBRARY_PATH=", "PYTHONPATH="})
      if (kv.rfind(p, 0) == 0) out.push_back(kv);
  }
  return out;
}

struct Child {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // K=V
  std::string prefix;            // for its output lines
  std::string label;             // "rank 3", "host b (node 1)"
};

pid_t spawn(const Child& c, std::vector<Stream>& streams) {
  int out[2], err[2];
  if (pipe(out) || pipe(err)) { std::perror("zero-run: pipe"); std::exit(1); }
  pid_t pid = fork();
  if (pid < 0) { std::perror("zero-run: fork"); std::exit(1); }
  if (pid == 0) {
    setpgid(0, 0);                     // its own group: we signal it and its children
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // and it dies with us
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]), close(out[1]), close(err[0]), close(err[1]);
    for (const auto& kv : c.env) {
      const size_t eq = kv.find('=');
      if (eq != std::string::npos) setenv(kv.substr(0, eq).c_str(), kv.c_str() + eq + 1, 1);
    }
    std::vector<char*> args;
    for (const auto& a : c.argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "zero-run: cannot execute %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  close(out[1]), close(err[1]);
  streams.push_back({out[0], 1, c.prefix, {}});
  streams.push_back({err[0], 2, c.prefix, {}});
  return pid;
}

// This host's ranks (local or one node of several).
std::vector<Child> local_ranks(const Options& o, char** argv, const std::string& job_id) {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const int omp_threads = static_cast<int>(std::max(1L, cores / o.nproc));
  std::vector<Child> out;
  for (int r = 0; r < o.nproc; ++r) {
    const int rank = o.rank_offset + r;
    Child c;
    for (int k = o.prog; argv[k]; ++k) c.argv.push_back(argv[k]);
    c.env = o.env;
    auto set = [&](const char* k, const std::string& v) { c.env.push_back(std::string(k) + "=" + v); };
    set("RANK", std::to_string(rank));
    set("LOCAL_RANK", std::to_string(r));
    set("WORLD_SIZE", std::to_string(o.world_size));
    set("LOCAL_WORLD_SIZE", std::to_string(o.nproc));
    set("GROUP_RANK", std::to_string(o.node_rank));
    set("MASTER_ADDR", o.addr);
    set("MASTER_PORT", std::to_string(o.port));
    set("ZERO_JOB_ID", job_id);
    // Share the cores between the ranks unless told otherwise (torchrun
    // sets 1; an even share keeps intra-op parallelism on big hosts).
    if (!std::getenv("OMP_NUM_THREADS")) set("OMP_NUM_THREADS", std::to_string(omp_threads));
    c.prefix = "[rank " + std::to_string(rank) + "] ";
    c.label = "rank " + std::to_string(rank);
    out.push_back(std::move(c));
  }
  return out;
}

// One zero-run agent per host of the hostfile, each started through --host-exec.
std::vector<Child> host_agents(const Options& o, char** argv, const std::string& job_id) {
  const auto hosts = zero::launch::read_hostfile(o.hostfile);
  int world = 0;
  for (const auto& h : hosts) world += h.slots;
  char self[4096] = {}, cwd[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) < 0 || !getcwd(cwd, sizeof(cwd) - 1))
    throw std::runtime_error("cannot find zero-run's own path or the working directory");
  const auto env = forwarded_env();
  std::vector<Child> out;
  int offset = 0;
  for (size_t k = 0; k < hosts.size(); ++k) {
    std::vector<std::string> agent{self, "--nnodes", std::to_string(hosts.size()), "--node-rank", std::to_string(k),
                                   "-n", std::to_string(hosts[k].slots), "--rank-offset", std::to_string(offset),
                                   "--world-size", std::to_string(world), "--master-addr", o.addr,
                                   "--master-port", std::to_string(o.port), "--host-name", hosts[k].host,
                                   "--job-id", job_id, "--chdir", cwd};
    if (o.timeout_s) agent.insert(agent.end(), {"--timeout", std::to_string(o.timeout_s)});
    for (const auto& kv : env) agent.insert(agent.end(), {"--env", kv});
    agent.push_back("--");
    for (int a = o.prog; argv[a]; ++a) agent.push_back(argv[a]);
    out.push_back({zero::launch::on_host(o.host_exec, hosts[k].host, agent), {}, "",
                   "host " + hosts[k].host + " (node " + std::to_string(k) + ")"});
    offset += hosts[k].slots;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  const bool fan_out = !o.hostfile.empty();
  if (!o.chdir.empty() && chdir(o.chdir.c_str()) != 0) {
    std::fprintf(stderr, "zero-run: cannot change to %s: %s\n", o.chdir.c_str(), std::strerror(errno));
    return 1;
  }
  if (o.port == 0) o.port = free_port();
  std::string job_id = o.job_id.empty() ? "zr" + std::to_string(getpid()) + "_" + std::to_string(o.port) : o.job_id;
  // Per host: the ranks' shared-memory segments are named by it, and hosts
  // simulated on one machine (tests) share /dev/shm.
  if (o.nnodes > 1) job_id += "n" + std::to_string(o.node_rank);
  const std::string host = o.host_name.empty() ? this_host_name() : o.host_name;

  std::vector<Child> children;
  std::unique_ptr<zero::launch::JobControl> control;
  try {
    if (fan_out) {
      if (o.addr.empty()) o.addr = zero::launch::read_hostfile(o.hostfile).front().host;
      children = host_agents(o, argv, job_id);
    } else {
      children = local_ranks(o, argv, job_id);
      if (o.nnodes > 1)
        control = std::make_unique<zero::launch::JobControl>(o.nnodes, o.node_rank, o.addr, o.port + 1, host);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-run: %s\n", e.what());
    return 2;
  }
  // Where failures are said to be: the host, when the job has several.
  const std::string where = control ? "host " + host + ": " : "";

  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<Rank> ranks(children.size());
  std::vector<Stream> streams;
  for (size_t r = 0; r < children.size(); ++r) ranks[r] = {spawn(children[r], streams), true, 0};

  const auto start = Clock::now();
  int exit_code = 0;
  bool stopping = false;
  Clock::time_point stop_at{};
  bool killed = false;
  bool reported_done = false;
  auto stop_all = [&](int sig) {
    for (auto& rk : ranks)
      if (rk.running) kill(-rk.pid, sig);
  };
  // `why` happened here (told to the other hosts) or elsewhere (`remote`).
  auto begin_stop = [&](const std::string& why, int code, bool remote = false) {
    if (stopping) return;
    std::fprintf(stderr, "zero-run: %s%s; stopping the other ranks\n", remote ? "" : where.c_str(), why.c_str());
    if (control && !remote) control->report_failure(where + why);
    stopping = true;
    exit_code = code;
    stop_at = Clock::now();
    stop_all(SIGTERM);
  };

  for (;;) {
    // Collect exits.
    int live = 0;
    for (size_t r = 0; r < ranks.size(); ++r) {
      Rank& rk = ranks[r];
      if (!rk.running) continue;
      if (waitpid(rk.pid, &rk.status, WNOHANG) == rk.pid) {
        rk.running = false;
        const bool ok = WIFEXITED(rk.status) && WEXITSTATUS(rk.status) == 0;
        if (!ok && !stopping)
          begin_stop(children[r].label + " " + describe_exit(rk.status),
                     WIFEXITED(rk.status) ? WEXITSTATUS(rk.status) : 128 + WTERMSIG(rk.status));
      } else {
        ++live;
      }
    }
    if (control)
      if (auto why = control->poll(); why && !stopping) begin_stop(*why, 1, /*remote=*/true);
    if (g_signal && !stopping) begin_stop(std::string("received ") + strsignal(g_signal), 128 + g_signal);
    if (o.timeout_s && !stopping && Clock::now() - start > std::chrono::seconds(o.timeout_s))
      begin_stop("timed out after " + std::to_string(o.timeout_s) + " s", 124);
    if (stopping && !killed && Clock::now() - stop_at > kGrace) {
      stop_all(SIGKILL);
      killed = true;
    }
    bool open_streams = false;
    for (auto& s : streams) open_streams |= s.fd >= 0;
    if (live == 0 && !open_streams) {
      if (!control || stopping) break;
      // This host's ranks are done; node 0 stays until every host's are
      // (the others stop theirs if it goes).
      if (!reported_done) control->report_done(), reported_done = true;
      if (control->others_done()) break;
    }
    if (live == 0 && stopping) {
      // Ranks are gone; drain what they left without blocking on pipes a
      // stray grandchild may still hold.
      for (auto& s : streams)
        while (s.fd >= 0) {
          pollfd p{s.fd, POLLIN, 0};
          if (poll(&p, 1, 0) <= 0 || !s.pump()) break;
        }
      break;
    }

    std::vector<pollfd> fds;
    std::vector<Stream*> owners;
    for (auto& s : streams)
      if (s.fd >= 0) {
        fds.push_back({s.fd, POLLIN, 0});
        owners.push_back(&s);
      }
    int n = poll(fds.data(), fds.size(), 50);
    if (n > 0)
      for (size_t k = 0; k < fds.size(); ++k)
        if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) owners[k]->pump();
  }
  if (!fan_out) remove_shared_memory_of(job_id);
  return exit_code;
}
