#!/usr/bin/env bash
# The GPU checks CI cannot run (it has no GPU): every [cuda] and [nccl] test, the tensor bench's
# CUDA section, gpu_bench (bf16 GEMM vs cuBLAS, NCCL allreduce on one GPU, DDP step over NCCL)
# and, where PyTorch is installed, the same figures through PyTorch (tools/gpu_torch_bench.py).
#
# Usage:
#   tools/gpu_check.sh [build-dir]          build with TROUPE_CUDA=ON (default build-gpu), then run
#   tools/gpu_check.sh pack [build-dir] [dest]
#                                           copy the binaries and the shared libraries they link
#                                           (not glibc, the driver or the CUDA toolkit's, which
#                                           are too large to carry) into dest (default
#                                           gpu-carry), for a GPU machine with no package registry
#                                           and dest.tar.gz (stripped binaries, gzip)
#   tools/gpu_check.sh run [dir]            run from prebuilt binaries: a packed dir or its
#                                           .tar.gz, or a build dir; nothing is built or installed
# Results go to $OUT (default ./gpu-check-out): device.txt, one log per check, bench.jsonl (the
# JSON lines of every benchmark) and summary.txt. CHECK_TIMEOUT bounds each check (default 900 s). Exits 2 without a visible device, 1 when a
# check failed, 0 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."

tests=(troupe_tensors_tests troupe_autograd_tests troupe_ddp_tests troupe_actors_tests)
benches=(tensor_bench gpu_bench)

# Prints the directory holding `name` under a build dir (tests/, bench/) or a packed dir (bin/).
locate() {
  local dir=$1 name=$2
  for sub in bin tests bench; do
    if [ -x "$dir/$sub/$name" ]; then echo "$dir/$sub/$name"; return 0; fi
  done
  return 1
}

pack() {
  local build=${1:-build-gpu} dest=${2:-gpu-carry}
  mkdir -p "$dest/bin" "$dest/lib"
  local bins=()
  for b in "${tests[@]}" "${benches[@]}"; do
    if p=$(locate "$build" "$b"); then cp "$p" "$dest/bin/"; bins+=("$p"); else echo "pack: $b not built in $build" >&2; fi
  done
  cp tools/gpu_torch_bench.py "$dest/bin/" 2>/dev/null || true
  # Shared libraries other than glibc, the loader, the driver and the CUDA toolkit's.
  ldd "${bins[@]}" 2>/dev/null | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libcuda.so*|libnvidia*) continue ;;
      libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*) continue ;;
    esac
    cp -L "$lib" "$dest/lib/"
  done
  strip --strip-unneeded "$dest"/bin/troupe_*_tests "$dest"/bin/*_bench 2>/dev/null || true
  # One archive keeps the carried files small (the libraries compress well).
  tar -C "$(dirname "$dest")" -czf "$dest.tar.gz" "$(basename "$dest")"
  du -sh "$dest" "$dest.tar.gz"
}

# Adds the directories that hold the CUDA runtime, cuBLAS and NCCL on this machine (a toolkit,
# the system, or the wheels PyTorch brings) to LD_LIBRARY_PATH.
find_cuda_libs() {
  local dirs=() d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda-*/lib64 /usr/local/cuda-*/lib /usr/lib/x86_64-linux-gnu; do
    [ -d "$d" ] && dirs+=("$d")
  done
  if command -v python3 >/dev/null; then
    while read -r d; do [ -n "$d" ] && dirs+=("$d"); done < <(python3 - <<'PY' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for d in glob.glob(os.path.join(r, "nvidia", "*", "lib")):
        print(d)
PY
)
  fi
  local joined
  joined=$(IFS=:; echo "${dirs[*]}")
  export LD_LIBRARY_PATH="${joined}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

