"""`jax-r2ccl demo --transport`: the transport demo. Two local processes whose four rails are
loopback addresses; rank 0 streams a buffer to rank 1, one rail is taken down mid-transfer
and healed later; per-rail progress is printed; the result is checked byte for byte.
Exit status 0 only when every byte arrived intact."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time

from .launch import cli_argv, launch

NICS = "127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4"


def _parse(argv):
    p = argparse.ArgumentParser(prog="jax-r2ccl demo --transport", description=__doc__)
    p.add_argument("--mib", type=int, default=256, help="bytes to send, in MiB (default 256)")
    p.add_argument("--rail-rate", type=float, default=40.0,
                   help="software cap per rail in MB/s, so the transfer lasts long enough to watch "
                        "(default 40; loopback itself moves GB/s)")
    p.add_argument("--fail-rail", type=int, default=2, help="rail taken down mid-transfer (default 2)")
    p.add_argument("--fail-at", type=float, default=0.35, help="fraction of the transfer at which it fails")
    p.add_argument("--heal-at", type=float, default=0.7, help="fraction at which it is healed (failback)")
    p.add_argument("--fault", default="close", choices=["close", "stall"],
                   help="close: the connection dies; stall: it black-holes silently")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--kv", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _pattern(nbytes: int):
    import numpy as np
    return np.random.default_rng(2512_25059).integers(0, 256, nbytes, dtype=np.uint8)


def _rank_main(a) -> int:
    import numpy as np
    from ..transport import bootstrap
    from ..config import Config
    from ..errors import R2cclError

    cfg = Config.from_env(nics=os.environ.get("R2CCL_NICS", NICS), timeout_s=20.0, bootstrap_timeout_s=60.0)
    ep = bootstrap.connect(bootstrap.FileStore(a.kv), a.rank, 2, config=cfg)
    nbytes = a.mib << 20
    try:
        if a.rank == 1:
            out = np.empty(nbytes, np.uint8)
            ep.recv(0, out, tag=1, timeout=120)
            ref = _pattern(nbytes)
            exact = bool(np.array_equal(out, ref))
            print(f"[rank 1] received {nbytes} bytes, sha256 {hashlib.sha256(out).hexdigest()[:16]}, "
                  f"reference {hashlib.sha256(ref).hexdigest()[:16]}: {'BIT-EXACT' if exact else 'MISMATCH'}",
                  flush=True)
            ep.send(0, np.array([exact], np.uint8), tag=2)
            return 0 if exact else 1
        data = _pattern(nbytes)
        rails = ep.rail_stats(1)
        for s in rails:
            ep.inject(1, s["rail"], "rate", a.rail_rate * 1e6)
        print(f"[rank 0] sending {a.mib} MiB to rank 1 over {len(rails)} rails "
              f"({', '.join(s['local_addr'] for s in rails)}), each capped at {a.rail_rate:g} MB/s", flush=True)
        print(f"[rank 0] rail {a.fail_rail} goes down ({a.fault}) at {a.fail_at:.0%} and is healed at "
              f"{a.heal_at:.0%}", flush=True)
        header = "  time  " + "".join(f"  rail{s['rail']} MB/state " for s in rails) + "   total"
        print(header, flush=True)
        t0 = time.monotonic()
        req = ep.isend(1, data, tag=1)
        events = []
        failed = healed = False
        while not req.done():
            st = ep.rail_stats(1)
            sent = sum(s["acked_bytes"] for s in st)
            frac = sent / nbytes
            if not failed and frac >= a.fail_at:
                ep.inject(1, a.fail_rail, a.fault)
                failed = True
                events.append(f"t={time.monotonic() - t0:.2f}s rail {a.fail_rail} {a.fault}d by the demo")
            elif failed and not healed and frac >= a.heal_at:
                ep.inject(1, a.fail_rail, "rate", a.rail_rate * 1e6)   # heal: back to its cap
                healed = True
                events.append(f"t={time.monotonic() - t0:.2f}s rail {a.fail_rail} healed by the demo")
            cells = "".join(f"  {s['acked_bytes'] / 1e6:7.1f} {s['state']:>5s}   " for s in st)
            print(f"{time.monotonic() - t0:6.2f}s{cells}  {sent / 1e6:7.1f}", flush=True)
            time.sleep(0.1)
        try:
            req.wait(60)
        except R2cclError as e:
            print(f"[rank 0] transfer failed: {e}", flush=True)
            return 1
        el = time.monotonic() - t0
        st = ep.rail_stats(1)
        print(f"[rank 0] sent {a.mib} MiB in {el:.2f} s ({nbytes / el / 1e6:.1f} MB/s)", flush=True)
        for e in events:
            print(f"[rank 0] {e}", flush=True)
        for s in st:
            print(f"[rank 0] rail {s['rail']} ({s['local_addr']}): {s['acked_bytes'] / 1e6:.1f} MB, "
                  f"failures {s['failures']}, recoveries {s['recoveries']}, re-sent chunks carried "
                  f"{s['retransmitted_chunks']}, state {s['state']}"
                  + (f", last error: {s['last_error']}" if s["last_error"] else ""), flush=True)
        verdict = np.zeros(1, np.uint8)
        ep.recv(1, verdict, tag=2, timeout=120)
        return 0 if verdict[0] else 1
    finally:
        ep.close()


def main(argv=None) -> int:
    a = _parse(sys.argv[1:] if argv is None else argv)
    if a.rank is not None:
        return _rank_main(a)
    with tempfile.TemporaryDirectory(prefix="r2ccl-demo-") as kv:
        env = dict(os.environ)
        env.setdefault("JAX_PLATFORMS", "cpu")
        base = cli_argv("demo", "--transport", "--kv", kv, *(argv if argv is not None else sys.argv[1:]))
        codes = launch([base + ["--rank", str(r)] for r in range(2)], env, 300)
    if codes is None:
        return 1
    ok = all(c == 0 for c in codes)
    print("demo: PASS (bit-exact through a rail failure)" if ok else f"demo: FAIL (exit codes {codes})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
