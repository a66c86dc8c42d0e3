# Tiny assertion helpers for the shell-driven tests.
failures=0
pass() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then pass "$what"; else fail "$what"; fi; }
contains() { grep -qF -- "$2" <<<"$1"; }
now() { date +%s.%N; }
elapsed_lt() { awk -v a="$1" -v b="$(now)" -v lim="$2" 'BEGIN { exit !((b - a) < lim) }'; }
finish() { if [ "$failures" -eq 0 ]; then echo "all checks passed"; exit 0; else echo "$failures check(s) failed"; exit 1; fi; }
