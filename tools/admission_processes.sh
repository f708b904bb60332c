#!/bin/bash
# The real-process overload runs of docs/admission.md: 4 sim engines, a kv_aware router, `kvroute loadgen
# --tenant`. Usage: [ROUTER_FLAGS="--workers 2"] tools/admission_processes.sh OUT_DIR
# (run from the repository root; ports 8100-8104; ROUTER_FLAGS go to every router started)
set -u
out=${1:?usage: tools/admission_processes.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=$PWD
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; pids=(); }
trap stop EXIT
fleet() {  # router flags...
  stop
  for i in 1 2 3 4; do
    python3 -m kvroute_cli engine --backend sim --port $((8100 + i)) --log-level WARNING & pids+=($!)
  done
  sleep 4
  python3 -m kvroute_cli router --port 8100 --log-level WARNING --api-key A=ka --api-key B=kb \
    --engine http://127.0.0.1:8101 --engine http://127.0.0.1:8102 --engine http://127.0.0.1:8103 \
    --engine http://127.0.0.1:8104 ${ROUTER_FLAGS:-} "$@" & pids+=($!)
  for _ in $(seq 1 40); do curl -sf http://127.0.0.1:8100/health >/dev/null && return; sleep 0.5; done
}
run() {  # name, router flags..., --, loadgen flags...
  local name=$1; shift; local flags=()
  while [ "$1" != "--" ]; do flags+=("$1"); shift; done; shift
  fleet "${flags[@]}"
  python3 -m kvroute_cli loadgen --target http://127.0.0.1:8100 --slo-ttft 0.5 --no-progress --out "$out/$name" "$@" \
    > "$out/$name.txt" 2>&1
  curl -s http://127.0.0.1:8100/metrics | grep '^kvroute_router_admission_' > "$out/$name.metrics"
  echo "$name done, load average $(cut -d' ' -f1 /proc/loadavg)"
}
flood=(--tenant name=A,workload=shared-prefix,rate=4,duration=44,key=ka
       --tenant name=B,workload=random,rate=60,duration=40,start=2,key=kb,seed=7)
run alone25 -- --tenant name=B,workload=random,rate=25,duration=20,key=kb,seed=11
run alone35 -- --tenant name=B,workload=random,rate=35,duration=20,key=kb,seed=12
run flood-off -- "${flood[@]}"
run flood-on --slo-ttft-s 0.5 -- "${flood[@]}"
run priority --slo-ttft-s 0.5 -- --tenant name=H,workload=random,rate=8,duration=55,priority=-1,seed=21,key=kb \
  --tenant name=L,workload=random,rate=60,duration=30,start=5,priority=1,seed=22,key=kb \
  --tenant name=Lafter,workload=random,rate=8,duration=15,start=40,priority=1,seed=23,key=kb
