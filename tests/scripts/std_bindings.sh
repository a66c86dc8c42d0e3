#!/usr/bin/env bash
# Which library each project binary's calls into libstdc++ bind to (issue 36
# item 1). The wheel's libtorch.so exports its own copies of 64
# std::filesystem functions; a binary whose NEEDED list puts torch's
# libraries before libstdc++ binds its std:: calls to them, and one of them
# jumps to address 0 (seen with the GPU image's GCC 13 build). zero::zero's
# link option puts libstdc++ first; this checks the result, without running
# the program: the dynamic linker traces the load (LD_TRACE_LOADED_OBJECTS),
# binds every symbol at once (LD_BIND_NOW) and logs each binding
# (LD_DEBUG=bindings).
#   std_bindings.sh BINARY...                 every binary binds no std:: symbol to torch
#   std_bindings.sh --expect-bad BINARY       the binary does (the check's own negative control)
set -uo pipefail
expect_bad=0
if [ "${1:-}" = --expect-bad ]; then
  expect_bad=1
  shift
fi
[ $# -gt 0 ] || { echo "usage: std_bindings.sh [--expect-bad] BINARY..." >&2; exit 2; }

# The std:: symbols (mangled _ZNSt..., _ZSt...) `bin` binds to a torch
# library (libtorch*.so, libc10*.so), one "symbol -> library" per line.
torch_bindings() {
  local bin=$1
  LD_DEBUG=bindings LD_TRACE_LOADED_OBJECTS=1 LD_BIND_NOW=1 LD_WARN=yes "$bin" 2>&1 >/dev/null |
    awk -v self="$bin" '
      $0 ~ /binding file / {
        from = $0; sub(/.*binding file /, "", from); sub(/ \[[0-9]+\] to .*/, "", from)
        if (from != self) next
        to = $0; sub(/.* to /, "", to); sub(/ \[[0-9]+\]: .*/, "", to)
        sym = $0; sub(/.*symbol `/, "", sym); sub(/'"'"'.*/, "", sym)
        n = split(to, parts, "/"); lib = parts[n]
        if (sym ~ /^_Z(NSt|St)/ && lib ~ /^lib(torch|c10)/) print sym " -> " to
      }' | sort -u
}

status=0
for bin in "$@"; do
  [ -x "$bin" ] || { echo "std_bindings: $bin: not an executable" >&2; status=2; continue; }
  found=$(torch_bindings "$bin")
  count=$(printf '%s' "$found" | grep -c . || true)
  if [ "$expect_bad" = 1 ]; then
    if [ "$count" -gt 0 ]; then
      echo "std_bindings: $bin binds $count std:: symbols to torch, as expected of a plain link (the check can fail)"
    else
      echo "std_bindings: FAILED: $bin was linked with torch first, yet no std:: symbol binds to torch: the check is blind" >&2
      status=1
    fi
  elif [ "$count" -gt 0 ]; then
    echo "std_bindings: FAILED: $bin binds $count std:: symbols to torch's copies (libstdc++ is not searched first;" \
      "link it through zero::zero, or list libstdc++ before torch's libraries):" >&2
    printf '%s\n' "$found" | head -n 10 | while read -r sym arrow lib; do
      echo "  $(echo "$sym" | c++filt) -> $lib" >&2
    done
    status=1
  else
    echo "std_bindings: $bin: no std:: symbol binds to torch"
  fi
done
exit $status
