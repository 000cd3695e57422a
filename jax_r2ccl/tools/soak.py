"""`jax-r2ccl soak --minutes M --seed S [--hosts N]`: a random-fault soak on the test bed
(root). N processes, one per network-namespace host of 4 NICs each, train a small MLP
data-parallel (jax_r2ccl.pmean of the gradients inside shard_map under jit) and, in every
step, run four collectives whose answers are known exactly: psum of float32, all_gather of
bfloat16, psum_scatter of float32 and all_to_all of int32, at a size drawn per step from
4 KiB .. 4 MiB. Every output is compared bit for bit, on the device that received it, with
the answer computed there from the formula that made the inputs.

Meanwhile a schedule drawn from the seed injects overlapping faults on random NICs of random
hosts: fail (link down), flap, black hole, degrade to a tenth, and, rarely, every NIC of one
host down for under a second; each is healed after its duration. The schedule keeps, for
every pair of hosts, one NIC index healthy on both, except in the brief all-NIC cuts (which
R2CCL_TIMEOUT outlasts). It reports steps, faults, failovers and failbacks (the rails'
failure and recovery counts), wrong results, hangs, and the longest step beside the expected
degraded step time; it exits 0 only with no wrong result, no hang and every process done.

The step count is the same everywhere: process 0 decides when the time is up and every
process learns it from the step's own all-reduce."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

from .launch import cli_argv, launch

NICS = 4
RATE = "200mbit"
TENTH = "20mbit"
COORD_PORT = 29351
DEVICES = 2                      # CPU devices per process
WARMUP_S = 15.0                  # fault-free at first: the healthy step time is measured then
MEAN_GAP_S = 2.5                 # between the starts of two faults (exponential)
SIZES = (4 << 10, 256 << 10, 4 << 20)   # bytes of each device's psum input, per step drawn from these
KINDS = ("fail", "flap", "blackhole", "degrade", "host_blip")
WEIGHTS = (0.3, 0.2, 0.2, 0.25, 0.05)


@dataclass(frozen=True)
class Fault:
    at_s: float          # from the start of the schedule
    kind: str
    host: int
    nic: int             # -1: every NIC (host_blip)
    dur_s: float

    def nics(self) -> list[int]:
        return list(range(NICS)) if self.nic < 0 else [self.nic]


def schedule(seed: int, seconds: float, hosts: int, start_s: float = WARMUP_S) -> list[Fault]:
    """The faults of one soak, a pure function of its arguments. Faults overlap; no NIC has two
    at once; every pair of hosts keeps a NIC index on which neither is cut (fail, flap or black
    hole: a degraded NIC still carries) over any fault's span, except a host_blip, which is
    alone in its span and shorter than a second."""
    rng = random.Random(seed)
    out: list[Fault] = []
    t = start_s
    end = seconds - 5.0          # the last faults heal before the run ends
    while True:
        t += rng.expovariate(1.0 / MEAN_GAP_S)
        kind = rng.choices(KINDS, WEIGHTS)[0]
        if kind == "host_blip":
            f = Fault(round(t, 3), kind, rng.randrange(hosts), -1, round(rng.uniform(0.3, 0.9), 3))
        else:
            dur = rng.uniform(0.8, 3.0) if kind == "flap" else rng.uniform(0.5, 6.0)
            f = Fault(round(t, 3), kind, rng.randrange(hosts), rng.randrange(NICS), round(dur, 3))
        if f.at_s + f.dur_s > end:
            break
        if _admissible(f, out, hosts):
            out.append(f)
    return out


def _overlaps(a: Fault, b: Fault, margin: float = 0.5) -> bool:
    return a.at_s < b.at_s + b.dur_s + margin and b.at_s < a.at_s + a.dur_s + margin


def _admissible(f: Fault, placed: list[Fault], hosts: int) -> bool:
    near = [g for g in placed if _overlaps(f, g)]
    if f.kind == "host_blip" or any(g.kind == "host_blip" for g in near):
        return not near
    busy = {(g.host, k) for g in near for k in g.nics()}
    if any((f.host, k) in busy for k in f.nics()):
        return False
    cut = {(g.host, k) for g in near + [f] if g.kind != "degrade" for k in g.nics()}
    return all(any((a, k) not in cut and (b, k) not in cut for k in range(NICS))
               for a in range(hosts) for b in range(a + 1, hosts))


# ------------------------------------------------------------------------------ the parent

def _apply(f: Fault, log: list, lock: threading.Lock, t0: float) -> None:
    """Injects one fault, waits its duration, heals it; records both with their times."""
    from . import testbed

    def note(what: str, err: str = "") -> None:
        with lock:
            log.append({"t": round(time.time() - t0, 3), "what": what, **asdict(f), "error": err})
    try:
        if f.kind == "flap":
            note("inject")
            count = max(1, int(f.dur_s / 0.2))           # 100 ms down, 100 ms up
            testbed.flap(f.host, f.nic, 100, count)
            note("heal")
            return
        for k in f.nics():
            if f.kind in ("fail", "host_blip"):
                testbed.fail(f.host, k)
            elif f.kind == "blackhole":
                testbed.blackhole(f.host, k)
            else:
                testbed.degrade(f.host, k, TENTH)
        note("inject")
        time.sleep(f.dur_s)
    except Exception as e:  # noqa: BLE001 - recorded; the heal below still runs
        note("inject-failed", str(e))
    finally:
        if f.kind != "flap":
            for k in f.nics():
                try:
                    if f.kind in ("fail", "host_blip"):
                        testbed.heal(f.host, k)
                    else:
                        testbed.degrade(f.host, k, "base")
                except Exception as e:  # noqa: BLE001
                    note("heal-failed", str(e))
            note("heal")


def _run_faults(faults: list[Fault], t0: float, stop: threading.Event, log: list) -> None:
    lock = threading.Lock()
    threads = []
    for f in faults:
        if stop.wait(max(0.0, t0 + f.at_s - time.time())):
            break
        th = threading.Thread(target=_apply, args=(f, log, lock, t0), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(timeout=30)


def _parse(argv):
    p = argparse.ArgumentParser(prog="jax-r2ccl soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=3.0, help="length of the training loop (default 3)")
    p.add_argument("--seed", type=int, default=1, help="seed of the fault schedule (default 1)")
    p.add_argument("--hosts", type=int, default=2, help="test-bed hosts, one process each (default 2; 2..8)")
    p.add_argument("--rate", default=RATE, help=f"rate of every test-bed link (default {RATE})")
    p.add_argument("--report", help="also write the report as JSON to this file")
    p.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    p.add_argument("--coordinator", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not 0.5 <= a.minutes <= 24 * 60:
        p.error("--minutes must be between 0.5 and 1440")
    if not 2 <= a.hosts <= 8:
        p.error("--hosts must be between 2 and 8")
    return a


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = _parse(argv)
    if a.process_id is not None:
        return _worker(a)
    from . import testbed
    why = testbed.why_unavailable()
    if why:
        print(f"jax-r2ccl soak: {why}", file=sys.stderr)
        return 2
    seconds = a.minutes * 60
    faults = schedule(a.seed, seconds, a.hosts)
    testbed.up(a.hosts, NICS, a.rate)
    out_dir = tempfile.mkdtemp(prefix="r2ccl-soak-")
    log: list = []
    stop = threading.Event()
    codes = None
    try:
        coordinator = f"198.18.0.1:{COORD_PORT}"
        env = dict(os.environ, R2CCL_NICS=",".join(f"nic{k}" for k in range(NICS)))
        # Every fault is logged at WARN by every process: thousands of lines in a long soak. The
        # report counts them; R2CCL_DEBUG=WARN shows them.
        env.setdefault("R2CCL_DEBUG", "ERROR")
        start_file = os.path.join(out_dir, "started")
        cmds = [cli_argv("soak", *argv, "--process-id", i, "--coordinator", coordinator, "--out", out_dir)
                for i in range(a.hosts)]
        print(f"[soak] {a.hosts} hosts x {NICS} NICs at {a.rate}, {a.minutes:g} min, seed {a.seed}: "
              f"{len(faults)} faults scheduled", flush=True)
        runner = threading.Thread(target=_wait_then_run, args=(start_file, faults, stop, log), daemon=True)
        runner.start()
        # Startup (imports, compiles) + the loop + the slowest last step, bounded.
        codes = launch(cmds, env, seconds + 300, prefixes=[testbed.run_prefix(i) for i in range(a.hosts)])
    finally:
        stop.set()
        testbed.down()
    rep = _report(a, faults, log, out_dir, codes)
    if a.report:
        with open(a.report, "w") as f:
            json.dump(rep, f, indent=1)
    return 0 if rep["pass"] else 1


def _wait_then_run(start_file: str, faults, stop: threading.Event, log: list) -> None:
    """The schedule's clock starts when process 0 has compiled and starts its loop."""
    while not stop.is_set() and not os.path.exists(start_file):
        stop.wait(0.05)
    if stop.is_set():
        return
    with open(start_file) as f:
        t0 = float(f.read())
    _run_faults(faults, t0, stop, log)


