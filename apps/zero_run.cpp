// zero-run: start N ranks of a program on this host, like
// `torchrun --standalone --nproc-per-node N`.
//
//   zero-run -n 2 [--master-port P] [--timeout S] -- ./prog args...
//
// Each rank gets the torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus ZERO_JOB_ID, and its
// output lines are prefixed with "[rank r] ". When any rank fails (non-zero
// exit or a signal), the others get SIGTERM and, 3 s later, SIGKILL, and
// zero-run exits non-zero: a dead rank never leaves the job hanging. At the
// end it removes any shared-memory segment of the job a killed rank left.
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
#include <string>
#include <vector>

#include "comm/shm/segment.h"
#include "zero/launch_env.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kGrace = std::chrono::seconds(3);  // SIGTERM -> SIGKILL

volatile sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

constexpr const char* kUsage =
    "usage: zero-run -n N [--master-addr A] [--master-port P] [--timeout SECONDS] -- prog [args...]\n";

// Errors: stderr, exit 2. --help: stdout, exit 0 (it was asked for).
[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "zero-run: %s\n%s", why, kUsage);
  std::exit(2);
}

[[noreturn]] void help() {
  std::printf("%s"
              "Starts N ranks of prog on this host with torchrun's variables (RANK, WORLD_SIZE,\n"
              "LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); when one rank fails the\n"
              "others are stopped and zero-run exits non-zero.\n"
              "  -n N                ranks to start (also --nproc, --nproc-per-node)\n"
              "  --master-addr A     rendezvous address (default 127.0.0.1)\n"
              "  --master-port P     rendezvous port (default: a free one)\n"
              "  --timeout SECONDS   stop the whole job after this long (exit 124)\n"
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

int main(int argc, char** argv) {
  int nproc = 0;
  int port = 0;
  int timeout_s = 0;
  std::string addr = "127.0.0.1";
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) {
      if (i + 1 >= argc) usage((std::string(flag) + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--") { ++i; break; }
    if (a == "-n" || a == "--nproc" || a == "--nproc-per-node") nproc = parse_int(value("-n"), "-n", 1, 1024);
    else if (a == "--master-port") port = parse_int(value("--master-port"), "--master-port", 1, 65535);
    else if (a == "--master-addr") addr = value("--master-addr");
    else if (a == "--timeout") timeout_s = parse_int(value("--timeout"), "--timeout", 1, 1 << 30);
    else if (a == "-h" || a == "--help") help();
    else usage(("unknown option " + a).c_str());
  }
  if (nproc < 1) usage("-n N is required");
  if (i >= argc) usage("no program given after --");
  if (port == 0) port = free_port();
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const int omp_threads = static_cast<int>(std::max(1L, cores / nproc));
  const std::string job_id = "zr" + std::to_string(getpid()) + "_" + std::to_string(port);

  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  std::vector<Rank> ranks(nproc);
  std::vector<Stream> streams;
  for (int r = 0; r < nproc; ++r) {
    int out[2], err[2];
    if (pipe(out) || pipe(err)) { std::perror("zero-run: pipe"); return 1; }
    pid_t pid = fork();
    if (pid < 0) { std::perror("zero-run: fork"); return 1; }
    if (pid == 0) {
      setpgid(0, 0);                   // its own group: we signal the rank and its children
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // and it dies with us
      dup2(out[1], 1);
      dup2(err[1], 2);
      close(out[0]), close(out[1]), close(err[0]), close(err[1]);
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      setenv("GROUP_RANK", "0", 1);
      setenv("MASTER_ADDR", addr.c_str(), 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      setenv("ZERO_JOB_ID", job_id.c_str(), 1);
      // Share the cores between the ranks unless told otherwise (torchrun
      // sets 1; an even share keeps intra-op parallelism on big hosts).
      setenv("OMP_NUM_THREADS", std::to_string(omp_threads).c_str(), 0);
      execvp(argv[i], argv + i);
      std::fprintf(stderr, "zero-run: cannot execute %s: %s\n", argv[i], std::strerror(errno));
      _exit(127);
    }
    setpgid(pid, pid);
    close(out[1]), close(err[1]);
    ranks[r] = {pid, true, 0};
    const std::string prefix = "[rank " + std::to_string(r) + "] ";
    streams.push_back({out[0], 1, prefix, {}});
    streams.push_back({err[0], 2, prefix, {}});
  }

  const auto start = Clock::now();
  int exit_code = 0;
  bool stopping = false;
  Clock::time_point stop_at{};
  bool killed = false;
  auto stop_all = [&](int sig) {
    for (auto& rk : ranks)
      if (rk.running) kill(-rk.pid, sig);
  };
  auto begin_stop = [&](const std::string& why, int code) {
    if (stopping) return;
    std::fprintf(stderr, "zero-run: %s; stopping the other ranks\n", why.c_str());
    stopping = true;
    exit_code = code;
    stop_at = Clock::now();
    stop_all(SIGTERM);
  };

  for (;;) {
    // Collect exits.
    int live = 0;
    for (int r = 0; r < nproc; ++r) {
      Rank& rk = ranks[r];
      if (!rk.running) continue;
      if (waitpid(rk.pid, &rk.status, WNOHANG) == rk.pid) {
        rk.running = false;
        const bool ok = WIFEXITED(rk.status) && WEXITSTATUS(rk.status) == 0;
        if (!ok && !stopping)
          begin_stop("rank " + std::to_string(r) + " " + describe_exit(rk.status),
                     WIFEXITED(rk.status) ? WEXITSTATUS(rk.status) : 128 + WTERMSIG(rk.status));
      } else {
        ++live;
      }
    }
    if (g_signal && !stopping) begin_stop(std::string("received ") + strsignal(g_signal), 128 + g_signal);
    if (timeout_s && !stopping && Clock::now() - start > std::chrono::seconds(timeout_s))
      begin_stop("timed out after " + std::to_string(timeout_s) + " s", 124);
    if (stopping && !killed && Clock::now() - stop_at > kGrace) {
      stop_all(SIGKILL);
      killed = true;
    }
    bool open_streams = false;
    for (auto& s : streams) open_streams |= s.fd >= 0;
    if (live == 0 && !open_streams) break;
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
  remove_shared_memory_of(job_id);
  return exit_code;
}
