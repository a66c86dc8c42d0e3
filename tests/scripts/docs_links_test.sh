#!/usr/bin/env bash
# The docs cite only what exists: every relative link (target file and, for
# a #fragment into a Markdown file, its heading), every `tests/...`,
# `bench/...`, `examples/...`, `docs/...`, `src/...`, `include/...`,
# `configs/...` and `apps/...` path, and every `./run <cmd>` in README.md and
# docs/*.md (bench/results/, ./run bench's output, excepted). Usage: docs_links_test.sh [SOURCE_DIR] (default: the tree
# holding this script).
set -u
SRC=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$SRC" || exit 1
fail=0
bad() { echo "FAIL: $1"; fail=1; }

# ./run's commands: the words of its `case` arms.
run_cmds=$(sed -n 's/^  \([a-z][a-z-]*\))\s.*/\1/p' run | tr '\n' ' ')
[ -n "$run_cmds" ] || bad "no commands found in ./run"

# GitHub's anchor of a heading: lower case, punctuation dropped, spaces to -.
anchors() {
  sed -n 's/^#\{1,6\} \(.*\)$/\1/p' "$1" | tr 'A-Z' 'a-z' |
    sed 's/[^a-z0-9 _-]//g; s/ /-/g'
}

docs=(README.md docs/*.md)
n=0
for doc in "${docs[@]}"; do
  dir=$(dirname "$doc")
  # Code blocks (fenced or indented) cite commands too: checked like prose.
  # Relative links: ](target) not starting with a scheme or #.
  while IFS= read -r target; do
    n=$((n + 1))
    path=${target%%#*}
    frag=${target#"$path"}; frag=${frag#\#}
    if [ -z "$path" ]; then file=$doc; else file=$dir/$path; fi
    if [ ! -e "$file" ]; then bad "$doc: link to '$target': $file does not exist"; continue; fi
    if [ -n "$frag" ] && [[ "$file" == *.md ]]; then
      anchors "$file" | grep -qx -- "$frag" || bad "$doc: link to '$target': no heading '#$frag' in $file"
    fi
  done < <(grep -oE '\[[^]]+\]\([^) ]+\)' "$doc" | sed -E 's/^.*\]\(//; s/\)$//' | grep -vE '^[a-z]+:')

  # Cited repository paths. A path may end in a glob-like `*` or `.*`
  # (tests/mr/engine_test.cpp's `MultipleBackward.*` is a filter, not a path).
  while IFS= read -r p; do
    n=$((n + 1))
    p=${p%%[,.:;)]}
    p=${p%.}
    case "$p" in *'*'*|*'{'*|*'<'*|*'...'*|*'…'*) continue ;; esac
    case "$p" in bench/results|bench/results/*) continue ;; esac  # ./run bench's output
    [ -e "$p" ] || bad "$doc: cites $p, which does not exist"
  done < <(grep -oE '(^|[^A-Za-z0-9_./-])(tests|bench|examples|docs|src|include|configs|apps)/[A-Za-z0-9_./*{}<>…-]*[A-Za-z0-9_/]' "$doc" |
             sed -E 's/^[^A-Za-z0-9_./-]//' | grep -E '^(tests|bench|examples|docs|src|include|configs|apps)/')

  # ./run commands.
  while IFS= read -r c; do
    n=$((n + 1))
    [[ " $run_cmds " == *" $c "* ]] || bad "$doc: cites './run $c', which ./run does not have (it has: $run_cmds)"
  done < <(grep -oE '\./run [a-z][a-z-]*' "$doc" | sed 's/^\.\/run //')
done

# A copy of the stock example (README.md, docs/getting-started.md) is the
# file itself: a ```cpp block holding its marker line must equal
# examples/stock/main.cpp (the install test builds and runs that file).
marker='// Stage and precision (fp32, bf16, fp16) come from the config alone.'
for doc in "${docs[@]}"; do
  grep -qF -- "$marker" "$doc" || continue
  n=$((n + 1))
  awk -v m="$marker" '/^```cpp$/ { buf = ""; inb = 1; next }
       inb && /^```$/ { if (index(buf, m)) { printf "%s", buf; exit } inb = 0; next }
       inb { buf = buf $0 "\n" }' "$doc" | diff -q - examples/stock/main.cpp >/dev/null ||
    bad "$doc: its copy of the stock example differs from examples/stock/main.cpp"
done

echo "docs_links: $n citations checked in ${#docs[@]} files"
exit $fail
