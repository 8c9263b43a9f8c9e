#!/usr/bin/env bash
# The GPU checks CI cannot run, since it has no GPU:
#   - every [cuda] and [nccl] test;
#   - the tensor bench's CUDA section;
#   - gpu_bench: bf16 GEMM vs cuBLAS, NCCL allreduce on one GPU, DDP step over NCCL;
#   - where PyTorch is installed, the same figures through PyTorch (tools/gpu_torch_bench.py).
#
# Usage:
#   tools/gpu_check.sh [build-dir]          build with TROUPE_CUDA=ON (default build-gpu), then run
#   tools/gpu_check.sh pack [build-dir] [dest]
#                                           copy the binaries and the shared libraries they link
#                                           (not glibc, the driver or the CUDA toolkit's, which
#                                           are too large to carry) into dest (default
#                                           gpu-carry), for a GPU machine with no package registry
#                                           and dest.tar.xz (stripped binaries, xz)
#   tools/gpu_check.sh run [dir]            run from prebuilt binaries: a packed dir or its
#                                           .tar.xz (or .tar.gz), or a build dir; nothing is built or installed
# Results go to $OUT (default ./gpu-check-out): device.txt, one log per check, bench.jsonl (the
# JSON lines of every benchmark), summary.txt and cases/ (one log per test case).
#   CHECK_TIMEOUT   bounds each bench (default 900 s)
#   CASE_TIMEOUT    bounds each test case (default 300 s)
#   CASE_JOBS       test cases run at once (default 1)
#   GPU_BENCHES     the GPU benches (default "tensor_bench gpu_bench")
#   TORCH_FIGURES=0 skips PyTorch's GPU figures
#   CPU_BENCHES=1   adds rpc_bench, allreduce_bench, ddp_bench, actor_bench, PyTorch's CPU
#                   figures, and the demo (ddp_train) with PyTorch loading its model.safetensors
# Exits 2 without a visible device, 1 when a check failed, 0 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."

tests=(troupe_tensors_tests troupe_autograd_tests troupe_ddp_tests troupe_actors_tests troupe_dist_autograd_tests
       troupe_integration_tests)
read -r -a benches <<<"${GPU_BENCHES-tensor_bench gpu_bench}"  # GPU_BENCHES="" runs none
# With CPU_BENCHES=1, run too: the CPU benches PyTorch's CPU figures compare with
# (tools/torch_cpu_bench.py), on the GPU machine's otherwise idle cores.
cpu_benches=(rpc_bench allreduce_bench ddp_bench actor_bench)

# Prints the directory holding `name` under a build dir (tests/, bench/) or a packed dir (bin/).
locate() {
  local dir=$1 name=$2
  for sub in bin tests bench examples; do
    if [ -x "$dir/$sub/$name" ]; then echo "$dir/$sub/$name"; return 0; fi
  done
  return 1
}

