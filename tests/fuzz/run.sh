#!/usr/bin/env bash
# The long fuzz run: every harness to RUNS executions (default 10^7) from the seed corpus and
# the regressions, with ASan and UBSan, two at a time. Prints each harness's executions,
# time and any failing input. Usage: tests/fuzz/run.sh [RUNS] (from the repository root).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-10000000}
BUILD=build/fuzz
CXX=${CXX:-clang++} cmake -S . -B "$BUILD" -G Ninja -DR2CCL_FUZZ=ON -DR2CCL_PYTHON_MODULE=OFF -DR2CCL_CUDA=off \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
harnesses="wire handshake channel rail_state signature verbs_boot"
ninja -C "$BUILD" $(for h in $harnesses; do echo "fuzz_$h"; done) >/dev/null
out=$(mktemp -d)
echo "fuzz run: $RUNS executions per harness, $(clang++ --version | head -1), $(date -u +%FT%TZ)"
run() {
  local h=$1 seeds=()
  for d in tests/fuzz/corpus/$h tests/fuzz/regressions/$h; do [ -d "$d" ] && seeds+=("$d"); done
  mkdir -p "$out/$h"
  local t0=$SECONDS
  if "$BUILD/fuzz_$h" -runs="$RUNS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$out/$h/" "$out/$h" "${seeds[@]}" >"$out/$h.log" 2>&1; then
    echo "fuzz_$h: $(grep -o 'number_of_executed_units: [0-9]*' "$out/$h.log" | awk '{print $2}') executions," \
         "$((SECONDS - t0)) s, no failure"
  else
    echo "fuzz_$h: FAILED after $((SECONDS - t0)) s: $(ls "$out/$h"/crash-* "$out/$h"/leak-* "$out/$h"/timeout-* 2>/dev/null)"
    tail -30 "$out/$h.log"
    return 1
  fi
}
status=0
set -- $harnesses
while [ $# -gt 0 ]; do
  run "$1" & p1=$!
  if [ $# -gt 1 ]; then run "$2" & p2=$!; else p2=; fi
  wait $p1 || status=1
  [ -n "$p2" ] && { wait $p2 || status=1; }
  shift; [ $# -gt 0 ] && shift
done
exit $status
