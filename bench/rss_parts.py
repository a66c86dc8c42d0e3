#!/usr/bin/env python3
"""Where each rank's resident bytes are, at its RSS peak.

Run beside a job (started before it): every 50 ms it reads the VmRSS of each
process whose command name is one of NAMES (default zero-train); when one
reaches a new peak it reads that process's /proc/PID/smaps and sorts the
resident bytes of its mappings into kinds:
  anon          private memory (heap, the caching allocator's blocks,
                stage 3's gathered units, optimizer state held privately)
  own_shared    this process's shared flat buffers (its zero-cpp memfd)
  peer_shared   other processes' flat buffers it has mapped (zero-copy
                reads): pages RSS counts in their owner's RSS as well
  segment       the shared-memory lanes' /dev/shm segments
  libraries     shared objects and the program's own file
  other_files   any other file mapping
Stops when every process it saw has exited, or after SECONDS. Prints one
JSON object: pid -> {"rss_mib", "at_s", and the kinds in MiB}.

  bench/rss_parts.py SECONDS [NAME,NAME...] > parts.json &
  build/zero-run -n 2 -- build/zero-train ...
"""
import json
import os
import re
import sys
import time

NAMES = sys.argv[2].split(",") if len(sys.argv) > 2 else ["zero-train"]
MEMFD = "memfd:zero-cpp-flat"
MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def processes():
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip() in NAMES:
                    found.append(int(p))
        except OSError:
            pass
    return found


def vm_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def own_memfd_inodes(pid):
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if MEMFD in os.readlink(f"/proc/{pid}/fd/{fd}"):
                inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:
            pass
    return inodes


def kinds_kib(pid):
    own = own_memfd_inodes(pid)
    exe = os.path.realpath(f"/proc/{pid}/exe")
    kib, kind = {}, None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if MAPPING.match(line):
                fields = line.split()
                inode, path = int(fields[4]), " ".join(fields[5:])
                if MEMFD in path:
                    kind = "own_shared" if inode in own else "peer_shared"
                elif path.startswith("/dev/shm/"):
                    kind = "segment"
                elif ".so" in path or path == exe:
                    kind = "libraries"
                elif not path or path.startswith("["):
                    kind = "anon"
                else:
                    kind = "other_files"
            elif line.startswith("Rss:"):
                kib[kind] = kib.get(kind, 0) + int(line.split()[1])
    return kib


def main():
    limit = float(sys.argv[1])
    peaks, seen, start = {}, False, time.time()
    while time.time() - start < limit:
        pids = processes()
        if pids:
            seen = True
        elif seen:
            break
        for pid in pids:
            try:
                rss = vm_rss_kib(pid)
                if rss > peaks.get(pid, {}).get("rss_kib", 0) + 4096:  # a new peak, by 4 MiB or more
                    parts = kinds_kib(pid)
                    peaks[pid] = {"rss_kib": rss, "at_s": round(time.time() - start, 2), "parts": parts}
            except OSError:  # exited meanwhile
                pass
        time.sleep(0.05)
    out = {}
    for pid, p in sorted(peaks.items()):
        row = {"rss_mib": p["rss_kib"] // 1024, "at_s": p["at_s"]}
        row.update({k: v // 1024 for k, v in sorted(p["parts"].items())})
        out[str(pid)] = row
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
