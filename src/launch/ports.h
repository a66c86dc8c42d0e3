// The ports node 0's zero-run agent binds or checks: its own (the agents'
// job control, launch/job_control.h) and the rendezvous port that rank 0's
// TCPStore binds later. Both are chosen or checked on node 0 itself: a port
// free where the launcher runs says nothing about node 0.
#pragma once

namespace zero::launch {

// A close-on-exec socket with SO_REUSEADDR (as the store's own bind: a
// port in TIME_WAIT is free) bound to `port` (0: one the kernel picks) on
// every address of `family` (AF_INET or AF_INET6); -1 with errno set.
int bind_any(int family, int port);
// The port a bound socket holds, or -1.
int local_port(int fd);

// 0 when `port` can be bound on every address, IPv4 and IPv6, now; else
// the errno saying why not (EADDRINUSE: something listens there).
int port_unavailable(int port);
// A port free on this host now, on every IPv4 address. Throws
// std::runtime_error when there is none.
int pick_free_port();

}  // namespace zero::launch
