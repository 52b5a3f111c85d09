#!/usr/bin/env bash
# Runs the GPU test bundle that `make gpu-bundle` builds, on a GPU machine without Go.
#
#   ./run.sh                      every test binary, all tests
#   ./run.sh collective -test.run 'TestWatchdog'   one binary, extra go test flags
#
# Logs go to $OUT (or ./out). GOCCL_REQUIRE_GPU=1 makes a GPU test that would skip fail.
# Multi-process tests run with the MPS daemon when nvidia-cuda-mps-control exists (so that
# the ranks' kernels run concurrently); it is started with private pipe and log folders and
# stopped afterwards. Every binary runs under `timeout` (GOCCL_BUNDLE_TIMEOUT seconds, 900 by
# default: collective's GPU tests but the multi-process one ran past 370 s on one H100), so a
# hung kernel cannot eat the machine. If run.sh itself is stopped (a signal, an outer timeout),
# it stops the test binary running and the MPS daemon it started.
set -u
out=${OUT:-./out}
mkdir -p "$out"
out=$(cd "$out" && pwd) # a relative OUT is the caller's, not the bundle's
cd "$(dirname "$0")"
export GOCCL_REQUIRE_GPU=1
limit=${GOCCL_BUNDLE_TIMEOUT:-900}

child= # the timeout running a test binary, in a process group of its own
mps=   # set while the MPS daemon this script started runs
cleanup() {
  [ -n "$child" ] && { kill -TERM -- "-$child" 2>/dev/null || kill -TERM "$child" 2>/dev/null; }
  [ -n "$mps" ] && echo quit | nvidia-cuda-mps-control
  child= mps=
}
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM
trap cleanup EXIT

run() { # name binary args...
  local name=$1; shift
  echo "=== $name: $*"
  # A package's tests read testdata/ from the working folder: make copied it to NAME.d.
  local dir=. bin=${1#./}; shift
  [ -d "${bin%.test}.d" ] && dir=${bin%.test}.d
  # timeout runs the binary in a process group of its own, which a signal to this script
  # does not reach: it runs in the background, and cleanup stops that group.
  (cd "$dir" && exec timeout --kill-after=10 "$limit" "$OLDPWD/$bin" "$@") >"$out/$name.log" 2>&1 &
  child=$!
  wait "$child"
  local rc=$?
  child=
  grep -E '^(--- FAIL|--- SKIP|FAIL|ok|PASS|panic)|^\s+[a-z_]+\.go:[0-9]+:|Benchmark' "$out/$name.log" | tail -n 40
  echo "=== $name: exit $rc"
  return $rc
}

with_mps() { # run "$@" with an MPS daemon if one can be started
  if command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/goccl-mps/pipe CUDA_MPS_LOG_DIRECTORY=/tmp/goccl-mps/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
      mps=1
      echo "MPS daemon started"
      # One rank a process: more hardware queues than CUDA's default would only use up the
      # MPS server's (a caller's CUDA_DEVICE_MAX_CONNECTIONS=32 got four processes refused)
      local saved=${CUDA_DEVICE_MAX_CONNECTIONS-unset}
      unset CUDA_DEVICE_MAX_CONNECTIONS
      "$@"; local rc=$?
      [ "$saved" = unset ] || export CUDA_DEVICE_MAX_CONNECTIONS=$saved
      echo quit | nvidia-cuda-mps-control
      mps=
      unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
      return $rc
    fi
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    echo "MPS daemon did not start: multi-process tests time-slice"
  fi
  "$@"
}

status=0
if [ $# -gt 0 ]; then
  name=$1; shift
  run "$name" "./$name.test" -test.v "$@" || status=1
  exit $status
fi
for bin in *.test; do
  name=${bin%.test}
  # Only the multi-process tests run under MPS: virtual ranks in one process hang under it on
  # an H200, and need no MPS anyway.
  if [ "$name" = collective ]; then
    run collective "./$bin" -test.v -test.skip '^TestMultiProcess' || status=1
    with_mps run collective-multiprocess "./$bin" -test.v -test.run '^TestMultiProcess(Fused)?$' || status=1
  elif [ "$name" = nccl ]; then
    # Several NCCL ranks share the one GPU as separate hosts (NCCL_HOSTID per process).
    run nccl "./$bin" -test.v -test.skip '^TestGPUMultiProcess$' || status=1
    GOCCL_NCCL_TEST_RANKS=4 run nccl-multiprocess "./$bin" -test.v -test.run '^TestGPUMultiProcess$' || status=1
  elif [ "$name" = cmd_arsmoke ]; then
    run cmd_arsmoke "./$bin" -test.v -test.skip '^TestGPUProcs' || status=1
    with_mps run cmd_arsmoke-procs "./$bin" -test.v -test.run '^TestGPUProcs' || status=1
  else
    run "$name" "./$bin" -test.v || status=1
  fi
done
exit $status
