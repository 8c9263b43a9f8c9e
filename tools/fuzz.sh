#!/usr/bin/env bash
# Runs the libFuzzer harnesses of a TROUPE_FUZZ build (fuzz/README.md) for SECONDS each.
# Usage: [FUZZ_JOBS=N] [FUZZ_RUNS=FILE] tools/fuzz.sh BUILD_DIR SECONDS [HARNESS...] (default:
# every harness); FUZZ_JOBS harnesses run at the same time (default 1), each on one core.
# FUZZ_RUNS names a file of "harness runs" lines: a harness listed there stops after that many
# runs, or after 3 x SECONDS. FUZZ_ON_FINDING=report prints findings but exits 0 (the replay of
# regressions and seeds still fails the build that runs it); by hand only, for a round whose
# findings are to be looked at later. FUZZ_REPORT_ONLY="h1 h2": the same for those harnesses
# alone (for a harness whose round is not deterministic, see the note).
# Each harness starts from its regressions, its committed seeds, freshly written seeds and what
# earlier runs in BUILD_DIR found. Exits 1 when any harness finds a crash, a leak, undefined
# behaviour, a timeout or an out-of-memory; the input is kept in BUILD_DIR/fuzz/artifacts/<harness>/.
#
# Note [deterministic fuzz round]
# From -seed=1, a run count and the same starting inputs, a harness explores the same inputs on
# every machine: libFuzzer's choices depend only on its seed and on the coverage each input
# gives, and no harness's coverage depends on threads, time or addresses (fuzz/README.md). Two
# of libFuzzer's own habits are turned off for it: mutations that insert values the code
# compared (-use_cmp=0: compared values include addresses, e.g. std::less on pointers, which
# differ from run to run) and rereading its corpus folder every second (-reload=0: a reread
# runs an input again, at a time that depends on the machine's speed). Its
# starting inputs are read in one fixed order (the folders in the order above, each by name):
# libFuzzer shuffles them with its seed and sorts them by size, so files of equal size read in
# directory order (which differs between file systems) would steer it differently. So every
# starting input goes in -seed_inputs, and the corpus folder libFuzzer reads and writes is a new
# empty one, whose inputs join BUILD_DIR/fuzz/work/<harness>/ after the run. A round of a
# fresh BUILD_DIR (CI's) therefore finds here what it finds there.
# Shown for every harness: three rounds from an empty work folder, ASLR on, end with the same
# cov/ft/corpus. What made rounds differ is kept out of the fuzz build: UBSan's vptr check (a
# cache of vtable addresses, whose misses depend on the load address), the stack depth coverage
# (the deepest stack offset moves with the stack's random start), both in the top-level
# CMakeLists.txt, and the coverage of the tensor allocator, whose table is keyed by address
# (tensors/CMakeLists.txt). The codec's test of a payload's alignment (Note [adopted payload])
# depends on the input alone: ASan's heap blocks are 16-byte aligned. FUZZ_REPORT_ONLY is for
# a harness whose round is found to differ again, until the cause is kept out.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BUILD_DIR SECONDS [HARNESS...]" >&2; exit 2; }
build=$(cd "$1" && pwd)
seconds=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -gt 0 ]; then
  harnesses=("$@")
else
  IFS=';' read -r -a harnesses < "$build/fuzz/harnesses.txt"
fi
symbolizer=$(command -v llvm-symbolizer || command -v llvm-symbolizer-14 || true)
[ -n "$symbolizer" ] && export ASAN_SYMBOLIZER_PATH=$symbolizer
export UBSAN_OPTIONS=print_stacktrace=1

seeds=$build/fuzz/seeds
rm -rf "$seeds"
"$build/fuzz/troupe_fuzz_seeds" "$seeds"

[ -z "${FUZZ_RUNS:-}" ] || [ -r "$FUZZ_RUNS" ] || { echo "fuzz: FUZZ_RUNS names no readable file: '$FUZZ_RUNS'" >&2; exit 2; }
jobs=${FUZZ_JOBS:-1}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: FUZZ_JOBS must be a positive number, not '$jobs'" >&2; exit 2; }

# The run count FUZZ_RUNS gives harness $1, or nothing.
runs_of() {
  [ -n "${FUZZ_RUNS:-}" ] || return 0
  awk -v h="$1" '$1 == h { print $2 }' "$FUZZ_RUNS"
}

