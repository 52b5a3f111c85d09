#!/usr/bin/env bash
# goals.sh: the performance goals' measurements in one run, on a GPU node without Go. It takes
# the figures that docs/benchmarks.md's status tables hold, with every rank a virtual rank on
# one GPU, and writes their raw output to $OUT (default ./out); scripts/bench/goals renders
# them as the tables, here or on any machine with Go:
#
#   CGO_ENABLED=0 go build -buildvcs=true -o bundle/arsmoke ./cmd/arsmoke
#   CGO_ENABLED=0 go test -c -o bundle/collective.test ./collective
#   cp scripts/bench/goals.sh bundle/
#   (on the GPU node)  cd bundle && OUT=/tmp/goals ./goals.sh [part ...]
#   (then, anywhere)   go run ./scripts/bench/goals /tmp/goals [more folders]
#
# On an H100 the fused part took 80 s and the tune part 150 s. Where a call to the node is
# limited in time, run the parts in calls of their own, each into a folder of its own, and
# give the renderer every folder.
#
# Parts (all of them without an argument), each written as it finishes:
#   fused   the fused all-reduce + residual + RMSNorm beside the unfused pair, hidden 8192
#           bf16, rows 1, 8, 32, 128 and 512, at 2, 4 and 8 ranks: one CUDA graph per rank
#           (arsmoke --fused -g --json, PASSES passes, 3 by default) and the fork/join harness
#           (BenchmarkAllReduceResidualRMSNorm, with the pair's all-reduce alone)
#   points  the twelve target points (2, 4 and 8 ranks; 16 KiB, 256 KiB, 1 MiB, 8 MiB) of every
#           kernel at GPU and system scope, with the harness floor of the same run
#           (BenchmarkAllReduceGrid, BenchmarkGraphForkJoinFloor)
#   tune    arsmoke --tune for 2, 4 and 8 ranks into $OUT/tune.json, then arsmoke's default
#           run (8 ranks, eager and -g) with that table and with GOCCL_TUNE=off, alternating,
#           PASSES times each
#
# (-buildvcs=true: arsmoke's JSON then names the commit, which the tables' header gives.) Every
# step runs under `timeout`, so a hung kernel costs one step, not the node; its standard output
# goes to its file in $OUT, its standard error beside it (.err). A step that fails leaves its
# output and the run goes on; the exit status is that of the last failure. When the tuning
# step fails there is no table to run with: the runs with it are left out (the renderer then
# has no "with the table" column), the runs without it still made.
set -u
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(fused points tune)
for part in "${parts[@]}"; do # every name checked before anything runs
  case $part in
  fused | points | tune) ;;
  *) echo "goals: unknown part $part (want fused, points or tune)" >&2; exit 2 ;;
  esac
done
passes=${PASSES:-3}
[[ $passes =~ ^[1-9][0-9]*$ ]] || { echo "goals: PASSES=$passes: want a number of passes, 1 or more" >&2; exit 2; }
out=${OUT:-./out}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
cd "$(dirname "$0")" || exit 2
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
status=0

step() { # limit-seconds log command...
  local limit=$1 log=$2; shift 2
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>"$log.err" || { status=$?; echo "goals: $* exited $status (see $log and $log.err)" >&2; }
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/gpu.txt" 2>&1
date -u +%Y-%m-%d >"$out/date.txt"
# which goccl: arsmoke's JSON names the commit it was built from
step 60 "$out/build.json" ./arsmoke --json -n 1 -w 0 -b 1K -e 1K --ranks 2 --device 0

for part in "${parts[@]}"; do
  case $part in
  fused)
    for p in $(seq 1 "$passes"); do
      for ws in 2 4 8; do
        step 120 "$out/fused_ws${ws}_p$p.json" ./arsmoke --fused --hidden 8192 --rows 1,8,32,128,512 -g --json --ranks "$ws" --device 0
      done
    done
    step 400 "$out/forkjoin_fused.txt" ./collective.test -test.run '^$' -test.benchtime 10x \
      -test.bench 'AllReduceResidualRMSNorm/ws(2|4|8)/rows(1|8|32|128|512)$/(fused|unfused|allreduce)$'
    ;;
  points)
    step 400 "$out/points.txt" ./collective.test -test.run '^$' -test.benchtime 10x \
      -test.bench 'GraphForkJoinFloor/fork-rank0-pdl-early|AllReduceGrid/ws(2|4|8)/(16K|256K|1M|8M)/(oneshot|twoshot-direct|push|twoshot-inplace)/(gpu|sys)/blocks0$'
    ;;
  tune)
    tables=(on off)
    step 400 "$out/tune.log" ./arsmoke --tune --worlds 2,4,8 --device 0 -o "$out/tune.json"
    if [ ! -s "$out/tune.json" ] || [ "$out/tune.json" -ot "$out/date.txt" ]; then
      # goccl would ignore a table that is not there, with a note, and the runs "with the
      # table" would be the built-in selection's under another name.
      echo "goals: no tuning table from this run: the default runs go without one only" >&2
      rm -f "$out"/default_*_on_p*.log "$out"/default_*_on_p*.log.err
      tables=(off)
    fi
    for p in $(seq 1 "$passes"); do
      for table in "${tables[@]}"; do
        if [ $table = on ]; then env=(GOCCL_TUNE_FILE="$out/tune.json"); else env=(GOCCL_TUNE=off); fi
        step 120 "$out/default_eager_${table}_p$p.log" env "${env[@]}" ./arsmoke --ranks 8 --device 0
        step 120 "$out/default_graph_${table}_p$p.log" env "${env[@]}" ./arsmoke --ranks 8 --device 0 -g
      done
    done
    ;;
  esac
done
exit $status
