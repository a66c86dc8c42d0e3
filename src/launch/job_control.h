// How the zero-run agents of a job on several hosts stop together.
//
// Each host runs one zero-run agent for its local ranks (torchrun's
// --nnodes/--node-rank, or started by `zero-run --hostfile`). The agents
// keep one TCP connection each to node 0's agent (MASTER_ADDR, a port of
// its own). Each connection first proves the job's secret both ways
// (launch/handshake.h: CHALLENGE, HELLO, WELCOME or REFUSED); then, a line
// each:
//   STOP <reason>   my ranks failed (node k -> 0), or stop (0 -> all)
//   DONE            my ranks all exited 0 (node k -> 0)
//   BEAT            I am here (both ways, every second, once proven)
// Nothing a connection says counts before its proof does: node 0 logs a
// connection that closes, sends anything else first, proves the wrong
// secret or stays silent for 10 s (one line each), drops it and goes on,
// so a port scan or a stranger's STOP/DONE changes nothing.
//
// Node 0 passes any STOP on to every other node. A proven connection lost
// before DONE counts as that node failing (its host or its agent died), and
// node k losing node 0 stops node k: no host keeps ranks running on its own
// for longer than the agents' poll interval and the SIGTERM grace. Node k's
// DONE is handed to node 0 before node k counts as finished (others_done).
//
// A connection can also go silent without closing: a cut link, a host that
// froze or lost power, a firewall dropping packets. TCP says nothing for
// minutes then, and the ranks would only notice when a collective times out
// (300 s by default), naming whichever rank timed out first. So the proven
// ends send each other BEAT every second, and an end that hears nothing for
// `heartbeat_timeout` counts as lost: node 0 names the host it lost contact
// with ("lost contact with host B (node 1): ..."), passes the STOP on to the
// others and lost_contact() says so. Node k gives node 0 3 s longer before
// it names node 0: when only the link between them is cut, node 0's word
// (naming the host cut off) is the one that counts. A node that said DONE is
// not waited for.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace zero::launch {

class JobControl {
 public:
  static constexpr std::chrono::milliseconds kDefaultHeartbeatTimeout{5000};
  static constexpr std::chrono::milliseconds kBeatEvery{1000};
  // Node k waits this much longer than node 0 before it names node 0 lost.
  static constexpr std::chrono::milliseconds kNodeKExtra{3000};

  // Node 0 listens on `port` (all addresses; 0: one the OS picks, port()
  // says which), throwing std::runtime_error naming the port and `host` when
  // it cannot; node k connects to addr:port, retrying for `connect_for`
  // before it gives up (a stop reason). `secret` is the job's: every node
  // must hold the same.
  // `heartbeat_timeout`: the silence after which a proven peer counts as lost.
  JobControl(int nnodes, int node_rank, std::string addr, int port, std::string host, std::string secret,
             std::chrono::seconds connect_for = std::chrono::seconds(120),
             std::chrono::milliseconds heartbeat_timeout = kDefaultHeartbeatTimeout);
  ~JobControl();
  JobControl(const JobControl&) = delete;
  JobControl& operator=(const JobControl&) = delete;

  // The port node 0 listens on (node k: the one it connects to).
  int port() const { return port_; }

  // Sends and receives what is due without blocking; a reason to stop this
  // host's ranks when one arrived (or a node was lost), once.
  std::optional<std::string> poll();
  // This host's ranks failed: every host is told (via node 0).
  void report_failure(const std::string& why);
  // This host's ranks all exited 0.
  void report_done();
  // Node 0: every other node has said DONE. Node k: its DONE went to node 0.
  bool others_done() const;
  // The stop reason poll() returned was this node's own heartbeat timing out
  // (node 0: a node went silent; node k: node 0 did), not a peer's STOP or a
  // connection closing.
  bool lost_contact() const { return lost_contact_; }

 private:
  // A connection's place in the handshake. Node 0's side: challenged ->
  // proven; node k's: connected -> hello_sent -> proven. Only a proven
  // peer's STOP and DONE count.
  enum class Stage {
    challenged,  // node 0 sent its CHALLENGE; the HELLO is due within 10 s
    connected,   // node k, waiting for node 0's CHALLENGE
    hello_sent,  // node k sent its HELLO; node 0's WELCOME is due
    proven,
  };
  struct Peer {
    int fd = -1;
    Stage stage = Stage::challenged;
    int node = -1;          // once proven
    std::string host;       // once proven (node 0: the HELLO's; node k: addr)
    std::string address;    // where it connected from (for the log)
    std::string challenge;  // node 0's nonce, from its CHALLENGE
    std::string nonce;      // node k's nonce, from its HELLO
    std::string inbox;
    bool done = false;
    std::chrono::steady_clock::time_point since;
    std::chrono::steady_clock::time_point heard;  // its last bytes (once proven)
    bool proven() const { return stage == Stage::proven; }
  };
  void send_line(Peer& p, const std::string& line);
  void broadcast(const std::string& line, const Peer* except);
  std::optional<std::string> read_from(Peer& p);
  // Node 0: handles a line from a connection yet to prove itself.
  void admit(Peer& p, const std::string& line);
  // Node k: a line from node 0 before its WELCOME; a stop reason when it refused us or proved nothing.
  std::optional<std::string> greet(Peer& p, const std::string& line);
  void ignore(Peer& p, const std::string& why);
  void try_connect();
  // Sends BEAT to proven peers when due; a stop reason when one went silent.
  std::optional<std::string> beat();

  int nnodes_, node_rank_;
  std::string addr_, host_, secret_;
  int port_;
  int listen_fd_ = -1;
  std::vector<Peer> peers_;  // node 0: one per connection; node k: node 0
  std::chrono::steady_clock::time_point connect_deadline_;
  bool connected_ = false;
  bool stopped_ = false;  // a stop reason was returned (or this host reported one)
  bool done_ = false;
  bool done_sent_ = false;
  std::optional<std::string> failure_;    // node k: reported before node 0 proved itself
  std::optional<std::string> pending_;    // a reason found while sending
  std::optional<std::string> stop_line_;  // node 0: the STOP sent, for a node joining after it
  int ignored_logged_ = 0;
  std::chrono::milliseconds heartbeat_timeout_;
  std::chrono::steady_clock::time_point last_beat_{};
  bool lost_contact_ = false;
};

}  // namespace zero::launch
