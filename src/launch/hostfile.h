// DeepSpeed's hostfile, as zero-run --hostfile reads it: one host per line,
// "HOST slots=N", '#' starting a comment, blank lines ignored. The order is
// the node order: the first host is node 0 and holds rank 0.
#pragma once

#include <string>
#include <vector>

namespace zero::launch {

struct HostSlots {
  std::string host;
  int slots;
};

// Throws std::invalid_argument naming the line and what is wrong with it
// (no slots, a bad count, a host listed twice, a host name starting with
// '-', which would be an option to --host-exec's command, or one that is
// not shell_inert) or that no host is listed.
std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& origin);
std::vector<HostSlots> read_hostfile(const std::string& path);

// The command that runs ARGV on HOST: TEMPLATE split at spaces with {host}
// replaced, then ARGV. When the template runs ssh, ARGV becomes one
// shell-quoted word (ssh hands its command to the remote shell); otherwise
// ARGV's words are passed as they are, and each must be shell_inert (the
// command may hand them to a shell on the host too): std::invalid_argument
// if one is not. (zero-run's ARGV is its own path and `--agent`: the job
// itself goes on the agent's stdin, launch/agent_link.h.)
std::vector<std::string> on_host(const std::string& templ, const std::string& host,
                                 const std::vector<std::string>& argv);

// True for a non-empty word of letters, digits and _-.,/:=@%+ only: one that
// a POSIX shell leaves as it is.
bool shell_inert(const std::string& word);

}  // namespace zero::launch
