#!/usr/bin/env bash
# DeepSpeed for the GPU machines, carried as wheels: they have no network,
# and their python3 (3.12, torch 2.11.0+cu130) lacks DeepSpeed and the
# pure-Python packages it needs (../shared/DEVICE.md).
#
#   bench/peer_wheels.sh pack DIR      here, with PyPI: DeepSpeed's wheel, built
#                                      from its sdist (pip wheel --no-deps;
#                                      DS_BUILD_OPS=0: no op compiled, none is
#                                      needed with "torch_adam"), and each of
#                                      its requirements the GPU machines lack,
#                                      for CPython 3.12 on manylinux x86_64
#   bench/peer_wheels.sh check DIR     one version of each name, every
#                                      requirement packed or on the GPU image
#   bench/peer_wheels.sh install DIR [SITE]
#                                      there, offline: pip install --no-index
#                                      --no-deps --target SITE [/tmp/zero-peer-site],
#                                      an import check; prints SITE, the
#                                      PYTHONPATH entry to use:
#       site=$(bench/peer_wheels.sh install .carry/wheels) && export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
#
# One version of each (two stop the install). DeepSpeed 0.19.8 requires
# einops, hjson, msgpack, ninja, numpy, packaging, psutil, py-cpuinfo,
# pydantic>=2, torch and tqdm; the GPU image has all but hjson and pydantic
# (KINDS.md's package list, /work/.library/device). pydantic 2.14.4 pins
# pydantic-core 2.50.5 (a compiled cp312 wheel) and wants annotated-types,
# typing-inspection and typing-extensions>=4.16 -- the image's
# typing-extensions version is not known, so it comes along too (on
# PYTHONPATH it comes first; newer versions only add). These are the
# versions `./run bench`'s peer_deps resolved here (2026-11), so the CPU and
# GPU peers run the same DeepSpeed stack. `pack` checks each wheel's
# Requires-Dist against what is packed plus what the image is known to hold.
set -euo pipefail

DEEPSPEED=deepspeed==0.19.8
WHEELS=(hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
        typing-inspection==0.4.5 typing-extensions==4.16.0)
# On the GPU image already (KINDS.md, "Python packages already there").
THERE="einops msgpack ninja numpy packaging psutil py-cpuinfo torch tqdm nvidia-ml-py"
PIP=(python3 -m pip)  # ZERO_PACK_PYTHON picks another python with pip
[ -n "${ZERO_PACK_PYTHON:-}" ] && PIP=("$ZERO_PACK_PYTHON" -m pip)

pack() {
  local dir=$1
  mkdir -p "$dir"
  local ds_wheel="$dir/deepspeed-${DEEPSPEED#*==}-py3-none-any.whl"
  if [ ! -f "$ds_wheel" ]; then
    echo "peer_wheels: building $DEEPSPEED's wheel from its sdist (DS_BUILD_OPS=0)" >&2
    DS_BUILD_OPS=0 "${PIP[@]}" wheel -q --no-deps --no-binary deepspeed -w "$dir" "$DEEPSPEED" >&2
  fi
  echo "peer_wheels: downloading ${WHEELS[*]} for CPython 3.12, manylinux x86_64" >&2
  "${PIP[@]}" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "${WHEELS[@]}" >&2
  check "$dir"
}

# Exactly one wheel per name, and every requirement met (offline).
check() {
  local dir=$1
  python3 - "$dir" "$THERE" <<'PY'
import re, sys, zipfile, pathlib
d, there = pathlib.Path(sys.argv[1]), set(sys.argv[2].split())
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
names = {}
for w in sorted(d.glob("*.whl")):
    names.setdefault(norm(w.name.split("-")[0]), []).append(w.name)
dup = {n: v for n, v in names.items() if len(v) > 1}
if dup:
    sys.exit(f"peer_wheels: more than one version of {dup}: remove the old ones from {d}")
missing = []
for n, (w,) in names.items():
    with zipfile.ZipFile(d / w) as z:
        meta = next(f for f in z.namelist() if f.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            if line.startswith("Requires-Dist:") and "extra ==" not in line:
                req = norm(re.match(r"Requires-Dist:\s*([A-Za-z0-9_.-]+)", line).group(1))
                if req not in names and req not in there:
                    missing.append(f"{w} needs {req}")
if missing:
    sys.exit("peer_wheels: not packed and not on the GPU machines: " + "; ".join(missing))
PY
  local n total
  n=$(ls "$dir"/*.whl | wc -l)
  total=$(du -ch "$dir"/*.whl | tail -n 1 | cut -f1)
  echo "peer_wheels: $n wheels, $total in $dir" >&2
}

install() {
  local dir=$1 site=${2:-/tmp/zero-peer-site}
  ls "$dir"/*.whl > /dev/null 2>&1 || { echo "peer_wheels: no wheels in $dir (bench/peer_wheels.sh pack $dir, where PyPI is reachable)" >&2; exit 2; }
  python3 -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$site" "$dir"/*.whl >&2
  # The import check: DeepSpeed's own modules and pydantic's compiled core.
  PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} python3 -c '
import deepspeed, pydantic, pydantic_core, sys
print(f"peer_wheels: deepspeed {deepspeed.__version__} ({deepspeed.__file__}), pydantic {pydantic.VERSION}, "
      f"accelerator {deepspeed.get_accelerator().device_name()}", file=sys.stderr)' >&2
  echo "$site"
}

case "${1:-}" in
  pack) pack "${2:?pack DIR}" ;;
  install) install "${2:?install DIR [SITE]}" "${3:-}" ;;
  check) check "${2:?check DIR}" ;;
  *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
