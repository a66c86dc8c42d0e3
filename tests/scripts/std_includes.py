#!/usr/bin/env python3
"""Every file includes the standard headers of the std names it uses.

Why: a standard library's headers include one another differently from one
release to the next, so a file that compiles with this machine's GCC 12
through a header another header happened to pull in can fail with a newer
one. It did: the GPU machine's GCC 13 stopped at src/comm/shm/lane.h
(std::runtime_error without <stdexcept>), 2026-11-26. CI has one compiler,
so this check stands in for the others: each std name below must come with
its header, included by the file itself or by a project header it includes.

Names from headers every standard header brings (std::move, std::pair,
std::initializer_list) are not checked, and a name is found by a pattern,
not a parser: comments and string literals are left out first.

    tests/scripts/std_includes.py FILE...   # prints FILE HEADER... per miss; exit 1 if any
"""
import pathlib
import re
import sys

# Each pattern of std names and the header that declares them.
HEADERS = {
    r"std::(runtime_error|logic_error|invalid_argument|out_of_range|length_error|range_error|overflow_error)\b":
        "stdexcept",
    r"(?<![\w:])(std::)?(u?int(8|16|32|64)_t|uintptr_t|intptr_t)\b": "cstdint",
    r"std::(string|to_string|stoi|stol|stoll|stoull|stod|getline)\b": "string",
    r"std::string_view\b": "string_view",
    r"std::vector\b": "vector",
    r"std::(unique_ptr|shared_ptr|make_unique|make_shared|weak_ptr)\b": "memory",
    r"std::function\b": "functional",
    r"std::(optional|nullopt)\b": "optional",
    r"std::(map|multimap)\b": "map",
    r"std::unordered_map\b": "unordered_map",
    r"std::unordered_set\b": "unordered_set",
    r"std::set\b": "set",
    r"std::(mutex|lock_guard|unique_lock|scoped_lock)\b": "mutex",
    r"std::condition_variable\b": "condition_variable",
    r"std::thread\b": "thread",
    r"std::atomic\b": "atomic",
    r"std::chrono\b": "chrono",
    r"std::array\b": "array",
    r"std::(min|max|sort|find|find_if|any_of|all_of|none_of|count|count_if|fill|copy|reverse|remove_if|"
    r"max_element|min_element|clamp|equal|transform|unique|lower_bound|upper_bound|stable_sort|fill_n|copy_n)\b(?!_)":
        "algorithm",
    r"std::(memcpy|memset|memcmp|strerror|strlen|strcmp|strncmp|memmove)\b": "cstring",
    r"std::(ostringstream|istringstream|stringstream)\b": "sstream",
    r"std::numeric_limits\b": "limits",
    r"std::deque\b": "deque",
    r"std::list\b": "list",
    r"std::(variant|visit|get_if|holds_alternative)\b": "variant",
    r"std::(tuple|tie|make_tuple)\b": "tuple",
    r"std::(exception_ptr|current_exception|rethrow_exception)\b": "exception",
    r"std::(accumulate|iota|gcd|lcm|partial_sum)\b": "numeric",
    r"std::(setw|setprecision|put_time)\b": "iomanip",
    r"std::(cerr|cout|clog|cin)\b": "iostream",
    r"std::(system_error|error_code|generic_category|system_category|errc)\b": "system_error",
    r"std::(isfinite|isnan|isinf|sqrt|pow|exp|log|ceil|floor|fabs|round|lround|llround)\b": "cmath",
    r"std::(ifstream|ofstream|fstream)\b": "fstream",
    r"std::filesystem\b": "filesystem",
    r"std::(queue|priority_queue)\b": "queue",
    r"std::(future|promise|async)\b": "future",
    r"std::bitset\b": "bitset",
    r"std::(printf|fprintf|snprintf|fflush|fputs|fopen|fclose|FILE|puts|fwrite|fread)\b": "cstdio",
}
# Headers that count for another (the C forms).
SAME = {"cstdint": {"cstdint", "stdint.h"}, "cstring": {"cstring", "string.h"}, "cstdio": {"cstdio", "stdio.h"},
        "cmath": {"cmath", "math.h"}}
ROOT = pathlib.Path(__file__).resolve().parents[2]
SEARCH = [ROOT / d for d in ("include", "src", "tests", "tests/mr", "tests/unit", "bench", ".")]
ANGLE = re.compile(r'#include\s*<([^>]+)>')
QUOTE = re.compile(r'#include\s*"([^"]+)"')


def resolve(name, here):
    for base in [here.parent] + SEARCH:
        c = base / name
        if c.exists():
            return c.resolve()
    return None


def brought(path, seen):
    """The standard headers the project headers that `path` includes bring, recursively."""
    out = set()
    for q in QUOTE.findall(path.read_text()):
        r = resolve(q, path)
        if r is None or r in seen:
            continue
        seen.add(r)
        text = r.read_text()
        out |= set(ANGLE.findall(text)) | brought(r, seen)
    return out


def missing(path):
    text = path.read_text()
    code = re.sub(r"/\*.*?\*/", "", re.sub(r"//.*", "", text), flags=re.S)
    code = re.sub(r'"(\\.|[^"\\])*"', '""', code)
    have = set(ANGLE.findall(text)) | brought(path, set())
    return sorted(h for pat, h in HEADERS.items() if re.search(pat, code) and not (SAME.get(h, {h}) & have))


def main(files):
    bad = 0
    for f in files:
        m = missing(pathlib.Path(f))
        if m:
            bad += 1
            print(f, " ".join(m))
    if bad:
        print(f"std_includes: {bad} file(s) use std names without their header (above: file, headers to include)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
