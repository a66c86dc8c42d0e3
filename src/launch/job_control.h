// How the zero-run agents of a job on several hosts stop together.
//
// Each host runs one zero-run agent for its local ranks (torchrun's
// --nnodes/--node-rank, or started by `zero-run --hostfile`). The agents
// keep one TCP connection each to node 0's agent (MASTER_ADDR, a port of
// its own) and say, a line each:
//   HELLO <node> <host>   once connected
//   STOP <reason>         my ranks failed (node k -> 0), or stop (0 -> all)
//   DONE                  my ranks all exited 0 (node k -> 0)
// Node 0 passes any STOP on to every other node. A connection lost before
// DONE counts as that node failing (its host or its agent died), and node
// k losing node 0 stops node k: no host keeps ranks running on its own for
// longer than the agents' poll interval and the SIGTERM grace.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace zero::launch {

class JobControl {
 public:
  // Node 0 listens on `port` (all addresses); node k connects to addr:port,
  // retrying for `connect_for` before it gives up (a stop reason).
  JobControl(int nnodes, int node_rank, std::string addr, int port, std::string host,
             std::chrono::seconds connect_for = std::chrono::seconds(120));
  ~JobControl();
  JobControl(const JobControl&) = delete;
  JobControl& operator=(const JobControl&) = delete;

  // Sends and receives what is due without blocking; a reason to stop this
  // host's ranks when one arrived (or a node was lost), once.
  std::optional<std::string> poll();
  // This host's ranks failed: every host is told (via node 0).
  void report_failure(const std::string& why);
  // This host's ranks all exited 0.
  void report_done();
  // Node 0: every other node has said DONE (other nodes: true).
  bool others_done() const;

 private:
  struct Peer {
    int fd = -1;
    int node = -1;  // -1 until its HELLO
    std::string host;
    std::string inbox;
    bool done = false;
  };
  void send_line(Peer& p, const std::string& line);
  void broadcast(const std::string& line, const Peer* except);
  std::optional<std::string> read_from(Peer& p);
  void try_connect();

  int nnodes_, node_rank_;
  std::string addr_, host_;
  int port_;
  int listen_fd_ = -1;
  std::vector<Peer> peers_;  // node 0: one per other node; node k: node 0
  std::chrono::steady_clock::time_point connect_deadline_;
  bool connected_ = false;
  bool stopped_ = false;     // a stop reason was returned (or this host reported one)
  bool done_ = false;
  std::optional<std::string> pending_;  // a reason found while sending
};

}  // namespace zero::launch
