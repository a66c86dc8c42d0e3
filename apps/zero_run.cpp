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
// stops every host's ranks, with a message naming host and rank (not a rank
// that failed only because a peer went away: see kFollowerWait; a host that
// goes silent is named by the agents' heartbeat). At the end
// it removes any shared-memory segment of the job a killed rank left.
// SIGINT/SIGTERM sent to zero-run are forwarded to every rank.
//
// With --hostfile, each host's agent is started as `zero-run --agent`, and
// the rest comes on its stdin (launch/agent_link.h): its arguments and the
// job's secret, with which the agents prove themselves to node 0's
// (launch/job_control.h). An agent stops its ranks when that stdin closes:
// the launcher is gone or its link to the host is (see LauncherLink::alive
// for why that, and not a signal or a heartbeat). Unless --master-port is
// given, node 0's agent picks both its ports on node 0 and the launcher
// passes them on to the others.
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
#include <cerrno>
#include <climits>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "comm/shm/segment.h"
#include "launch/agent_link.h"
#include "launch/hostfile.h"
#include "launch/job_control.h"
#include "launch/ports.h"
#include "launch/secret.h"
#include "zero/launch_env.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kGrace = std::chrono::seconds(3);  // SIGTERM -> SIGKILL
// The launcher's grace for its agents: each agent gives its own ranks kGrace,
// then kills and reaps them and reports their exit code. Killing the agent
// first would lose that code (the job would exit 137, not the failing rank's).
constexpr auto kAgentGrace = kGrace + std::chrono::seconds(7);
// An agent's exit code when it stopped its ranks on another host's word
// (node 0 passed a STOP on), or node 0's when it lost contact with a host
// (its line names that host): the launcher names the host that failed, not
// one that followed it, whichever agent happens to exit first.
constexpr int kStoppedOnAnotherHostsWord = 75;
// How long an agent waits, once a rank of its own failed because a peer went
// away (the rank noted it: zero/launch_env.h), for the rank whose failure
// that was to be named -- by this host or, through node 0, by another --
// before it names its own. A rank that exits closes its connections before
// its agent sees it gone: its peers fail on them first, on any host.
constexpr auto kFollowerWait = std::chrono::seconds(5);

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
              "  --master-port P     rendezvous port (default: a free one; with --hostfile, two\n"
              "                      chosen on node 0); the agents of a several-host job also\n"
              "                      use P+1 on node 0. Both are checked on node 0\n"
              "  --timeout SECONDS   stop the whole job after this long (exit 124)\n"
              "  --nnodes H          hosts in the job (torchrun's); run zero-run on each with\n"
              "  --node-rank K       this host's index, 0 being MASTER_ADDR's host; ranks are\n"
              "                      K*N .. K*N+N-1 unless --rank-offset/--world-size say otherwise\n"
              "  --hostfile FILE     DeepSpeed's hostfile (\"HOST slots=N\" lines): starts one\n"
              "                      zero-run per host, through\n"
              "  --host-exec T       the command that runs a program on a host, {host} replaced\n"
              "                      (default \"ssh -o BatchMode=yes {host}\"; e.g. \"ip netns exec {host}\").\n"
              "                      It must pass stdin on: the agent's job comes there, and\n"
              "                      its end (the launcher or its link gone) stops that host\n"
              "  -h, --help          this text\n"
              "Environment: ZERO_JOB_SECRET, the secret the agents of a several-host job prove\n"
              "to each other (--hostfile makes one when unset; with --nnodes, export the same\n"
              "on every host). It is never put on a command line and the ranks do not get it.\n",
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
  // Node 0's agent's stdout, until it says which ports it chose.
  bool watch_ports = false;
  std::optional<std::pair<int, int>> ports;

  // Called while out_fd cannot take more (an agent: keeps its job control going).
  std::function<void()> while_blocked;

  void emit(const std::string& line) {
    std::string s = prefix + line;
    for (size_t off = 0; off < s.size();) {
      if (while_blocked) {
        // Wait for room (a pipe: PIPE_BUF bytes write whole then), beating meanwhile.
        pollfd p{out_fd, POLLOUT, 0};
        const int r = ::poll(&p, 1, 200);
        if (r == 0 || (r < 0 && errno == EINTR)) {
          while_blocked();
          continue;
        }
      }
      ssize_t n = write(out_fd, s.data() + off, std::min<size_t>(s.size() - off, PIPE_BUF));
      if (n < 0 && errno == EINTR) continue;
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
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string line = pending.substr(start, nl - start + 1);
      if (watch_ports)
        if (auto p = zero::launch::parse_ports_report(line)) {
          ports = p, watch_ports = false;
          continue;
        }
      emit(line);
    }
    pending.erase(0, start);
    return true;
  }
};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  int note = -1;          // the read end of its ZERO_RUN_NOTE_FD pipe (ranks only)
  std::string note_text;  // what came there
};