run_checks() {
  local dir=${1:-build-gpu}
  local out=${OUT:-gpu-check-out}
  mkdir -p "$out"
  if [ -f "$dir" ] && [[ "$dir" == *.tar.gz ]]; then  # a packed archive: unpack beside the results
    tar -C "$out" -xzf "$dir" || return 1
    dir="$out/$(basename "$dir" .tar.gz)"
  fi
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >"$out/device.txt" 2>&1; then
    echo "gpu-check: no NVIDIA device visible (nvidia-smi -L failed); nothing was run" | tee "$out/summary.txt" >&2
    return 2
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >>"$out/device.txt" 2>&1
  cat "$out/device.txt"
  [ -d "$dir/lib" ] && export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  find_cuda_libs
  local failed=0
  : >"$out/summary.txt"
  : >"$out/bench.jsonl"
  check() {  # check <name> <log> <command...>
    local name=$1 log=$2; shift 2
    local t0=$SECONDS
    if timeout "${CHECK_TIMEOUT:-900}" "$@" >"$out/$log" 2>&1; then
      echo "gpu-check: PASS ${name} ($((SECONDS - t0)) s)" | tee -a "$out/summary.txt"
    else
      echo "gpu-check: FAIL ${name} (exit $?, see $log)" | tee -a "$out/summary.txt"
      tail -30 "$out/$log"
      failed=1
    fi
  }
  local p
  # Catch2 v2: a tag filter; --warn NoAssertions makes a test that skipped for lack of a device fail.
  for t in troupe_tensors_tests troupe_autograd_tests; do
    if p=$(locate "$dir" "$t"); then check "$t [cuda]" "$t.log" "$p" "[cuda]" --warn NoAssertions -d yes; fi
  done
  if p=$(locate "$dir" troupe_ddp_tests); then
    check "troupe_ddp_tests [nccl]" troupe_ddp_tests.log "$p" "[nccl]~[gpu_fork]" --warn NoAssertions -d yes
    # Tests that fork ranks using the device run in a process that never initialised CUDA.
    # The world-size-2 NCCL ones among them skip (and so fail here) with fewer than 2 devices.
    check "troupe_ddp_tests [cuda][gpu_fork]" troupe_ddp_tests_fork.log "$p" "[cuda][gpu_fork]" --warn NoAssertions -d yes
    if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
      check "troupe_ddp_tests [nccl][gpu_fork]" troupe_ddp_tests_nccl2.log "$p" "[nccl][gpu_fork]" --warn NoAssertions -d yes
    else
      echo "gpu-check: SKIP troupe_ddp_tests [nccl][gpu_fork] (needs 2 devices)" | tee -a "$out/summary.txt"
    fi
  fi
  if p=$(locate "$dir" troupe_actors_tests); then
    check "troupe_actors_tests [cuda]" troupe_actors_tests.log "$p" "[cuda]" --warn NoAssertions -d yes
  fi
  for b in "${benches[@]}"; do
    if p=$(locate "$dir" "$b"); then
      check "$b" "$b.log" "$p"
      grep '^{' "$out/$b.log" >>"$out/bench.jsonl"
    else
      echo "gpu-check: MISSING $b" | tee -a "$out/summary.txt"
      failed=1
    fi
  done
  local torch_bench=tools/gpu_torch_bench.py
  [ -f "$dir/bin/gpu_torch_bench.py" ] && torch_bench="$dir/bin/gpu_torch_bench.py"
  if command -v python3 >/dev/null && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    check "pytorch figures" torch_bench.log python3 "$torch_bench"
    grep '^{' "$out/torch_bench.log" >>"$out/bench.jsonl"
  else
    echo "gpu-check: SKIP pytorch figures (no python3 with CUDA-enabled torch)" | tee -a "$out/summary.txt"
  fi
  return $failed
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) shift; run_checks "$@" ;;
  *)
    build=${1:-build-gpu}
    if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
      echo "gpu-check: no NVIDIA device visible (nvidia-smi -L failed); nothing was built or run" >&2
      exit 2
    fi
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_CUDA=ON >/dev/null || exit 1
    cmake --build "$build" -j "$(nproc)" --target "${tests[@]}" "${benches[@]}" || exit 1
    run_checks "$build"
    ;;
esac
