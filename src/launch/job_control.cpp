#include "launch/job_control.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace zero::launch {

namespace {

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// A connected socket to addr:port within `wait`, or -1.
int connect_to(const std::string& addr, int port, std::chrono::milliseconds wait) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return -1;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  bool ok = false;
  if (fd >= 0) {
    set_nonblocking(fd);
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

JobControl::JobControl(int nnodes, int node_rank, std::string addr, int port, std::string host,
                       std::chrono::seconds connect_for)
    : nnodes_(nnodes), node_rank_(node_rank), addr_(std::move(addr)), host_(std::move(host)), port_(port),
      connect_deadline_(std::chrono::steady_clock::now() + connect_for) {
  if (node_rank_ != 0) return;  // connects in poll()
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port_));
  if (listen_fd_ < 0 || bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      listen(listen_fd_, 64) != 0)
    throw std::runtime_error("cannot listen on port " + std::to_string(port_) +
                             " for the other hosts' zero-run (" + std::strerror(errno) + "); pick another --master-port");
  set_nonblocking(listen_fd_);
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
  for (auto& p : peers_)
    if (&p != except) send_line(p, line);
}

void JobControl::try_connect() {
  int fd = connect_to(addr_, port_, std::chrono::milliseconds(100));
  if (fd < 0) {
    if (std::chrono::steady_clock::now() > connect_deadline_) {
      pending_ = "cannot reach node 0's zero-run at " + addr_ + ":" + std::to_string(port_);
    }
    return;
  }
  peers_.push_back({fd, 0, addr_, {}, false});
  connected_ = true;
  send_line(peers_.back(), "HELLO " + std::to_string(node_rank_) + " " + host_);
}

// Reads what the peer sent; a reason to stop, if its lines or its loss give one.
std::optional<std::string> JobControl::read_from(Peer& p) {
  char buf[4096];
  for (;;) {
    ssize_t n = recv(p.fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      p.inbox.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    close(p.fd);  // EOF or error: the peer is gone
    p.fd = -1;
    break;
  }
  std::optional<std::string> reason;
  for (size_t nl; (nl = p.inbox.find('\n')) != std::string::npos;) {
    const std::string line = p.inbox.substr(0, nl);
    p.inbox.erase(0, nl + 1);
    if (line.rfind("HELLO ", 0) == 0) {
      const size_t sp = line.find(' ', 6);
      p.node = std::atoi(line.substr(6, sp - 6).c_str());
      p.host = sp == std::string::npos ? "?" : line.substr(sp + 1);
    } else if (line == "DONE") {
      p.done = true;
    } else if (line.rfind("STOP ", 0) == 0 && !reason) {
      reason = line.substr(5);
      if (node_rank_ == 0) broadcast(line, &p);
    }
  }
  if (p.fd < 0 && !p.done && !reason) {
    if (node_rank_ == 0) {
      reason = "node " + std::to_string(p.node) + " (host " + p.host +
               ") was lost: its zero-run is gone or its network failed";
      broadcast("STOP " + *reason, &p);
    } else if (!done_) {
      reason = "lost node 0's zero-run at " + addr_ + ":" + std::to_string(port_) + " (its host or agent died)";
    }
  }
  return reason;
}

std::optional<std::string> JobControl::poll() {
  if (node_rank_ == 0) {
    for (int fd; (fd = accept(listen_fd_, nullptr, nullptr)) >= 0;) {
      set_nonblocking(fd);
      peers_.push_back({fd, -1, "?", {}, false});
    }
  } else if (!connected_ && !stopped_ && !pending_) {
    try_connect();
  }
  std::optional<std::string> reason = std::exchange(pending_, std::nullopt);
  for (auto& p : peers_)
    if (p.fd >= 0)
      if (auto r = read_from(p); r && !reason) reason = r;
  if (!reason || stopped_) return std::nullopt;
  stopped_ = true;
  return reason;
}

void JobControl::report_failure(const std::string& why) {
  if (stopped_) return;
  stopped_ = true;
  broadcast("STOP " + why, nullptr);  // node 0: every node; node k: node 0, who passes it on
}

void JobControl::report_done() {
  done_ = true;
  broadcast("DONE", nullptr);
}

bool JobControl::others_done() const {
  if (node_rank_ != 0) return true;
  int done = 0;
  for (const auto& p : peers_) done += p.done ? 1 : 0;
  return done >= nnodes_ - 1;
}

}  // namespace zero::launch
