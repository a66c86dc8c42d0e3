#include "launch/job_control.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "launch/handshake.h"
#include "launch/ports.h"
#include "launch/secret.h"

namespace zero::launch {

namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kProveWithin = std::chrono::seconds(10);  // a connection's proof, from its accept
constexpr size_t kMaxUnprovenLine = 1024;                // a HELLO is ~200 bytes
constexpr size_t kMaxLine = 65536;
constexpr size_t kMaxUnproven = 64;  // connections yet to prove themselves, at once
constexpr int kMaxIgnoredLogged = 20;

// What a stranger said, fit for one line of a log.
std::string printable(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 60)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  return s.size() > 60 ? out + "..." : out;
}

std::string address_of(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  char ip[INET_ADDRSTRLEN] = "?";
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || a.sin_family != AF_INET) return "?";
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

// A connected socket to addr:port within `wait`, or -1. Close-on-exec, as
// every socket here: the ranks this agent starts must not hold its port.
int connect_to(const std::string& addr, int port, std::chrono::milliseconds wait) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  bool ok = false;
  if (fd >= 0) {
    if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      ok = ::poll(&p, 1, static_cast<int>(wait.count())) == 1 &&
           getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
  }
  freeaddrinfo(res);
  if (!ok && fd >= 0) close(fd);
  return ok ? fd : -1;
}

}  // namespace

JobControl::JobControl(int nnodes, int node_rank, std::string addr, int port, std::string host, std::string secret,
                       std::chrono::seconds connect_for, std::chrono::milliseconds heartbeat_timeout)
    : nnodes_(nnodes), node_rank_(node_rank), addr_(std::move(addr)), host_(std::move(host)),
      secret_(std::move(secret)), port_(port), connect_deadline_(Clock::now() + connect_for),
      heartbeat_timeout_(heartbeat_timeout) {
  if (node_rank_ != 0) return;  // connects in poll()
  listen_fd_ = bind_any(AF_INET, port_);
  if (listen_fd_ < 0 || listen(listen_fd_, 64) != 0) {
    const int err = errno;
    if (err == EADDRINUSE)
      throw std::runtime_error("port " + std::to_string(port_) +
                               " (where node 0's zero-run waits for the other hosts') is in use on host " + host_ +
                               "; pick another --master-port");
    throw std::runtime_error("cannot listen on port " + std::to_string(port_) + " on host " + host_ +
                             " for the other hosts' zero-run (" + std::strerror(err) + ")");
  }
  fcntl(listen_fd_, F_SETFL, fcntl(listen_fd_, F_GETFL) | O_NONBLOCK);
  port_ = local_port(listen_fd_);
}

JobControl::~JobControl() {
  for (auto& p : peers_)
    if (p.fd >= 0) close(p.fd);
  if (listen_fd_ >= 0) close(listen_fd_);
}

void JobControl::send_line(Peer& p, const std::string& line) {
  if (p.fd < 0) return;
  const std::string s = line + "\n";
  // Lines are short; a peer that cannot take one is seen as lost by its reads.
  for (size_t off = 0; off < s.size();) {
    ssize_t n = send(p.fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd w{p.fd, POLLOUT, 0};
      if (::poll(&w, 1, 1000) <= 0) return;
    } else {
      return;
    }
  }
}

void JobControl::broadcast(const std::string& line, const Peer* except) {
  if (node_rank_ == 0 && line.rfind("STOP ", 0) == 0 && !stop_line_) stop_line_ = line;
  for (auto& p : peers_)
    if (&p != except && p.proven()) send_line(p, line);
}

void JobControl::ignore(Peer& p, const std::string& why) {
  if (ignored_logged_ < kMaxIgnoredLogged)
    std::fprintf(stderr, "zero-run: host %s: ignored a connection from %s: %s\n", host_.c_str(), p.address.c_str(),
                 why.c_str());
  else if (ignored_logged_ == kMaxIgnoredLogged)
    std::fprintf(stderr, "zero-run: host %s: ignoring more connections that prove nothing, without a word\n",
                 host_.c_str());
  ++ignored_logged_;
  if (p.fd >= 0) close(p.fd);
  p.fd = -1;
}

void JobControl::try_connect() {
  int fd = connect_to(addr_, port_, std::chrono::milliseconds(100));
  if (fd < 0) {
    if (Clock::now() > connect_deadline_) {
      pending_ = "cannot reach node 0's zero-run at " + addr_ + ":" + std::to_string(port_);
    }
    return;
  }
  Peer p;
  p.fd = fd;
  p.stage = Stage::connected;
  p.node = 0;
  p.host = addr_;
  p.address = addr_ + ":" + std::to_string(port_);
  p.since = Clock::now();
  peers_.push_back(std::move(p));
  connected_ = true;  // HELLO goes when node 0's CHALLENGE comes
}

