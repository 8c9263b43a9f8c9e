#!/usr/bin/env bash
# The GPU checks CI cannot run (it has no GPU): builds with the CUDA backend required, then runs
# every [cuda] and [nccl] test and the tensor benchmark's CUDA section on the local device.
# Usage: tools/gpu_check.sh [build-dir]   (make gpu-check). Exits non-zero when there is no
# device, when the toolkit is missing, or when any check fails; prints a summary line per check.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
jobs=$(nproc)

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA device visible (nvidia-smi -L failed); nothing was run" >&2
  exit 2
fi
nvidia-smi -L

set -e
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_CUDA=ON >/dev/null
cmake --build "$build" -j "$jobs" --target troupe_tensors_tests troupe_autograd_tests troupe_ddp_tests tensor_bench
set +e

failed=0
check() {
  local name=$1; shift
  local t0=$SECONDS
  if "$@"; then echo "gpu-check: PASS ${name} ($((SECONDS - t0)) s)"
  else echo "gpu-check: FAIL ${name} (exit $?)"; failed=1; fi
}
# Catch2 v2: a tag filter; --warn NoAssertions makes a test that skipped for lack of a device fail.
check "tensors [cuda]" "$build/tests/troupe_tensors_tests" "[cuda]" --warn NoAssertions
check "autograd [cuda]" "$build/tests/troupe_autograd_tests" "[cuda]" --warn NoAssertions
check "ddp [nccl]" "$build/tests/troupe_ddp_tests" "[nccl]" --warn NoAssertions
check "tensor_bench" "$build/bench/tensor_bench"
exit $failed
