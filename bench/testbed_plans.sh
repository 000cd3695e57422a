#!/usr/bin/env bash
# bench/testbed_plans.sh - every all-reduce plan on the netns test bed with 4 hosts x 4 NICs at
# 100mbit (issue 5): healthy, host 3 without 1 of its 4 NICs (X = 0.25) and without 2 (X =
# 0.5); `python -m jax_r2ccl bench allreduce --plan P` per plan, then one table with every
# plan side by side, its time against healthy, and the cost model's prediction. Always tears
# the bed down.
#
#   sudo bench/testbed_plans.sh
# Env: RATE (100mbit), SIZE (64MiB), ITERS (3), PLANS, SCENARIOS (healthy x25 x50 replan),
#      PORT (29900), OUT, PYTHON, R2CCL_* (passed through).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RATE=${RATE:-100mbit}
SIZE=${SIZE:-64MiB}
ITERS=${ITERS:-3}
PLANS=${PLANS:-balance r2cc weighted optimal auto}
SCENARIOS=${SCENARIOS:-healthy x25 x50 replan}
PORT=${PORT:-29900}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-$ROOT/bench-results/plans-$(date +%Y%m%d-%H%M%S)}
export PYTHONSAFEPATH=1      # children import the installed jax_r2ccl, not the checkout's source tree
NETNS="$PYTHON -m jax_r2ccl testbed"   # the project's own test bed (jax-r2ccl testbed --help)
NSRUN="$NETNS run"
# One healthy NIC's payload rate for the cost model: 100 Mbit/s less ~4.3% TCP/IP headers.
LINK_RATE=${LINK_RATE:-11962500}
# Default settings: each rail's window sizes itself (R2CCL_RAIL_QUEUE_MS), so the 50 ms tbf
# queues shared by 3 peers' rails do not overflow (issue 13; before it this script had to set
# a 128 KiB window by hand).

[[ $EUID -eq 0 ]] || { echo "testbed_plans: must run as root (network namespaces)" >&2; exit 2; }
mkdir -p "$OUT"
cd "$ROOT"
cleanup() { $NETNS down >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM
$NETNS up 4 4 "$RATE"

run_no=0
status=0
# run NAME PLAN ARGS...: four processes, one per host; process 0 writes NAME.json
run() {
  local name=$1 plan=$2; shift 2
  local port=$((PORT + run_no)); run_no=$((run_no + 1))
  local common=(--coordinator "198.18.0.1:$port" --num-processes 4 --nics nic0,nic1,nic2,nic3 --sizes "$SIZE"
                --warmup 2 --timeout 180 --plan "$plan" --link-rate "$LINK_RATE")
  local pids=() rc=0 i
  for i in 1 2 3; do
    timeout -k 5 900 $NSRUN "r4h$i" -- "$PYTHON" -m jax_r2ccl bench allreduce "${common[@]}" --process-id "$i" "$@" \
      > "$OUT/$name.rank$i.log" 2>&1 &
    pids+=($!)
  done
  timeout -k 5 900 $NSRUN r4h0 -- "$PYTHON" -m jax_r2ccl bench allreduce "${common[@]}" --process-id 0 \
    --json "$OUT/$name.json" "$@" > "$OUT/$name.rank0.log" 2>&1 || rc=$?
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  echo "== $name: $(grep -E '^  r2ccl' "$OUT/$name.rank0.log" || echo 'no result') (exit $rc)"
  (( rc == 0 )) || status=1
}

for sc in $SCENARIOS; do
  case "$sc" in
    healthy) ;;
    x25) $NETNS fail 3 3 >/dev/null ;;
    x50) $NETNS fail 3 2 >/dev/null; $NETNS fail 3 3 >/dev/null ;;
    replan) ;;
    *) echo "testbed_plans: unknown scenario $sc" >&2; exit 2 ;;
  esac
  if [[ $sc == replan ]]; then
    # auto, healthy at start; host 3 loses nic3 1 s into the timed loop: the next calls re-plan
    run "replan-auto" auto --iters 8 --fault-at 1.0 --fault-cmd "$NETNS fail 3 3"
    $NETNS heal 3 3 >/dev/null
    continue
  fi
  for plan in $PLANS; do
    run "$sc-$plan" "$plan" --iters "$ITERS"
  done
  $NETNS heal 3 2 >/dev/null; $NETNS heal 3 3 >/dev/null
done

"$PYTHON" - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    name = os.path.basename(f)[:-5]
    d = json.load(open(f))
    r = [x for x in d["results"] if x["impl"] == "r2ccl"][-1]
    rows[name] = (r, d)
base = rows.get("healthy-balance", (None,))[0]
print(f"\n# all-reduce {base['size'] if base else ''} on 4 hosts x 4 NICs; time = median; vs = against healthy balance")
print(f"# {'run':20} {'plan ran':9} {'time(s)':>8} {'vs':>6} {'model(s)':>9} {'err':>6}  shares                     capacity  #wrong")
for name, (r, d) in rows.items():
    t = r["time_us_median"] / 1e6
    vs = t / (base["time_us_median"] / 1e6) if base else float("nan")
    m = r.get("predicted_us", 0) / 1e6
    err = (t - m) / m if m else float("nan")
    sh = "/".join(f"{x:.3f}" for x in r.get("shares", []))
    cap = "/".join(f"{x:.2g}" for x in r.get("capacities", []))
    plans = sorted({i.get("plan") for i in d["iterations"] if i["impl"] == "r2ccl" and "plan" in i})
    print(f"  {name:20} {r.get('plan', '-'):9} {t:8.3f} {vs:6.3f} {m:9.3f} {err:+6.1%}  {sh:26} {cap:9} {r['wrong']}"
          + (f"  (plans seen: {', '.join(plans)})" if len(plans) > 1 else ""))
PY
echo "== results in $OUT (exit $status)"
exit $status