void JobControl::admit(Peer& p, const std::string& line) {
  const auto hello = parse_hello(line);
  if (!hello) {
    ignore(p, "it said '" + printable(line) + "' before proving the job's secret");
    return;
  }
  if (!hello_proves(secret_, p.challenge, *hello)) {
    send_line(p, "REFUSED its proof does not match this job's secret");
    ignore(p, "its proof does not match this job's secret (is " + std::string(kSecretVariable) +
                  " the same on every host?)");
    return;
  }
  const std::string others = "1.." + std::to_string(nnodes_ - 1);
  char* end = nullptr;
  const long node = std::strtol(hello->node.c_str(), &end, 10);
  if (*end || node < 1 || node >= nnodes_) {
    send_line(p, "REFUSED node " + hello->node + " is not one of this job's " + others);
    ignore(p, "it proved the secret as node " + hello->node + ", not one of this job's " + others);
    return;
  }
  for (const auto& q : peers_)
    if (&q != &p && q.proven() && q.node == node) {
      send_line(p, "REFUSED node " + hello->node + " is here already");
      ignore(p, "it proved the secret as node " + hello->node + ", which is here already");
      return;
    }
  p.stage = Stage::proven;
  p.heard = Clock::now();
  p.node = static_cast<int>(node);
  p.host = hello->host;
  p.nonce = hello->nonce;
  send_line(p, welcome_line(secret_, p.challenge, *hello));
  if (stop_line_) send_line(p, *stop_line_);  // it joined a job already stopping
}

std::optional<std::string> JobControl::greet(Peer& p, const std::string& line) {
  const std::string where = addr_ + ":" + std::to_string(port_);
  auto drop = [&](const std::string& why) {
    close(p.fd);
    p.fd = -1;
    return std::optional<std::string>(why);
  };
  if (p.stage == Stage::connected)
    if (auto challenge = parse_challenge(line)) {
      p.challenge = *challenge;
      p.nonce = fresh_nonce();
      send_line(p, hello_line(secret_, p.challenge, node_rank_, p.nonce, host_));
      p.stage = Stage::hello_sent;
      return std::nullopt;
    }
  if (p.stage == Stage::hello_sent && line.rfind("WELCOME ", 0) == 0) {
    if (!welcome_proves(secret_, p.challenge, node_rank_, p.nonce, line))
      return drop("node 0's zero-run at " + where + " proved another secret than this job's (is " + kSecretVariable +
                  " the same on every host?)");
    p.stage = Stage::proven;
    p.heard = Clock::now();
    if (failure_) send_line(p, "STOP " + *failure_);
    if (done_ && !failure_) send_line(p, "DONE"), done_sent_ = true;
    return std::nullopt;
  }
  if (line.rfind("REFUSED ", 0) == 0)
    return drop("node 0's zero-run at " + where + " refused this node: " + printable(line.substr(8)) + " (is " +
                kSecretVariable + " the same on every host?)");
  return drop("what answers at " + where + " is not node 0's zero-run (it said '" + printable(line) + "')");
}