def _report(a, faults, log, out_dir, codes) -> dict:
    procs = []
    for i in range(a.hosts):
        try:
            with open(os.path.join(out_dir, f"report{i}.json")) as f:
                procs.append(json.load(f))
        except (FileNotFoundError, json.JSONDecodeError):
            procs.append(None)
    done = [p for p in procs if p is not None and p.get("error") is None]
    hangs = 1 if codes is None else 0
    wrong = sum(p["wrong"] for p in done)
    digests = {p["params_sha256"] for p in done}
    if len(digests) > 1:
        wrong += 1                   # the replicated parameters differ between processes
    injected = [e for e in log if e["what"] == "inject"]
    by_kind = {k: sum(1 for e in injected if e["kind"] == k) for k in KINDS}
    detect = max(done[0]["stall_ms"] / 1e3, done[0]["heartbeat_ms"] * done[0]["heartbeat_misses"] / 1e3) if done else 0
    # Process 0's steps (start_s, seconds, size): its clock is the schedule's (it wrote the start).
    steps = [tuple(s) for s in procs[0]["steps_detail"]] if procs[0] and procs[0].get("steps_detail") else []
    healthy = {b: _median([d for t, d, z in steps if z == b and t < WARMUP_S - 1.0]) for b in SIZES}
    worst = None                     # (ratio, start, seconds, expected, size)
    over = 0
    for t, d, z in steps:
        e = expected_step(faults, a.hosts, t, d, healthy[z], detect)
        over += d > e
        if worst is None or d / e > worst[0]:
            worst = (d / e, t, d, e, z)
    longest = max(steps, key=lambda s: s[1]) if steps else None
    ok = (len(done) == a.hosts and hangs == 0 and wrong == 0 and codes is not None and all(c == 0 for c in codes)
          and len({p["steps"] for p in done}) == 1)
    rep = {"hosts": a.hosts, "nics": NICS, "rate": a.rate, "minutes": a.minutes, "seed": a.seed,
           "steps": done[0]["steps"] if done else 0, "collectives_checked": sum(p["checked"] for p in done),
           "faults_scheduled": len(faults), "faults_injected": len(injected), "faults_by_kind": by_kind,
           "fault_errors": [e for e in log if e["what"].endswith("failed")],
           "failovers": sum(p["rail_failures"] for p in done), "failbacks": sum(p["rail_recoveries"] for p in done),
           "wrong": wrong, "hangs": hangs, "errors": [p["error"] for p in procs if p and p.get("error")],
           "missing": [i for i, p in enumerate(procs) if p is None],
           "healthy_step_s": {str(b): v for b, v in healthy.items()},
           "longest_step": ({"at_s": longest[0], "seconds": longest[1], "bytes": longest[2],
                             "expected_s": expected_step(faults, a.hosts, *longest[:2], healthy[longest[2]], detect)}
                            if longest else None),
           "worst_vs_expected": ({"ratio": worst[0], "at_s": worst[1], "seconds": worst[2], "expected_s": worst[3],
                                  "bytes": worst[4]} if worst else None),
           "steps_over_expected": over, "exit_codes": codes, "pass": ok}
    print(f"[soak] steps {rep['steps']} (collective outputs checked bit for bit, 4 per step on every device: {rep['collectives_checked']}), "
          f"faults injected {rep['faults_injected']} of {rep['faults_scheduled']} "
          f"({', '.join(f'{k} {v}' for k, v in by_kind.items())})", flush=True)
    print(f"[soak] failovers {rep['failovers']}, failbacks {rep['failbacks']} (rail failures and recoveries, "
          f"both ends counted)", flush=True)
    if longest:
        ls, ws = rep["longest_step"], rep["worst_vs_expected"]
        print(f"[soak] healthy step by psum size: " +
              ", ".join(f"{b >> 10} KiB {v * 1e3:.1f} ms" for b, v in healthy.items()), flush=True)
        print(f"[soak] longest step {ls['seconds'] * 1e3:.0f} ms ({ls['bytes'] >> 10} KiB, at {ls['at_s']:.1f} s; "
              f"expected there <= {ls['expected_s'] * 1e3:.0f} ms); highest step/expected: {ws['ratio']:.2f} "
              f"({ws['seconds'] * 1e3:.0f} ms against {ws['expected_s'] * 1e3:.0f} ms at {ws['at_s']:.1f} s); "
              f"steps over their expectation: {over} of {len(steps)}", flush=True)
    for e in rep["errors"]:
        print(f"[soak] process error: {e}", flush=True)
    print(f"[soak] wrong {wrong}, hangs {hangs}, processes done {len(done)}/{a.hosts}: "
          f"{'PASS' if ok else 'FAIL'}", flush=True)
    return rep


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


