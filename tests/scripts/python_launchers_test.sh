#!/usr/bin/env bash
# Issue 35 item 5: a Python training script launched as users launch it --
# zero-run, torchrun, DeepSpeed's launcher, mpirun's and srun's variables
# (two processes started here with only those set), and zero-run on two
# hosts simulated by network namespaces (root only) -- trains to the same
# losses on 2 ranks.
#   python_launchers_test.sh ZERO_RUN PYTHON BUILD_PYTHON_DIR
set -uo pipefail
zero_run=$1 python=$2 pkg=$3
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/lib.sh"
tmp=$(mktemp -d)
export PYTHONPATH=$pkg OMP_NUM_THREADS=1
script=$here/python/launch_smoke.py
losses_of() { sed -n 's/.*losses: //p' <<<"$1" | head -n 1; }
port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

out=$("$zero_run" -n 2 --timeout 120 -- "$python" "$script" 2>&1)
want=$(losses_of "$out")
check "zero-run -n 2 -- python script.py trains ($want)" [ -n "$want" ]
[ -n "$want" ] || tail -n 20 <<<"$out"

out=$(timeout 120 "$python" -m torch.distributed.run --nproc_per_node 2 --master_port "$(port)" "$script" 2>&1)
got=$(losses_of "$out")
check "torchrun (python -m torch.distributed.run) --nproc_per_node 2: the same losses ($got)" [ "$got" = "$want" ]
[ "$got" = "$want" ] || tail -n 20 <<<"$out"

# DeepSpeed's own launcher (`deepspeed --num_gpus 2 script.py`), where it is installed.
if "$python" -c "import deepspeed" 2>/dev/null; then
  out=$(cd "$tmp" && timeout 120 "$python" -m deepspeed.launcher.runner --num_gpus 2 --master_port "$(port)" \
    "$script" 2>&1)
  got=$(losses_of "$out")
  check "DeepSpeed's launcher (deepspeed --num_gpus 2): the same losses ($got)" [ "$got" = "$want" ]
  [ "$got" = "$want" ] || tail -n 20 <<<"$out"
else
  echo "skip DeepSpeed's launcher: deepspeed is not installed for $python"
fi

# mpirun's and srun's variables alone (rank, size, local rank; the address
# as a job script exports it): two processes, each told only that.
launch_pair() {  # NAME VAR_RANK VAR_SIZE VAR_LOCAL
  local p pids=() r
  p=$(port)
  for r in 0 1; do
    env -u RANK -u WORLD_SIZE -u LOCAL_RANK "$2=$r" "$3=2" "$4=$r" MASTER_ADDR=127.0.0.1 MASTER_PORT="$p" \
      timeout 120 "$python" "$script" > "$tmp/$1.$r" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  cat "$tmp/$1.0" "$tmp/$1.1"
}
out=$(launch_pair mpirun OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK)
got=$(losses_of "$out")
check "mpirun's variables (OMPI_COMM_WORLD_*): the same losses ($got)" [ "$got" = "$want" ]
[ "$got" = "$want" ] || tail -n 20 <<<"$out"
out=$(launch_pair srun SLURM_PROCID SLURM_NTASKS SLURM_LOCALID)
got=$(losses_of "$out")
check "srun's variables (SLURM_*): the same losses ($got)" [ "$got" = "$want" ]
[ "$got" = "$want" ] || tail -n 20 <<<"$out"

# Two hosts: zero-run --hostfile over network namespaces, one rank each.
. "$here/scripts/netns_hosts.sh"
trap 'netns_hosts_down; rm -rf "$tmp"' EXIT
if why=$(netns_hosts_up "$tmp"); then
  printf '%s slots=1\n%s slots=1\n' "$HOST_A" "$HOST_B" > "$tmp/hostfile"
  out=$(GLOO_SOCKET_IFNAME=zt0 "$zero_run" --hostfile "$tmp/hostfile" --host-exec "ip netns exec {host}" \
    --master-addr 10.231.0.1 --timeout 120 -- "$python" "$script" 2>&1)
  got=$(losses_of "$out")
  check "zero-run on 2 hosts (network namespaces), 1 rank each: the same losses ($got)" [ "$got" = "$want" ]
  [ "$got" = "$want" ] || tail -n 20 <<<"$out"
else
  echo "skip two hosts: $why"
fi
finish
