#!/usr/bin/env bash
# Every tool answers -h/--help with its usage on stdout and exit 0, and a
# bad option with its usage on stderr and exit 2 (so `tool --help | less`
# works and scripts can tell asking from misuse).
# Usage: help_test.sh ZERO_RUN ZERO_TRAIN ZERO_CKPT ZERO_SELFCHECK
set -u
. "$(dirname "$0")/lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for tool in "$@"; do
  name=$(basename "$tool")
  for flag in --help -h; do
    out=$("$tool" $flag 2>"$tmp/err")
    rc=$?
    check "$name $flag: exit 0" [ $rc -eq 0 ]
    check "$name $flag: usage on stdout" contains "$out" "usage:"
    check "$name $flag: nothing on stderr" [ ! -s "$tmp/err" ]
  done
  out=$("$tool" --no-such-option 2>"$tmp/err")
  rc=$?
  check "$name --no-such-option: exit 2" [ $rc -eq 2 ]
  check "$name --no-such-option: usage on stderr" contains "$(cat "$tmp/err")" "usage:"
  check "$name --no-such-option: nothing on stdout" [ -z "$out" ]
done
# zero-run's own --help, not the program's: after -- it belongs to the program.
out=$("$1" -n 1 -- printf '<%s>\n' --help 2>&1)
check "zero-run -n 1 -- prog --help: passed to the program" contains "$out" "[rank 0] <--help>"
finish
