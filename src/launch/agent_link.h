// What `zero-run --hostfile` (the launcher) and the agent it starts on each
// host through --host-exec say to each other. The agent's command line is
// only `zero-run --agent`: what it is to do comes on its stdin, so that
//   - the job's secret is on no command line (`ps` shows those to anyone),
//   - no word of the program's or of the hostfile's reaches a shell on the
//     host (ssh hands its command to one; a --host-exec that is not ssh may
//     too), to be re-split or run;
// and that stdin is then how the agent knows the launcher still holds its
// end: see LauncherLink::alive.
//
// Launcher -> agent (stdin), a line each:
//   SECRET <hex>                 the job's secret (launch/secret.h)
//   ARG <hex>                    each of the agent's arguments, in order
//   GO                           the end of the setup
//   PORTS <rendezvous> <agents>  nodes > 0, when node 0 chose them
// hex keeps any byte of an argument (spaces, quotes, newlines) out of the
// framing. Agent of node 0 -> launcher (its stdout, before any rank's line):
//   ZERO-RUN-PORTS <rendezvous> <agents>   the ports it chose and holds
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zero::launch {

struct AgentSetup {
  std::string secret;
  std::vector<std::string> args;
};

std::string setup_message(const AgentSetup& setup);
std::string ports_message(int rendezvous, int agents);
// Node 0's agent -> launcher, and the launcher's reading of it.
std::string ports_report(int rendezvous, int agents);
std::optional<std::pair<int, int>> parse_ports_report(const std::string& line);

// The agent's end: its stdin, the launcher's pipe (through ssh or any
// --host-exec that passes stdin on).
class LauncherLink {
 public:
  explicit LauncherLink(int fd = 0) : fd_(fd) {}

  // Blocks until the setup is read; throws std::runtime_error saying why not
  // (stdin closed first: a --host-exec that does not pass stdin on; a
  // malformed line; nothing by `deadline`).
  AgentSetup read_setup(std::chrono::steady_clock::time_point deadline);
  // Blocks until PORTS; throws as read_setup.
  std::pair<int, int> read_ports(std::chrono::steady_clock::time_point deadline);

  // Reads whatever is there without blocking; false once the launcher's end
  // is closed. The launcher holds that end for as long as it runs, and its
  // process exiting or being killed (any signal), its ssh client dying or
  // that client's connection being closed all close it (sshd closes the
  // command's stdin when its client goes): whatever --host-exec is and
  // whatever it does with signals, the agent sees end-of-file. Why not a
  // signal: sshd sends none, and a --host-exec may pass none on. Why not a
  // heartbeat: a launcher stopped (^Z) or a slow link would stop the job.
  // A link that goes silent without closing is seen when ssh's keepalives
  // give up (ServerAliveInterval, sshd's ClientAliveInterval).
  bool alive();
  int fd() const { return fd_; }

 private:
  std::optional<std::string> line(std::chrono::steady_clock::time_point deadline);
  int fd_;
  std::string buffer_;
  bool eof_ = false;
};

}  // namespace zero::launch
