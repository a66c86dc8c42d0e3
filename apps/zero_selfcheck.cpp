// zero-selfcheck: checks the distributed substrate on however many ranks it
// is launched with, and prints what it did. `./run demo` runs it on 2 ranks
// until the trainer exists.
//
//   zero-run -n 2 -- zero-selfcheck
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include "zero/comm.h"

namespace {

using zero::comm::ReduceOp;

bool check(bool ok, const char* what, int rank) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what);
  (void)rank;
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  // No options: a launcher runs it as is. --help answers on stdout.
  if (argc > 1) {
    const std::string a = argv[1];
    const bool help = a == "-h" || a == "--help";
    std::fprintf(help ? stdout : stderr,
                 "%s"
                 "usage: zero-run -n N -- zero-selfcheck\n"
                 "Checks the collectives (all-reduce, allgather, reduce-scatter, broadcast) on the\n"
                 "ranks it is launched with and prints what it did. It takes no options.\n",
                 help ? "" : ("zero-selfcheck: unknown argument " + a + "\n").c_str());
    return help ? 0 : 2;
  }
  try {
    auto t0 = std::chrono::steady_clock::now();
    auto world = zero::init_distributed();
    auto& comm = world->comm();
    const auto& g = world->group();
    const int n = world->size(), r = world->rank();
    std::printf("rank %d of %d joined (%s launcher, master %s:%d)\n", r, n, world->env().launcher.c_str(),
                world->env().master_addr.c_str(), world->env().master_port);
    bool ok = true;

    // all-reduce: sum of (rank + 1) over ranks = n(n+1)/2.
    auto t = at::full({1000}, r + 1.0, at::kFloat);
    comm.all_reduce(g, t)->wait();
    ok &= check(t.eq(n * (n + 1) / 2.0).all().item<bool>(), "all_reduce(sum) fp32", r);

    // allgather into one flat buffer: slot k holds rank k's shard.
    const int64_t shard = 333;
    auto mine = at::full({shard}, static_cast<double>(r), at::kBFloat16);
    auto full = at::empty({shard * n}, at::kBFloat16);
    comm.all_gather(g, full, mine)->wait();
    auto expect = at::arange(n, at::kFloat).repeat_interleave(shard).to(at::kBFloat16);
    ok &= check(full.equal(expect), "allgather bf16 (moved as 16-bit bytes)", r);

    // reduce-scatter (average) of a bf16 buffer into an fp32 shard.
    auto in = at::arange(shard * n, at::kFloat).to(at::kBFloat16);
    auto out = at::empty({shard}, at::kFloat);
    comm.reduce_scatter(g, out, in, ReduceOp::Avg)->wait();
    auto want = in.narrow(0, r * shard, shard).to(at::kFloat);
    ok &= check(out.equal(want), "reduce_scatter(avg) bf16 -> fp32 shard", r);

    // broadcast from the last rank.
    auto b = at::full({7}, static_cast<double>(r), at::kDouble);
    comm.broadcast(g, b, n - 1)->wait();
    ok &= check(b.eq(n - 1).all().item<bool>(), "broadcast from the last rank", r);
    comm.barrier(g)->wait();

    for (const auto& [op, c] : comm.counters().totals())
      std::printf("counter %-15s calls=%lld bytes=%lld wire_bytes=%lld\n", op.c_str(),
                  static_cast<long long>(c.calls), static_cast<long long>(c.bytes),
                  static_cast<long long>(c.wire_bytes));
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s in %.0f ms\n", ok ? "self-check passed" : "self-check FAILED", ms);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-selfcheck: %s\n", e.what());
    return 1;
  }
}
