# Tiny assertion helpers for the shell-driven tests.
failures=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
contains() { grep -qF -- "$2" <<<"$1"; }
lacks() { ! grep -qF -- "$2" <<<"$1"; }
now() { date +%s.%N; }
elapsed_lt() { awk -v a="$1" -v b="$(now)" -v lim="$2" 'BEGIN { exit !((b - a) < lim) }'; }
finish() { if [ "$failures" -eq 0 ]; then echo "all checks passed"; exit 0; else echo "$failures check(s) failed"; exit 1; fi; }
# Processes, read from /proc (the GPU machines may have no procps, so no pgrep):
# child_pids PID          the ids of PID's children, ascending
# cmdline_running TEXT    true when a process's command line holds TEXT
child_pids() {
  local f line rest
  for f in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null < "$f" || continue
    rest=${line##*) }  # after the command name, which may hold spaces
    rest=${rest#* }    # after the state: the parent's id
    [ "${rest%% *}" = "$1" ] && { f=${f#/proc/}; echo "${f%/stat}"; }
  done | sort -n
}
cmdline_running() {
  local f args
  for f in /proc/[0-9]*/cmdline; do
    [ "$f" = "/proc/$BASHPID/cmdline" ] && continue
    mapfile -d '' args 2>/dev/null < "$f" || continue
    [[ "${args[*]}" == *"$1"* ]] && return 0
  done
  return 1
}