// Reads what the peer sent; a reason to stop, if its lines or its loss give one.
std::optional<std::string> JobControl::read_from(Peer& p) {
  char buf[4096];
  bool eof = false;
  for (;;) {
    ssize_t n = recv(p.fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      p.heard = Clock::now();
      p.inbox.append(buf, static_cast<size_t>(n));
      if (p.inbox.size() > (p.proven() ? kMaxLine : kMaxUnprovenLine)) break;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    eof = true;  // EOF or error: the peer is gone
    break;
  }
  std::optional<std::string> reason;
  for (size_t nl; p.fd >= 0 && (nl = p.inbox.find('\n')) != std::string::npos;) {
    const std::string line = p.inbox.substr(0, nl);
    p.inbox.erase(0, nl + 1);
    if (!p.proven()) {
      if (node_rank_ == 0) admit(p, line);
      else if (auto r = greet(p, line); r && !reason) reason = r;
      continue;
    }
    if (line == "BEAT") {
      // (heard, above)
    } else if (line == "DONE") {
      p.done = true;
    } else if (line.rfind("STOP ", 0) == 0 && !reason) {
      reason = line.substr(5);
      if (node_rank_ == 0) broadcast(line, &p);
    }
  }
  if (p.fd >= 0 && p.inbox.size() > (p.proven() ? kMaxLine : kMaxUnprovenLine)) {
    if (!p.proven() && node_rank_ == 0) {
      ignore(p, "a line of over " + std::to_string(kMaxUnprovenLine) + " bytes before proving the job's secret");
      return std::nullopt;
    }
    p.inbox.clear();  // no line of ours is this long: not a line of ours
  }
  if (p.fd < 0) return reason;  // dropped above
  if (!eof) return reason;
  close(p.fd);
  p.fd = -1;
  if (reason) return reason;
  if (!p.proven()) {
    if (node_rank_ == 0) {
      ignore(p, "it closed before proving the job's secret");
      return std::nullopt;
    }
    return "node 0's zero-run at " + addr_ + ":" + std::to_string(port_) +
           " closed the connection before proving the job's secret (is it this job's?)";
  }
  if (p.done) return std::nullopt;
  if (node_rank_ == 0) {
    reason = "node " + std::to_string(p.node) + " (host " + p.host +
             ") was lost: its zero-run is gone or its network failed";
    broadcast("STOP " + *reason, &p);
    return reason;
  }
  if (!done_sent_)
    return "lost node 0's zero-run at " + addr_ + ":" + std::to_string(port_) + " (its host or agent died)";
  return std::nullopt;
}

std::optional<std::string> JobControl::poll() {
  if (node_rank_ == 0) {
    for (int fd; (fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;) {
      Peer p;
      p.fd = fd;
      p.address = address_of(fd);
      p.since = Clock::now();
      const size_t unproven = std::count_if(peers_.begin(), peers_.end(), [](const Peer& q) { return !q.proven(); });
      if (unproven >= kMaxUnproven) {
        ignore(p, "too many connections are yet to prove the job's secret");
        continue;
      }
      p.stage = Stage::challenged;
      p.challenge = fresh_nonce();
      peers_.push_back(std::move(p));
      send_line(peers_.back(), challenge_line(peers_.back().challenge));
    }
  } else if (!connected_ && (!stopped_ || failure_) && !pending_) {
    try_connect();
  }
  std::optional<std::string> reason = std::exchange(pending_, std::nullopt);
  const auto now = Clock::now();
  for (auto& p : peers_) {
    if (p.fd < 0) continue;
    if (auto r = read_from(p); r && !reason) reason = r;
    if (p.fd >= 0 && !p.proven() && now - p.since > kProveWithin) {
      if (node_rank_ == 0) {
        ignore(p, "it proved nothing for " + std::to_string(kProveWithin.count()) + " s");
      } else if (!reason) {
        close(p.fd);
        p.fd = -1;
        reason = "node 0's zero-run at " + addr_ + ":" + std::to_string(port_) +
                 " did not prove the job's secret within " + std::to_string(kProveWithin.count()) +
                 " s (is it this job's?)";
      }
    }
  }
  if (auto r = beat(); r && !reason) reason = r;
  // Connections that proved nothing leave no trace.
  peers_.erase(std::remove_if(peers_.begin(), peers_.end(), [](const Peer& p) { return p.fd < 0 && !p.proven(); }),
               peers_.end());
  if (!reason || stopped_) return std::nullopt;
  stopped_ = true;
  return reason;
}

std::optional<std::string> JobControl::beat() {
  const auto now = Clock::now();
  if (now - last_beat_ >= kBeatEvery) {
    last_beat_ = now;
    for (auto& p : peers_)
      if (p.fd >= 0 && p.proven() && !p.done) send_line(p, "BEAT");
  }
  const auto limit = heartbeat_timeout_ + (node_rank_ == 0 ? std::chrono::milliseconds(0) : kNodeKExtra);
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%.1f", std::chrono::duration<double>(limit).count());
  for (auto& p : peers_) {
    if (p.fd < 0 || !p.proven() || p.done || now - p.heard <= limit) continue;
    close(p.fd);
    p.fd = -1;
    if (stopped_) continue;  // stopping anyway: nothing to name
    lost_contact_ = true;
    if (node_rank_ != 0)
      return "host " + host_ + ": lost contact with node 0's zero-run at " + addr_ + ":" + std::to_string(port_) +
             ": nothing from it for " + secs +
             " s (this host is cut off from it, or node 0's host or zero-run failed)";
    const std::string reason = "host " + host_ + ": lost contact with host " + p.host + " (node " +
                               std::to_string(p.node) + "): nothing from its zero-run for " + secs +
                               " s (the host is down or frozen, its zero-run hangs, or the network between it and "
                               "host " + host_ + " is cut)";
    broadcast("STOP " + reason, &p);
    return reason;
  }
  return std::nullopt;
}

void JobControl::report_failure(const std::string& why) {
  if (stopped_) return;
  stopped_ = true;
  if (node_rank_ != 0 && (peers_.empty() || !peers_.front().proven())) {
    failure_ = why;  // told once node 0 has proven itself
    return;
  }
  broadcast("STOP " + why, nullptr);  // node 0: every node; node k: node 0, who passes it on
}

void JobControl::report_done() {
  done_ = true;
  if (node_rank_ == 0) return;
  for (auto& p : peers_)
    if (p.proven() && p.fd >= 0 && !done_sent_) send_line(p, "DONE"), done_sent_ = true;
}

bool JobControl::others_done() const {
  if (node_rank_ != 0) return done_sent_;
  int done = 0;
  for (const auto& p : peers_) done += p.proven() && p.done ? 1 : 0;
  return done >= nnodes_ - 1;
}

}  // namespace zero::launch
