#!/usr/bin/env bash
# bench p2p over RDMA verbs beside sockets, on the same Soft-RoCE NICs of the verbs test bed
# (jax-r2ccl testbed vm: two emulated guests, NICS NICs each), in one run: rows r2ccl-socket
# and r2ccl-ibverbs (frames through the bounce buffers), and the same with registered buffers
# (r2ccl-<T>-zc: verbs moves them by one-sided writes), each with CPU seconds per GB. Root; boots the bed if it is not up and
# leaves it as it found it. Every row has copies/B: payload bytes the transport copied on
# the CPU per byte, sender + receiver. Settings: NICS (2), SIZES (64KiB,1MiB,16MiB), ITERS (5),
# PY (the Python with jax_r2ccl installed; default: python3 on PATH), OUT (a folder: the
# receiving guest's JSON goes to $OUT/verbs_p2p.json).
set -euo pipefail
NICS=${NICS:-2} SIZES=${SIZES:-64KiB,1MiB,16MiB} ITERS=${ITERS:-5} PY=${PY:-$(command -v python3)}
OUT=${OUT:-}
exec "$PY" - "$NICS" "$SIZES" "$ITERS" "$PY" "$OUT" <<'PYEOF'
import os, sys, time
from jax_r2ccl.tools import testbed_vm as vm
nics, sizes, iters, py, out_dir = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
MARK = "#### verbs_p2p.json ####"
booted = not vm.status().get("up")
if booted:
    vm.up(2, nics)
try:
    ids = []
    for g in range(2):
        mine = ",".join(f"198.18.{k}.{g + 1}" for k in range(nics))
        cmd = (f"cd /tmp && {py} -m jax_r2ccl bench p2p --coordinator 198.18.0.1:45123 --num-processes 2 "
               f"--process-id {g} --nics {mine} --sizes {sizes} --iters {iters} --warmup 1 --no-baselines "
               f"--transports socket,ibverbs --zero-copy --timeout 300 --json /tmp/verbs_p2p.json")
        if g == 0:   # the guests' / is the host's, read-only: the JSON comes back on stdout
            cmd += f" ; rc=$? ; echo '{MARK}' ; cat /tmp/verbs_p2p.json ; exit $rc"
        ids.append(vm.submit(g, cmd, 900))
    t0 = time.monotonic()
    out = [vm.wait(g, ids[g], 900) for g in range(2)]
    text, _, doc = out[0][1].partition(MARK)
    print(text, end="")
    if out_dir and doc.strip():
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "verbs_p2p.json"), "w") as f:
            f.write(doc.strip() + "\n")
        print(f"# wrote {os.path.join(out_dir, 'verbs_p2p.json')}")
    if out[1][0] != 0:
        print(f"--- guest 1 exited {out[1][0]}:\n{out[1][1][-3000:]}")
    print(f"# bed: 2 TCG guests x {nics} Soft-RoCE NICs; {time.monotonic() - t0:.0f} s")
    sys.exit(out[0][0] or out[1][0])
finally:
    if booted:
        vm.down()
PYEOF
