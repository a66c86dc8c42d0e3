#include "launch/hostfile.h"

#include <cctype>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

namespace zero::launch {

std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& origin) {
  std::vector<HostSlots> hosts;
  std::set<std::string> seen;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream words(line);
    std::string host, slots;
    if (!(words >> host)) continue;
    const std::string where = origin + ":" + std::to_string(n) + ": ";
    // It goes into --host-exec's words ({host}): as "-o..." it would be an
    // option there (ssh's -oProxyCommand= runs a command), not a host.
    if (host[0] == '-')
      throw std::invalid_argument(where + "host name '" + host +
                                  "' starts with '-' (it would be an option to --host-exec's command)");
    // And the command may hand it to a shell (on the host, or a remote
    // one, as ssh does its command): it must mean the same there.
    if (!shell_inert(host))
      throw std::invalid_argument(where + "host name '" + host + "' holds characters a shell would split or act on");
    if (!(words >> slots) || slots.rfind("slots=", 0) != 0)
      throw std::invalid_argument(where + "expected \"" + host + " slots=N\"");
    std::string rest;
    if (words >> rest) throw std::invalid_argument(where + "unexpected '" + rest + "' after " + slots);
    const std::string count = slots.substr(6);
    size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(count, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != count.size() || value < 1 || value > 1024)
      throw std::invalid_argument(where + "slots must be an integer in [1, 1024], got '" + count + "'");
    if (!seen.insert(host).second) throw std::invalid_argument(where + "host " + host + " is listed twice");
    hosts.push_back({host, value});
  }
  if (hosts.empty()) throw std::invalid_argument(origin + ": no host listed (expected lines \"HOST slots=N\")");
  return hosts;
}

std::vector<HostSlots> read_hostfile(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::invalid_argument("cannot read hostfile " + path);
  std::stringstream text;
  text << f.rdbuf();
  return parse_hostfile(text.str(), path);
}

namespace {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

bool shell_inert(const std::string& word) {
  if (word.empty()) return false;
  for (unsigned char c : word)
    if (!std::isalnum(c) && !std::strchr("_-.,/:=@%+", c)) return false;
  return true;
}

std::vector<std::string> on_host(const std::string& templ, const std::string& host,
                                 const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  std::istringstream words(templ);
  for (std::string w; words >> w;) {
    for (size_t at; (at = w.find("{host}")) != std::string::npos;) w.replace(at, 6, host);
    out.push_back(w);
  }
  const auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  const bool via_ssh = !out.empty() && (out[0] == "ssh" || ends_with(out[0], "/ssh"));
  if (!via_ssh) {
    // Passed as words; but the command may hand them to a shell on the host
    // as ssh does (a wrapper, sudo ssh, pdsh ...), so each must mean the
    // same to one.
    for (const auto& a : argv)
      if (!shell_inert(a))
        throw std::invalid_argument("'" + a + "' holds characters a shell on the host would split or act on, and " +
                                    "--host-exec '" + templ + "' is not ssh, so it is not quoted for one" +
                                    " (install zero-run at a plain path)");
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }
  std::string command;
  for (const auto& a : argv) command += (command.empty() ? "" : " ") + shell_quote(a);
  out.push_back(command);
  return out;
}

}  // namespace zero::launch