# Fuzzes harness $1 for $seconds (or its run count); its log is $build/fuzz/$1.log; fails on a finding.
fuzz_one() {
  local h=$1
  local bin=$build/fuzz/troupe_fuzz_$h
  local work=$build/fuzz/work/$h
  local artifacts=$build/fuzz/artifacts/$h
  mkdir -p "$work" "$artifacts"
  # Note [deterministic fuzz round]: the starting inputs in a fixed order, a new corpus folder.
  local list=$build/fuzz/$h.inputs found=$build/fuzz/found/$h d
  rm -rf "$found"
  mkdir -p "$found"
  for d in "$root/fuzz/regressions/$h" "$root/fuzz/corpus/$h" "$seeds/$h" "$work"; do
    [ -d "$d" ] && find "$d" -maxdepth 1 -type f -size +0 | LC_ALL=C sort
  done | paste -sd, - | tr -d '\n' > "$list"
  if grep -q , <(find "$work" "$root/fuzz/regressions/$h" "$root/fuzz/corpus/$h" -maxdepth 1 -type f 2>/dev/null); then
    echo "fuzz: $h: an input's path holds a comma (-seed_inputs cannot list it)" > "$build/fuzz/$h.log"
    return 2
  fi
  local inputs=()
  [ -s "$list" ] && inputs=(-seed_inputs=@"$list")
  local bound=(-max_total_time="$seconds") runs status=0
  runs=$(runs_of "$h")
  # A counted round is deterministic (the note): no guidance from compared values, which hold
  # addresses too; no rereading of the corpus folder each second.
  [ -n "$runs" ] && bound=(-runs="$runs" -max_total_time=$((3 * seconds)) -use_cmp=0)
  "$bin" -seed=1 "${bound[@]}" -reload=0 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "${inputs[@]}" "$found" > "$build/fuzz/$h.log" 2>&1 || status=$?
  find "$found" -maxdepth 1 -type f -exec mv -n -t "$work" {} +
  return "$status"
}

# Reports harness $1, whose fuzz_one exited with status $2; adds it to `failed` on a finding.
report() {
  local h=$1 log=$build/fuzz/$1.log
  if [ "$2" = 0 ]; then
    local runs
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    local took
    took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log")
    echo "fuzz: $h: no finding in ${took:-$seconds} s (${runs:-?} runs)"
  else
    failed+=("$h")
    echo "fuzz: $h: FINDING (the end of $log follows; the input is in $build/fuzz/artifacts/$h/)"
    tail -n 80 "$log"
  fi
}

failed=()
declare -A running=()  # pid -> harness
for h in "${harnesses[@]}"; do
  [ -x "$build/fuzz/troupe_fuzz_$h" ] || { echo "fuzz: no harness '$h' in $build/fuzz" >&2; exit 2; }
done
for h in "${harnesses[@]}"; do
  while [ ${#running[@]} -ge "$jobs" ]; do
    status=0
    wait -n -p done_pid "${!running[@]}" || status=$?
    report "${running[$done_pid]}" "$status"
    unset "running[$done_pid]"
  done
  fuzz_one "$h" &
  running[$!]=$h
done
while [ ${#running[@]} -gt 0 ]; do
  status=0
  wait -n -p done_pid "${!running[@]}" || status=$?
  report "${running[$done_pid]}" "$status"
  unset "running[$done_pid]"
done
if [ ${#failed[@]} -gt 0 ] && [ -n "${FUZZ_REPORT_ONLY:-}" ]; then
  kept=()
  for h in "${failed[@]}"; do
    if [[ " $FUZZ_REPORT_ONLY " == *" $h "* ]]; then
      echo "fuzz: $h: FUZZ_REPORT_ONLY: its finding is printed, not failed on; keep the input above as a regression (fuzz/README.md)" >&2
    else
      kept+=("$h")
    fi
  done
  failed=("${kept[@]}")
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in: ${failed[*]}" >&2
  if [ "${FUZZ_ON_FINDING:-fail}" = report ]; then
    echo "fuzz: FUZZ_ON_FINDING=report: not failing; keep each input above as a regression (fuzz/README.md)" >&2
    exit 0
  fi
  exit 1
fi
echo "fuzz: ${#harnesses[@]} harnesses, no finding"