# How long after its heal a fault still costs: the NIC's hold-down and re-dial (a flapping
# link's hold-down doubles up to 16 x R2CCL_LINK_HOLDDOWN_MS), or the monitor's re-weighting.
_TAIL_S = {"fail": 0.5, "flap": 2.0, "blackhole": 0.5, "degrade": 1.0, "host_blip": 1.0}


def expected_step(faults: list[Fault], hosts: int, start: float, seconds: float, healthy: float,
                  detect: float) -> float:
    """What a step that began at `start` (on the schedule's clock) and took `seconds` should take
    at most, given the faults it overlapped: its healthy time scaled to the bandwidth the worst
    pair of hosts kept (a cut NIC carries nothing; a degraded one a tenth), or 10 x when a NIC
    was degraded (until the monitor measures it, a degraded NIC keeps its share of the step at a
    tenth of the rate), plus detection (stall timer or heartbeat silence) and any host blip."""
    act = [f for f in faults if f.at_s - 0.5 < start + seconds and start < f.at_s + f.dur_s + _TAIL_S[f.kind]]
    if not act:
        return max(healthy * 2, healthy + 0.05)      # no fault: scheduling noise only
    def weight(host: int, k: int) -> float:
        w = 1.0
        for f in act:
            if f.host == host and k in f.nics():
                w = min(w, 0.1 if f.kind == "degrade" else 0.0)
        return w
    cap = min(sum(min(weight(x, k), weight(y, k)) for k in range(NICS))
              for x in range(hosts) for y in range(x + 1, hosts))
    scale = max(NICS / max(cap, 0.1), 10.0 if any(f.kind == "degrade" for f in act) else 1.0)
    blip = sum(f.dur_s + _TAIL_S["host_blip"] for f in act if f.kind == "host_blip")
    return healthy * scale + detect + blip + 0.05