pack() {
  local build=${1:-build-gpu} dest=${2:-gpu-carry}
  mkdir -p "$dest/bin" "$dest/lib"
  local bins=()
  for b in "${tests[@]}" "${benches[@]}" "${cpu_benches[@]}" ddp_train; do
    if p=$(locate "$build" "$b"); then cp "$p" "$dest/bin/"; bins+=("$p"); else echo "pack: $b not built in $build" >&2; fi
  done
  cp tools/gpu_torch_bench.py tools/torch_cpu_bench.py tools/torch_load_check.py "$dest/bin/" 2>/dev/null || true
  # Shared libraries other than glibc, the loader, the driver and the CUDA toolkit's.
  ldd "${bins[@]}" 2>/dev/null | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libcuda.so*|libnvidia*) continue ;;
      libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*) continue ;;
    esac
    cp -L "$lib" "$dest/lib/"
  done
  strip --strip-unneeded "$dest"/bin/troupe_*_tests "$dest"/bin/*_bench 2>/dev/null || true
  # One xz archive keeps the carried files small: every binary holds the same CUDA kernels, which
  # xz's window finds again (about 0.6 of gzip's size).
  tar -C "$(dirname "$dest")" -cf - "$(basename "$dest")" | xz -T0 -6 >"$dest.tar.xz"
  du -sh "$dest" "$dest.tar.xz"
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

# Runs every case of test binary $1 that matches filter $2, each in its own process; appends one
# PASS or FAIL line per case to $4/summary.txt and keeps each case's output in $4/cases/.
run_cases() {
  local p=$1 filter=$2 label=$3 out=$4 name spec i=0 running=0
  while IFS= read -r name; do
    [ -n "$name" ] || continue
    i=$((i + 1))
    spec=$(printf '%s' "$name" | sed 's/[][,\\*]/\\&/g')  # Catch2 v2 escapes with a backslash
    (
      t0=$SECONDS
      if timeout "${CASE_TIMEOUT:-300}" "$p" "$spec" --warn NoAssertions -d yes >"$out/cases/$label.$i.log" 2>&1; then
        echo "gpu-check: PASS $label: $name ($((SECONDS - t0)) s)"
      else
        echo "gpu-check: FAIL $label: $name (exit $?, $((SECONDS - t0)) s, see cases/$label.$i.log)"
      fi
    ) | tee -a "$out/summary.txt" &
    running=$((running + 1))
    if [ "$running" -ge "${CASE_JOBS:-1}" ]; then wait -n; running=$((running - 1)); fi
  done < <("$p" "$filter" --list-test-names-only 2>/dev/null)
  wait
}

run_checks() {
  local dir=${1:-build-gpu}
  local out=${OUT:-gpu-check-out}
  mkdir -p "$out"
  if [ -f "$dir" ] && [[ "$dir" == *.tar.* ]]; then  # a packed archive: unpack beside the results
    # Python's tarfile where tar finds no xz.
    tar -C "$out" -xf "$dir" 2>/dev/null ||
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$dir" "$out" || return 1
    dir="$out/$(basename "${dir%.tar.*}")"
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
  # Each test case runs as its own process under CASE_TIMEOUT (default 300 s), CASE_JOBS at a time
  # (default 1): a case that hangs or crashes costs only itself, and a [gpu_fork] case always
  # starts in a process that never initialised CUDA. --warn NoAssertions makes a case that skipped
  # for lack of a device fail. [multigpu] cases need two devices: with one they are left out and
  # named as not run.
  local gpus no_multi=""
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  if [ "$gpus" -lt 2 ]; then
    no_multi="~[multigpu]"
    echo "gpu-check: NOT RUN [multigpu] tests ($gpus device)" | tee -a "$out/summary.txt"
  fi
  local filter="[cuda]$no_multi,[nccl]$no_multi"
  mkdir -p "$out/cases"
  for t in "${tests[@]}"; do
    p=$(locate "$dir" "$t") || continue
    run_cases "$p" "$filter" "$t" "$out"
  done
  grep -q '^gpu-check: FAIL' "$out/summary.txt" && failed=1
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
  if [ "${TORCH_FIGURES:-1}" != 1 ]; then
    echo "gpu-check: SKIP pytorch figures (TORCH_FIGURES=0)" | tee -a "$out/summary.txt"
  elif command -v python3 >/dev/null && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    check "pytorch figures" torch_bench.log python3 "$torch_bench"
    grep '^{' "$out/torch_bench.log" >>"$out/bench.jsonl"
  else
    echo "gpu-check: SKIP pytorch figures (no python3 with CUDA-enabled torch)" | tee -a "$out/summary.txt"
  fi
  if [ "${CPU_BENCHES:-0}" = 1 ]; then
    for b in "${cpu_benches[@]}"; do
      if p=$(locate "$dir" "$b"); then
        check "$b" "$b.log" "$p"
        grep '^{' "$out/$b.log" >>"$out/bench.jsonl"
      fi
    done
    local cpu_bench=tools/torch_cpu_bench.py
    [ -f "$dir/bin/torch_cpu_bench.py" ] && cpu_bench="$dir/bin/torch_cpu_bench.py"
    if command -v python3 >/dev/null && python3 -c "import torch" 2>/dev/null; then
      check "pytorch cpu figures" torch_cpu_bench.log python3 "$cpu_bench"
      grep '^{' "$out/torch_cpu_bench.log" >>"$out/bench.jsonl"
      # The demo's model, loaded by PyTorch as README.md says.
      if p=$(locate "$dir" ddp_train); then
        check "the demo trains" ddp_train.log "$p" --world-size 2 --out "$out/demo"
        local load_check=tools/torch_load_check.py
        [ -f "$dir/bin/torch_load_check.py" ] && load_check="$dir/bin/torch_load_check.py"
        check "pytorch loads the demo model" torch_load_check.log python3 "$load_check" "$out/demo/model.safetensors"
      fi
    fi
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
    cmake --build "$build" -j "$(nproc)" --target "${tests[@]}" "${benches[@]}" "${cpu_benches[@]}" ddp_train || exit 1
    run_checks "$build"
    ;;
esac