// What rank `rk` noted before it exited: its failure came from a peer going
// away ("" if it noted nothing).
std::string peer_lost_note(Rank& rk) {
  if (rk.note < 0) return "";
  char buf[4096];
  for (ssize_t n; (n = read(rk.note, buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;  // EAGAIN: a child of the rank holds the write end
    rk.note_text.append(buf, static_cast<size_t>(n));
  }
  close(rk.note);
  rk.note = -1;
  const std::string mark = zero::comm::kPeerLostNote;
  const size_t at = rk.note_text.find(mark);
  if (at == std::string::npos) return "";
  std::string what = rk.note_text.substr(at + mark.size());
  return what.substr(0, what.find('\n'));
}

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
  bool agent = false;     // started by --hostfile: its setup on stdin
  std::vector<std::string> env;  // K=V set for every rank (passed to remote agents)
  int prog = 0;                  // argv index of the program
};

Options parse(int argc, char** argv, bool agent = false) {
  Options o;
  o.agent = agent;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) {
      if (i + 1 >= argc) usage((std::string(flag) + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--") { ++i; break; }
    if (a == "-n" || a == "--nproc" || a == "--nproc-per-node") o.nproc = parse_int(value("-n"), "-n", 1, 1024);
    else if (a == "--master-port") o.port = parse_int(value("--master-port"), "--master-port", 0, 65534);
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
  // (an agent of --hostfile may have port 0: node 0 chooses it)
  if (o.nnodes > 1 && (o.addr.empty() || (o.port == 0 && !o.agent)))
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
  const std::string secret = std::string(zero::launch::kSecretVariable) + "=";
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    if (kv.rfind(secret, 0) == 0) continue;  // it goes apart, and never on a command line
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
  enum class In { inherit, null, pipe } in = In::inherit;  // its stdin
  std::string setup;             // In::pipe: written there first (an agent's)
};

// Starts `c`; with Child::In::pipe, `*in` is the write end of its stdin;
// with `note`, `*note` is the read end of its ZERO_RUN_NOTE_FD pipe.
// Every descriptor of ours is close-on-exec: a child holds its own pipes
// only (an agent's stdin must close when we go, whoever else we started).
pid_t spawn(const Child& c, std::vector<Stream>& streams, int* in = nullptr, int* note = nullptr) {
  int out[2], err[2], input[2] = {-1, -1}, notes[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || (c.in == Child::In::pipe && pipe2(input, O_CLOEXEC)) ||
      (note && pipe2(notes, O_CLOEXEC))) {
    std::perror("zero-run: pipe");
    std::exit(1);
  }
  pid_t pid = fork();
  if (pid < 0) { std::perror("zero-run: fork"); std::exit(1); }
  if (pid == 0) {
    setpgid(0, 0);                     // its own group: we signal it and its children
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // and it dies with us
    dup2(out[1], 1);
    dup2(err[1], 2);
    if (c.in == Child::In::pipe) dup2(input[0], 0);
    if (c.in == Child::In::null) {
      const int null = open("/dev/null", O_RDONLY);
      if (null >= 0) dup2(null, 0);
    }
    for (const auto& kv : c.env) {
      const size_t eq = kv.find('=');
      if (eq != std::string::npos) setenv(kv.substr(0, eq).c_str(), kv.c_str() + eq + 1, 1);
    }
    if (note) {
      fcntl(notes[1], F_SETFD, 0);  // this one it keeps
      setenv(zero::comm::kRunNoteFdVariable, std::to_string(notes[1]).c_str(), 1);
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
  if (note) {
    close(notes[1]);
    fcntl(notes[0], F_SETFL, fcntl(notes[0], F_GETFL) | O_NONBLOCK);
    *note = notes[0];
  }
  if (c.in == Child::In::pipe) {
    close(input[0]);
    fcntl(input[1], F_SETFL, fcntl(input[1], F_GETFL) | O_NONBLOCK);
    if (in) *in = input[1];
  }
  for (const auto& [fd, to] : {std::pair{out[0], 1}, std::pair{err[0], 2}}) {
    Stream st;
    st.fd = fd, st.out_fd = to, st.prefix = c.prefix;
    streams.push_back(std::move(st));
  }
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
    // The host's name as the launcher's messages give it, for the ranks' own.
    set("ZERO_HOST_NAME", o.host_name.empty() ? this_host_name() : o.host_name);
    // Share the cores between the ranks unless told otherwise (torchrun
    // sets 1; an even share keeps intra-op parallelism on big hosts).
    if (!std::getenv("OMP_NUM_THREADS")) set("OMP_NUM_THREADS", std::to_string(omp_threads));
    if (o.agent) c.in = Child::In::null;  // stdin is the launcher's, ours to watch
    c.prefix = "[rank " + std::to_string(rank) + "] ";
    c.label = "rank " + std::to_string(rank);
    out.push_back(std::move(c));
  }
  return out;
}

// One zero-run agent per host of the hostfile, each started through
// --host-exec as `zero-run --agent`, its arguments and the job's secret
// written to its stdin (launch/agent_link.h). With no --master-port, the
// agents get port 0: node 0's picks both ports, the others wait for them.
std::vector<Child> host_agents(const Options& o, char** argv, const std::string& job_id, const std::string& secret) {
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
    std::vector<std::string> args{"--nnodes", std::to_string(hosts.size()), "--node-rank", std::to_string(k),
                                  "-n", std::to_string(hosts[k].slots), "--rank-offset", std::to_string(offset),
                                  "--world-size", std::to_string(world), "--master-addr", o.addr,
                                  "--master-port", std::to_string(o.port), "--host-name", hosts[k].host,
                                  "--job-id", job_id, "--chdir", cwd};
    if (o.timeout_s) args.insert(args.end(), {"--timeout", std::to_string(o.timeout_s)});
    for (const auto& kv : env) args.insert(args.end(), {"--env", kv});
    args.push_back("--");
    for (int a = o.prog; argv[a]; ++a) args.push_back(argv[a]);
    Child c;
    c.argv = zero::launch::on_host(o.host_exec, hosts[k].host, {self, "--agent"});
    c.label = "host " + hosts[k].host + " (node " + std::to_string(k) + ")";
    c.in = Child::In::pipe;
    c.setup = zero::launch::setup_message({secret, args});
    out.push_back(std::move(c));
    offset += hosts[k].slots;
  }
  return out;
}

// ZERO_HEARTBEAT_TIMEOUT_S: how long an agent's peer may be silent before it
// counts as lost (launch/job_control.h). An agent of --hostfile finds it
// among the variables passed on for its ranks, ssh passing no environment.
std::chrono::milliseconds heartbeat_timeout(const Options& o) {
  constexpr const char* kName = "ZERO_HEARTBEAT_TIMEOUT_S";
  std::optional<std::string> value;
  if (const char* v = std::getenv(kName)) value = v;
  const std::string prefix = std::string(kName) + "=";
  for (const auto& kv : o.env)
    if (kv.rfind(prefix, 0) == 0) value = kv.substr(prefix.size());
  if (!value) return zero::launch::JobControl::kDefaultHeartbeatTimeout;
  char* end = nullptr;
  const double s = std::strtod(value->c_str(), &end);
  if (end == value->c_str() || *end || !(s >= 0.5 && s <= 86400))
    throw std::runtime_error(std::string(kName) + "='" + *value + "' is not a number of seconds in [0.5, 86400]");
  return std::chrono::milliseconds(static_cast<long long>(s * 1000));
}

// This host's part in the job control of a job on several hosts. Node 0
// checks its two ports here, on node 0, where they will be bound -- or,
// given none (an agent of --hostfile), picks both here and tells the
// launcher, who tells the other agents (they read them from `link`).
std::unique_ptr<zero::launch::JobControl> start_control(Options& o, const std::string& host, const std::string& secret,
                                                        zero::launch::LauncherLink* link) {
  using zero::launch::JobControl;
  const auto connect_for = std::chrono::seconds(120);
  const auto heartbeat = heartbeat_timeout(o);
  if (o.node_rank != 0) {
    int control_port = o.port + 1;
    if (o.port == 0) std::tie(o.port, control_port) = link->read_ports(Clock::now() + std::chrono::seconds(120));
    return std::make_unique<JobControl>(o.nnodes, o.node_rank, o.addr, control_port, host, secret, connect_for,
                                        heartbeat);
  }
  if (o.port == 0) {
    auto control = std::make_unique<JobControl>(o.nnodes, 0, o.addr, 0, host, secret, connect_for, heartbeat);
    o.port = zero::launch::pick_free_port();
    const std::string report = zero::launch::ports_report(o.port, control->port());
    if (write(1, report.data(), report.size()) != static_cast<ssize_t>(report.size()))
      throw std::runtime_error("cannot tell the launcher node 0's ports");
    return control;
  }
  if (const int err = zero::launch::port_unavailable(o.port))
    throw std::runtime_error("the rendezvous port " + std::to_string(o.port) + " (--master-port) " +
                             (err == EADDRINUSE ? "is in use on host " + host
                                                : "cannot be bound on host " + host + " (" + std::strerror(err) + ")") +
                             "; pick another --master-port");
  return std::make_unique<JobControl>(o.nnodes, 0, o.addr, o.port + 1, host, secret, connect_for, heartbeat);
}

}  // namespace

int main(int argc, char** argv) {
  using zero::launch::kSecretVariable;
  // An agent of --hostfile: its arguments and the job's secret come on stdin.
  std::unique_ptr<zero::launch::LauncherLink> link;
  std::vector<std::string> agent_args;
  std::vector<char*> agent_argv;
  std::string secret;
  if (argc == 2 && std::strcmp(argv[1], "--agent") == 0) {
    link = std::make_unique<zero::launch::LauncherLink>(0);
    try {
      auto setup = link->read_setup(Clock::now() + std::chrono::seconds(120));
      secret = std::move(setup.secret);
      agent_args = std::move(setup.args);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zero-run --agent: %s\n", e.what());
      return 2;
    }
    agent_argv.push_back(argv[0]);
    for (auto& a : agent_args) agent_argv.push_back(a.data());
    agent_argv.push_back(nullptr);
    argc = static_cast<int>(agent_argv.size()) - 1;
    argv = agent_argv.data();
  } else if (const char* s = std::getenv(kSecretVariable)) {
    secret = s;
  }
  unsetenv(kSecretVariable);  // neither the ranks nor --host-exec have a use for it
  Options o = parse(argc, argv, link != nullptr);
  const bool fan_out = !o.hostfile.empty();
  if (!o.chdir.empty() && chdir(o.chdir.c_str()) != 0) {
    std::fprintf(stderr, "zero-run: cannot change to %s: %s\n", o.chdir.c_str(), std::strerror(errno));
    return 1;
  }
  // One host: it is node 0, and the port is chosen here. --hostfile: on node 0.
  if (o.port == 0 && !fan_out && !o.agent) o.port = free_port();
  std::string job_id = o.job_id;
  const std::string host = o.host_name.empty() ? this_host_name() : o.host_name;

  std::vector<Child> children;
  std::unique_ptr<zero::launch::JobControl> control;
  try {
    if (job_id.empty())
      job_id = "zr" + std::to_string(getpid()) + "_" + (fan_out ? zero::launch::random_hex(4) : std::to_string(o.port));
    // Per host: the ranks' shared-memory segments are named by it, and hosts
    // simulated on one machine (tests) share /dev/shm.
    if (o.nnodes > 1) job_id += "n" + std::to_string(o.node_rank);
    if (fan_out) {
      if (o.addr.empty()) o.addr = zero::launch::read_hostfile(o.hostfile).front().host;
      if (secret.empty()) secret = zero::launch::random_hex(32);
      children = host_agents(o, argv, job_id, secret);
    } else {
      if (o.nnodes > 1) {
        if (secret.empty() && !o.agent)
          std::fprintf(stderr,
                       "zero-run: host %s: warning: %s is not set: any program that can reach node 0's port %d "
                       "can join or stop this job; export the same secret on every host\n",
                       host.c_str(), kSecretVariable, o.port + 1);
        control = start_control(o, host, secret, link.get());
      }
      children = local_ranks(o, argv, job_id);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-run: %s%s\n", o.nnodes > 1 ? ("host " + host + ": ").c_str() : "", e.what());
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
  // The agents' stdin (--hostfile): what is still to be written there, and
  // the pipe, which stays open as long as this launcher runs and the job
  // does -- closing it is how an agent hears that we stopped.
  std::vector<int> stdin_of(children.size(), -1);
  std::vector<std::string> outbox(children.size());
  for (size_t r = 0; r < children.size(); ++r) {
    ranks[r].pid = spawn(children[r], streams, &stdin_of[r], fan_out ? nullptr : &ranks[r].note);
    ranks[r].running = true;
    outbox[r] = children[r].setup;
  }
  if (fan_out && o.port == 0) streams.front().watch_ports = true;  // node 0's agent's stdout
  // An agent held up writing its ranks' output (a paused terminal, `| less`)
  // still answers its peers: beats, and proves itself to node 0. A stop
  // reason found meanwhile waits for the loop below.
  std::optional<std::string> stop_while_blocked;
  if (control)
    for (auto& st : streams)
      st.while_blocked = [&control, &stop_while_blocked] {
        if (auto why = control->poll(); why && !stop_while_blocked) stop_while_blocked = why;
      };
  bool ports_passed = false;
  auto close_stdin = [&](size_t r) {
    if (stdin_of[r] >= 0) close(stdin_of[r]);
    stdin_of[r] = -1;
    outbox[r].clear();
  };
  auto flush_stdin = [&] {
    for (size_t r = 0; r < children.size(); ++r)
      while (stdin_of[r] >= 0 && !outbox[r].empty()) {
        const ssize_t n = write(stdin_of[r], outbox[r].data(), outbox[r].size());
        if (n > 0) outbox[r].erase(0, static_cast<size_t>(n));
        else if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
        else close_stdin(r);  // it closed its end: its exit says the rest
      }
  };

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
  // A rank of ours failed because a peer went away: the failure that stopped
  // the job is that peer's, named here or on another host within
  // kFollowerWait; else this one is (follower_why, follower_code).
  std::optional<Clock::time_point> follower_since;
  std::string follower_why;
  int follower_code = 0;
  // `why` happened here (told to the other hosts) or elsewhere (`remote`).
  bool exit_code_from_follower = false;  // exit_code is a follower's: the failing host's replaces it
  auto begin_stop = [&](const std::string& why, int code, bool remote = false, bool quiet = false) {
    if (stopping) return;
    if (!quiet)
      std::fprintf(stderr, "zero-run: %s%s; stopping the other ranks\n", remote ? "" : where.c_str(), why.c_str());
    if (control && !remote) control->report_failure(where + why);
    stopping = true;
    exit_code = code;
    stop_at = Clock::now();
    // The agents see their stdin close (whatever --host-exec does with the
    // SIGTERM below) and stop their hosts' ranks.
    for (size_t r = 0; r < children.size(); ++r) close_stdin(r);
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
        close_stdin(r);
        const std::string lost = peer_lost_note(rk);  // (and its pipe closed)
        const bool ok = WIFEXITED(rk.status) && WEXITSTATUS(rk.status) == 0;
        const int code = WIFEXITED(rk.status) ? WEXITSTATUS(rk.status) : 128 + WTERMSIG(rk.status);
        const bool followed = fan_out && code == kStoppedOnAnotherHostsWord;
        if (followed && !stopping) {
          // The host that failed says so itself (its agent's line above);
          // stop the rest, and take that host's exit code when it comes.
          std::fprintf(stderr, "zero-run: %s stopped on another host's failure; stopping every host\n",
                       children[r].label.c_str());
          begin_stop("", 1, /*remote=*/true, /*quiet=*/true);
          exit_code_from_follower = true;
        } else if (!ok && !followed && stopping && exit_code_from_follower) {
          exit_code = code;
          exit_code_from_follower = false;
        } else if (!ok && !stopping) {
          const std::string failed = children[r].label + " " + describe_exit(rk.status);
          if (!lost.empty()) {
            if (!follower_since) {
              follower_since = Clock::now();
              follower_why = failed + " after losing a peer (" + lost + "), and no other rank was named within " +
                             std::to_string(kFollowerWait.count()) + " s";
              follower_code = code;
              std::fprintf(stderr,
                           "zero-run: %s%s after losing a peer (%s); waiting up to %d s for the rank that failed "
                           "first to be named\n",
                           where.c_str(), failed.c_str(), lost.c_str(), static_cast<int>(kFollowerWait.count()));
            }
          } else {
            begin_stop(failed, code);
          }
        }
      } else {
        ++live;
      }
    }
    if (control) {
      auto why = stop_while_blocked ? std::exchange(stop_while_blocked, std::nullopt) : control->poll();
      if (why && !stopping) begin_stop(*why, kStoppedOnAnotherHostsWord, /*remote=*/true);
    }
    if (link && !stopping && !link->alive())
      begin_stop("this agent's stdin closed: the launcher (zero-run --hostfile) stopped the job, is gone, "
                 "or lost its link to this host", 1);
    if (g_signal && !stopping) begin_stop(std::string("received ") + strsignal(g_signal), 128 + g_signal);
    if (o.timeout_s && !stopping && Clock::now() - start > std::chrono::seconds(o.timeout_s))
      begin_stop("timed out after " + std::to_string(o.timeout_s) + " s", 124);
    if (follower_since && !stopping && Clock::now() - *follower_since > kFollowerWait)
      begin_stop(follower_why, follower_code);
    if (stopping && !killed && Clock::now() - stop_at > (fan_out ? kAgentGrace : kGrace)) {
      stop_all(SIGKILL);
      killed = true;
    }
    bool open_streams = false;
    for (auto& s : streams) open_streams |= s.fd >= 0;
    if (live == 0 && !open_streams && !follower_since) {
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

    if (!ports_passed && fan_out && streams.front().ports) {
      // Node 0's agent chose its ports: the other agents wait for them.
      const auto [rendezvous, agents] = *streams.front().ports;
      for (size_t r = 1; r < children.size(); ++r) outbox[r] += zero::launch::ports_message(rendezvous, agents);
      ports_passed = true;
    }
    flush_stdin();

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