# ------------------------------------------------------------------------------ a process

def _worker(a) -> int:
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={DEVICES}").strip()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import jax_r2ccl
    from jax_r2ccl.errors import R2cclError

    me = a.process_id
    out = {"error": None, "steps": 0, "wrong": 0, "checked": 0}
    jax.distributed.initialize(coordinator_address=a.coordinator, num_processes=a.hosts, process_id=me)
    ep = jax_r2ccl.initialize(nics=os.environ["R2CCL_NICS"].split(","))
    cfg = ep.config
    out.update(stall_ms=cfg.stall_ms, heartbeat_ms=cfg.heartbeat_ms, heartbeat_misses=cfg.heartbeat_misses)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    n = len(jax.devices())
    width = 256

    def loss_fn(params, x, y):
        h = jnp.tanh(x @ params["w1"])
        return jnp.mean((h @ params["w2"] - y) ** 2)

    def pattern(j, step, elems):
        """Device j's input at `step`: small integers, so any order of summation is exact."""
        e = jnp.arange(elems, dtype=jnp.int32)
        return (j * 7 + step * 13 + e * 3) % 17 - 8

    def bits_differ(got, want):
        ity = {2: jnp.int16, 4: jnp.int32}[jnp.dtype(got.dtype).itemsize]
        return jnp.sum(jax.lax.bitcast_convert_type(got, ity) != jax.lax.bitcast_convert_type(want, ity))

    def make_step(elems):
        per = elems // n                    # all_gather input and each all_to_all / scatter chunk

        def body(params, x, y, step, stop):
            local = jax.lax.pcast(params, "data", to="varying")
            loss, grads = jax.value_and_grad(loss_fn)(local, x, y)
            grads = jax_r2ccl.pmean(grads, "data")
            params = jax.tree.map(lambda p, g: p - 0.05 * g, params, grads)
            i = jax.lax.axis_index("data")
            s = step[0]
            every = jnp.stack([pattern(j, s, elems) for j in range(n)])          # every device's input
            bad = jnp.int32(0)
            got = jax_r2ccl.psum(pattern(i, s, elems).astype(jnp.float32), "data")
            bad += bits_differ(got, every.sum(0).astype(jnp.float32))
            got = jax_r2ccl.all_gather(pattern(i, s, per).astype(jnp.bfloat16), "data", tiled=True)
            bad += bits_differ(got, every[:, :per].reshape(-1).astype(jnp.bfloat16))
            got = jax_r2ccl.psum_scatter(pattern(i, s, elems).astype(jnp.float32), "data", tiled=True)
            bad += bits_differ(got, jax.lax.dynamic_slice(every.sum(0), (i * per,), (per,)).astype(jnp.float32))
            got = jax_r2ccl.all_to_all(pattern(i, s, elems).reshape(n, per), "data", 0, 0, tiled=True)
            want = jax.lax.dynamic_slice(every.reshape(n, n, per), (0, i, 0), (n, 1, per)).reshape(n * per)
            bad += bits_differ(got.reshape(-1), want)
            halt = jax_r2ccl.psum(stop, "data")
            return params, jax_r2ccl.pmean(loss, "data"), bad.reshape(1), halt

        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data"), P("data"), P(), P("data")),
                                     out_specs=(P(), P(), P("data"), P("data"))))

    steps_fn = {b: make_step(b // 4) for b in SIZES}
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64 * n, 32)).astype(np.float32)
    Y = np.sin(X[:, :1] * 2).astype(np.float32)
    xs = jax.make_array_from_callback(X.shape, NamedSharding(mesh, P("data")), lambda i: X[i])
    ys = jax.make_array_from_callback(Y.shape, NamedSharding(mesh, P("data")), lambda i: Y[i])
    k1, k2 = jax.random.split(jax.random.key(0))
    params = jax.device_put({"w1": jax.random.normal(k1, (32, width)) * 0.1,
                             "w2": jax.random.normal(k2, (width, 1)) * 0.1}, NamedSharding(mesh, P()))
    flag_sharding = NamedSharding(mesh, P("data"))
    draw = random.Random(a.seed * 7919 + 1)       # the same draws on every process
    seconds = a.minutes * 60
    step_s, starts, sizes = [], [], []
    try:
        for b, fn in steps_fn.items():             # compile every size before the clock starts
            zero = jax.make_array_from_callback((n,), flag_sharding, lambda i: np.zeros(1, np.int32))
            r = fn(params, xs, ys, jnp.zeros(1, jnp.int32), zero)
            out["wrong"] += sum(int(np.asarray(sh.data).sum()) for sh in r[2].addressable_shards)
        if me == 0:
            with open(os.path.join(a.out, "started.tmp"), "w") as f:
                f.write(repr(time.time()))
            os.rename(os.path.join(a.out, "started.tmp"), os.path.join(a.out, "started"))
        t0 = time.time()
        end = t0 + seconds
        for step in range(1, 10_000_000):
            size = draw.choice(SIZES)
            stop = 1 if (me == 0 and time.time() >= end) else 0
            flag = jax.make_array_from_callback((n,), flag_sharding, lambda i, v=stop: np.full(1, v, np.int32))
            ts = time.time()
            params, loss, bad, halt = steps_fn[size](params, xs, ys, jnp.full(1, step, jnp.int32), flag)
            wrong = sum(int(np.asarray(sh.data).sum()) for sh in bad.addressable_shards)
            halted = int(np.asarray(halt.addressable_shards[0].data)[0])
            step_s.append(time.time() - ts)
            starts.append(ts - t0)
            sizes.append(size)
            out["wrong"] += wrong
            out["checked"] += 4 * len(bad.addressable_shards)
            out["steps"] = step
            if wrong:
                print(f"[soak] process {me} step {step}: {wrong} elements differ", flush=True)
            if halted:
                break
        out["loss"] = float(np.asarray(loss.addressable_shards[0].data))
    except R2cclError as e:
        out["error"] = f"{e.cause} (peer {e.peer}): {e}"
    except Exception as e:  # noqa: BLE001 - a failed custom call reaches Python as XLA's error
        out["error"] = f"{type(e).__name__}: {e}"
    flat = np.concatenate([np.asarray(v.addressable_shards[0].data).ravel() for v in jax.tree.leaves(params)])
    out["params_sha256"] = hashlib.sha256(flat.tobytes()).hexdigest()
    st = [s for p in range(a.hosts) if p != me for s in ep.rail_stats(p)]
    out["rail_failures"] = sum(s["failures"] for s in st)
    out["rail_recoveries"] = sum(s["recoveries"] for s in st)
    out["steps_detail"] = [(round(t, 4), round(d, 5), z) for t, d, z in zip(starts, step_s, sizes)]
    with open(os.path.join(a.out, f"report{me}.json.tmp"), "w") as f:
        json.dump(out, f)
    os.rename(os.path.join(a.out, f"report{me}.json.tmp"), os.path.join(a.out, f"report{me}.json"))
    if out["error"] is None:
        jax_r2ccl.shutdown()
        jax.distributed.shutdown()
    return 0 if out["error"] is None and out["wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
