#!/usr/bin/env bash
# Runs the libFuzzer harnesses of a TROUPE_FUZZ build (fuzz/README.md) for SECONDS each.
# Usage: tools/fuzz.sh BUILD_DIR SECONDS [HARNESS...] (default: every harness).
# Each harness starts from its regressions, its committed seeds, freshly written seeds and what
# earlier runs in BUILD_DIR found. Exits 1 when any harness finds a crash, a leak, undefined
# behaviour, a timeout or an out-of-memory; the input is kept in BUILD_DIR/fuzz/artifacts/<harness>/.
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

failed=()
for h in "${harnesses[@]}"; do
  bin=$build/fuzz/troupe_fuzz_$h
  work=$build/fuzz/work/$h
  artifacts=$build/fuzz/artifacts/$h
  log=$build/fuzz/$h.log
  mkdir -p "$work" "$artifacts"
  dirs=("$work")
  for d in "$root/fuzz/regressions/$h" "$root/fuzz/corpus/$h" "$seeds/$h"; do
    [ -d "$d" ] && dirs+=("$d")
  done
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$artifacts/" "${dirs[@]}" > "$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    echo "fuzz: $h: no finding in ${seconds} s (${runs:-?} runs)"
  else
    failed+=("$h")
    echo "fuzz: $h: FINDING (the end of $log follows; the input is in $artifacts/)"
    tail -n 80 "$log"
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#harnesses[@]} harnesses, no finding"
