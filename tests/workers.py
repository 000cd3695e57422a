"""Worker functions run on every rank by tests/harness.py: each gets a connected endpoint
(or None for no_bootstrap workers), its rank and the world size, and returns JSON."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import numpy as np

from jax_r2ccl.errors import R2cclError


def pattern(nbytes: int, seed: int) -> np.ndarray:
    """Bytes that differ per (size, seed) and per position: a wrong offset shows."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, nbytes, dtype=np.uint8)


def _stats_summary(ep, peer):
    return [{k: s[k] for k in ("rail", "state", "tx_bytes", "rx_bytes", "retransmitted_chunks", "failures",
                               "recoveries", "last_error", "last_reason", "last_change_unix_s", "last_failure_unix_s", "transport",
                               "tx_copied_bytes", "rx_copied_bytes")}
            for s in ep.rail_stats(peer)]


def exchange(ep, rank, world, sizes, rounds=1, register=False):
    """Every rank sends to every other rank at once, sizes in turn; checks every byte.
    register: every buffer is registered (Endpoint.register_memory) and every receive is posted
    (and so advertised) before a barrier that the sends wait for: one-sided writes, no copies."""
    wrong, details = 0, []
    if register:
        peers = [p for p in range(world) if p != rank]
        ep.open(peers)
        ep.wait_ready(peers)
    for rnd in range(rounds):
        for si, n in enumerate(sizes):
            reqs, outs, ins, ids = [], {}, {}, []
            for peer in range(world):
                if peer == rank:
                    continue
                outs[peer] = np.empty(n, np.uint8)
                ins[peer] = pattern(n, 1000 * rank + 10 * peer + si + rnd)
                if register and n > 0:
                    ids += [ep.register_memory(outs[peer]), ep.register_memory(ins[peer])]
                reqs.append(ep.irecv(peer, outs[peer], tag=si))
            if register:
                barrier(ep, rank, world)
            for peer, data in ins.items():
                reqs.append(ep.isend(peer, data, tag=si))
            for r in reqs:
                r.wait()
            for rid in ids:
                ep.deregister_memory(rid)
            for peer, out in outs.items():
                exp = pattern(n, 1000 * peer + 10 * rank + si + rnd)
                if not np.array_equal(out, exp):
                    diff = np.nonzero(out != exp)[0]
                    wrong += 1
                    details.append({"peer": peer, "size": n, "first": int(diff[0]), "last": int(diff[-1]),
                                    "count": int(diff.size)})
    stats = {p: _stats_summary(ep, p) for p in range(world) if p != rank}
    barrier(ep, rank, world)
    return {"wrong": wrong, "details": details, "stats": stats}


def dmabuf_register(ep, rank, world):
    """Registers host memory through a dma-buf-shaped call (a memfd: the kernel's answer for a
    fd that is no dma-buf) and reports what the endpoint and the GPUDirect probe said; then a
    plain registration and a registered exchange still work (nothing was left half done)."""
    from jax_r2ccl import _core
    peers = [p for p in range(world) if p != rank]
    ep.open(peers)
    ep.wait_ready(peers)
    out = {"support": ep.dmabuf_support(), "gpudirect": _core.verbs_status([])["gpudirect"]}
    n = 1 << 20
    buf = np.zeros(n, np.uint8)
    fd = os.memfd_create("r2ccl-dmabuf-test")
    try:
        os.ftruncate(fd, n)
        try:
            rid = ep.register_dmabuf(buf, fd, 0)
            ep.deregister_memory(rid)
            out["registered"] = True
        except R2cclError as e:
            out.update(registered=False, error=str(e), cause=e.cause)
        try:
            ep.register_dmabuf(buf, -1, 0)
            out["bad_fd"] = None
        except R2cclError as e:
            out["bad_fd"] = [e.cause, str(e)]
    finally:
        os.close(fd)
    out["after"] = exchange(ep, rank, world, [n + 5], register=True)["wrong"]
    return out


def barrier(ep, rank, world, tag=1 << 40, timeout=-1.0):
    """Everyone has reached this point (a zero-byte message to and from every peer). timeout < 0:
    R2CCL_TIMEOUT (a test that shortens it for its faults may give the barrier longer)."""
    reqs = []
    for peer in range(world):
        if peer != rank:
            reqs.append(ep.irecv(peer, np.empty(0, np.uint8), tag=tag))
            reqs.append(ep.isend(peer, np.empty(0, np.uint8), tag=tag))
    for r in reqs:
        r.wait(timeout)


def tags_out_of_order(ep, rank, world, n=300_000):
    """Sends several tags in one order; the receiver posts in another, some late (unexpected)."""
    tags = [5, 1, 9, 1, 5, 7]
    if rank == 0:
        reqs = [ep.isend(1, pattern(n + i, 77 + i), tag=t) for i, t in enumerate(tags)]
        for r in reqs:
            r.wait()
        return {}
    time.sleep(0.3)   # let everything arrive before the receives exist
    got = {}
    order = [7, 1, 9, 5, 1, 5]
    seen = {}
    for t in order:
        k = seen.get(t, 0)
        seen[t] = k + 1
        idx = [i for i, x in enumerate(tags) if x == t][k]   # k-th message with tag t
        buf = np.empty(n + idx, np.uint8)
        ep.recv(0, buf, tag=t)
        got[f"{t}/{k}"] = bool(np.array_equal(buf, pattern(n + idx, 77 + idx)))
    return got


def transfer_with_fault(ep, rank, world, nbytes, fault=None, fault_rail=1, fault_side=0, fault_after_s=0.2,
                        rate=None, heal_after_s=None, iters=1, fault_cmd=None, heal_cmd=None, op_timeout=None,
                        until_rail_carries=None, max_extra_iters=40, register=False):
    """Rank 0 sends nbytes to rank 1 `iters` times; a fault hits one rail mid-transfer.

    rate: optional cap (bytes/s) on every rail of the sender, so the transfer lasts long
    enough for a fault to land in the middle on loopback. fault: an Endpoint.inject fault on
    rank `fault_side`, or fault_cmd: a shell command run by rank 0 (the test bed). op_timeout:
    the send's and the receive's own deadline (default: R2CCL_TIMEOUT). until_rail_carries: a
    rail of rank 0's; after `iters`, further iterations (at most max_extra_iters, rank 0 decides
    and tells rank 1) until that rail has carried bytes: a healed rail joins on its own clock.
    register: both buffers are registered (zero copy: one-sided writes into the advertised receive).
    """
    peer = 1 - rank
    if register:
        ep.open([peer])
        ep.wait_ready([peer])
    if rate and rank == 0:
        for s in ep.rail_stats(peer):
            ep.inject(peer, s["rail"], "rate", rate)
    times, wrong = [], 0
    timers = []
    it = 0
    while True:
        if it >= iters:
            if until_rail_carries is None or it >= iters + max_extra_iters:
                break
            more = np.zeros(1, np.uint8)
            if rank == 0:
                more[0] = ep.rail_stats(peer)[until_rail_carries]["tx_bytes"] == 0
                ep.send(1, more, tag=98)
            else:
                ep.recv(0, more, tag=98)
            if not more[0]:
                break
        ref = pattern(nbytes, 5 + it)
        out = np.empty(nbytes, np.uint8)
        ready = np.empty(1, np.uint8)
        ids = [ep.register_memory(out if rank == 1 else ref)] if register else []
        if rank == 1:
            rr = ep.irecv(0, out, tag=100 + it)
            ep.send(0, ready, tag=99)
        else:
            ep.recv(1, ready, tag=99)
        t0 = time.monotonic()
        if it == 0 and rank == fault_side and (fault or fault_cmd):
            def hit():
                if fault_cmd:
                    subprocess.run(fault_cmd, shell=True, check=True, timeout=30)
                else:
                    if fault == "stall" and rank == 0:
                        # Freeze the sender's rail with a data frame part-written: bytes that can
                        # only arrive if the stall is detected and they are re-sent elsewhere (a
                        # rail frozen between frames has delivered all it holds, and its acks
                        # travel on the others: nothing to detect).
                        deadline = time.monotonic() + 2.0
                        while ep.rail_stats(peer)[fault_rail]["unsent_bytes"] == 0 and time.monotonic() < deadline:
                            time.sleep(0.0002)
                    ep.inject(peer, fault_rail, fault)
            timers.append(threading.Timer(fault_after_s, hit))
            if heal_after_s is not None:
                def heal():
                    if heal_cmd:
                        subprocess.run(heal_cmd, shell=True, check=True, timeout=30)
                    else:
                        ep.inject(peer, fault_rail, "rate" if rate and fault_side == 0 else "heal", rate or 0.0)
                timers.append(threading.Timer(heal_after_s, heal))
            for t in timers:
                t.start()
        if rank == 0:
            ep.send(1, ref, tag=100 + it, timeout=op_timeout)
            times.append(time.monotonic() - t0)
        else:
            rr.wait(op_timeout)
            # the time is the transfer's: comparing 128 MiB (a fresh 128 MiB bool array) took
            # 0.05-0.7 s on a loaded 2-core machine, and once pushed a faulted run over its bound
            times.append(time.monotonic() - t0)
            wrong += int(not np.array_equal(out, ref))
        for rid in ids:
            ep.deregister_memory(rid)
        it += 1
    for t in timers:
        t.join()
    stats = _stats_summary(ep, peer)
    barrier(ep, rank, world)
    return {"times": times, "wrong": wrong, "stats": stats}


def failback(ep, rank, world, close_rail=2, hold_s=0.5):
    """Closes a rail on rank 0, heals it, then measures how soon it is up and carrying data."""
    peer = 1 - rank
    n = 8 << 20
    if rank == 0:
        ep.inject(peer, close_rail, "close")
        time.sleep(hold_s)
        assert ep.rail_stats(peer)[close_rail]["state"] == "down"
        t0 = time.monotonic()
        ep.inject(peer, close_rail, "heal")
        while ep.rail_stats(peer)[close_rail]["state"] != "up":
            if time.monotonic() - t0 > 5:
                raise AssertionError("rail not re-admitted within 5 s")
            time.sleep(0.005)
        up_after = time.monotonic() - t0
        before = ep.rail_stats(peer)[close_rail]["tx_bytes"]
        ep.send(peer, pattern(n, 3), tag=1)
        carried = ep.rail_stats(peer)[close_rail]["tx_bytes"] - before
        return {"up_after_s": up_after, "carried": carried, "stats": _stats_summary(ep, peer)}
    out = np.empty(n, np.uint8)
    ep.recv(peer, out, tag=1)
    return {"ok": bool(np.array_equal(out, pattern(n, 3)))}


def all_rails_down(ep, rank, world):
    """Every rail held down on both sides: a pending operation must fail naming the peer."""
    peer = 1 - rank
    for s in ep.rail_stats(peer):
        ep.inject(peer, s["rail"], "close")
    t0 = time.monotonic()
    buf = np.zeros(1 << 20, np.uint8)
    try:
        if rank == 0:
            ep.send(peer, buf, tag=3, timeout=30)
        else:
            ep.recv(peer, buf, tag=3, timeout=30)
    except R2cclError as e:
        return {"error": str(e), "cause": e.cause, "peer": e.peer, "after_s": time.monotonic() - t0}
    return {"error": None}


def killed_peer(ep, rank, world, nbytes=64 << 20):
    """Rank 1 dies by SIGKILL while rank 0 sends to it; rank 0 must get a clear error fast."""
    peer = 1 - rank
    if rank == 1:
        out = np.empty(nbytes, np.uint8)
        ep.irecv(0, out, tag=1)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    for s in ep.rail_stats(peer):
        ep.inject(peer, s["rail"], "rate", 20e6)   # keeps the send in flight when the peer dies
    t0 = time.monotonic()
    try:
        ep.send(peer, pattern(nbytes, 1), tag=1, timeout=30)
    except R2cclError as e:
        return {"error": str(e), "cause": e.cause, "peer": e.peer, "after_s": time.monotonic() - t0}
    return {"error": None}


def strangers(ep, rank, world, nbytes=32 << 20):
    """While rank 0 sends to rank 1, strangers dial rank 1's listeners: garbage, a replayed
    hello with a wrong proof, a hello from another job. All are dropped; the transfer is exact."""
    from jax_r2ccl import _core
    peer = 1 - rank
    if rank == 0:
        for s in ep.rail_stats(peer):
            ep.inject(peer, s["rail"], "rate", 50e6)
        ep.send(peer, pattern(nbytes, 9), tag=1)
        barrier(ep, rank, world)
        return {}
    out = np.empty(nbytes, np.uint8)
    req = ep.irecv(peer, out, tag=1)
    host, port = ep.addresses[0].rsplit(":", 1)
    answers = {}

    def dial(name, payload, read_reply=False):
        s = socket.create_connection((host, int(port)), timeout=5)
        try:
            try:
                s.sendall(payload)
            except (ConnectionResetError, BrokenPipeError):
                pass
            s.settimeout(3)
            data = b""
            try:
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                    if read_reply and len(data) >= 128:
                        # a challenge came: answer it with a proof made without the secret
                        s.sendall(_core._encode_frame(3, b"\0" * 32))
                        read_reply = False
            except socket.timeout:
                data += b"<timeout>"
            except ConnectionResetError:
                pass   # dropped with unread bytes pending: the kernel answers with a reset
            answers[name] = len(data)
        finally:
            s.close()

    secret_guess = b"not the job secret, not at all!!"
    dial("garbage", os.urandom(4096))
    dial("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    dial("other_job", _core._encode_frame(1, _core._encode_hello(secret_guess, 0, 1, 0)))
    # a hello frame shorter than a hello: rejected by its header, before its bytes are copied
    dial("short_hello", _core._encode_frame(1, b"\x01" * 8))
    req.wait()
    stats = _stats_summary(ep, peer)
    barrier(ep, rank, world)
    return {"exact": bool(np.array_equal(out, pattern(nbytes, 9))), "answers": answers, "stats": stats}


def bad_input(ep, rank, world):
    """Every misuse is a clear R2cclError on the rank that made it; the channel survives."""
    peer = 1 - rank
    errors = {}

    def expect(name, fn):
        try:
            fn()
            errors[name] = None
        except R2cclError as e:
            errors[name] = [e.cause, str(e)]

    a = np.zeros((4, 4), np.float32)
    expect("non_contiguous", lambda: ep.isend(peer, a[:, ::2]))
    ro = np.zeros(10, np.uint8)
    ro.flags.writeable = False
    expect("read_only", lambda: ep.irecv(peer, ro))
    expect("not_array", lambda: ep.isend(peer, [1, 2, 3]))
    expect("bad_peer", lambda: ep.send(7, np.zeros(3, np.uint8)))
    expect("self_peer", lambda: ep.send(rank, np.zeros(3, np.uint8)))
    expect("bad_rail", lambda: ep.inject(peer, 99, "close"))
    expect("bad_fault", lambda: ep.inject(peer, 0, "explode"))
    expect("bad_weight", lambda: ep.set_rail_weight(peer, 0, -1.0))
    # size mismatch: rank 0 sends 1000 bytes, rank 1 expects 999
    if rank == 0:
        ep.send(peer, np.ones(1000, np.uint8), tag=4)
    else:
        expect("size_mismatch", lambda: ep.recv(peer, np.zeros(999, np.uint8), tag=4))
    # a receive with nothing coming times out cleanly and the channel still works after
    if rank == 1:
        t0 = time.monotonic()
        expect("recv_timeout", lambda: ep.recv(peer, np.zeros(10, np.uint8), tag=5, timeout=0.3))
        errors["recv_timeout_s"] = time.monotonic() - t0
    buf = np.empty(1 << 20, np.uint8)
    if rank == 0:
        ep.send(peer, pattern(1 << 20, 2), tag=6)
    else:
        ep.recv(peer, buf, tag=6)
        errors["after_ok"] = bool(np.array_equal(buf, pattern(1 << 20, 2)))
    barrier(ep, rank, world)
    return errors


def idle_cpu(ep, rank, world, seconds=2.0):
    """CPU seconds the process burns while connected and idle (heartbeats only)."""
    t0 = time.process_time()
    time.sleep(seconds)
    return {"cpu_s": time.process_time() - t0, "wall_s": seconds}


def _abandoned_then_ok(ep, peer, nbytes, tag, next_bytes, next_seed, next_tag):
    """The receiver's side of an abandoned message: its receive's error (or None), then
    whether the next message on the channel arrives exactly."""
    out = {}
    try:
        ep.recv(peer, np.empty(nbytes, np.uint8), tag=tag, timeout=10)
        out["recv"] = None
    except R2cclError as e:
        out["recv"] = [e.cause, str(e)]
    buf = np.empty(next_bytes, np.uint8)
    ep.recv(peer, buf, tag=next_tag, timeout=10)
    out["after_ok"] = bool(np.array_equal(buf, pattern(next_bytes, next_seed)))
    return out


def cancelled_send(ep, rank, world, nbytes=32 << 20):
    """A send that times out is abandoned cleanly: the receiver is told, the channel goes on."""
    peer = 1 - rank
    out = {}
    if rank == 0:
        for s in ep.rail_stats(peer):
            ep.inject(peer, s["rail"], "rate", 10e6)    # 32 MiB would need ~0.8 s
        try:
            ep.send(peer, pattern(nbytes, 4), tag=1, timeout=0.2)
            out["send"] = None
        except R2cclError as e:
            out["send"] = [e.cause, str(e)]
        for s in ep.rail_stats(peer):
            ep.inject(peer, s["rail"], "heal")
        ep.send(peer, pattern(1 << 20, 5), tag=2)
    else:
        out.update(_abandoned_then_ok(ep, peer, nbytes, 1, 1 << 20, 5, 2))
    barrier(ep, rank, world)
    return out


def weighted_split(ep, rank, world, weights, nbytes=64 << 20):
    """Rail weights (the health monitor's seam) steer the share of chunks each rail carries."""
    peer = 1 - rank
    if rank == 0:
        for r, w in enumerate(weights):
            ep.set_rail_weight(peer, r, w)
        before = [s["tx_bytes"] for s in ep.rail_stats(peer)]
        ep.send(peer, pattern(nbytes, 6), tag=1)
        after = [s["tx_bytes"] for s in ep.rail_stats(peer)]
        barrier(ep, rank, world)
        return {"bytes": [a - b for a, b in zip(after, before)]}
    buf = np.empty(nbytes, np.uint8)
    ep.recv(peer, buf, tag=1)
    barrier(ep, rank, world)
    return {"exact": bool(np.array_equal(buf, pattern(nbytes, 6)))}


# ------------------------------------------------------------------ host collectives

def _rank_input(kind, dtype, count, rank, seed=0):
    """Deterministic input of one rank: small values so sums and products stay exact-ish."""
    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
    rng = np.random.default_rng(1000 * seed + rank)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, count).astype(np.bool_)
    if dt.kind in "iu":
        return rng.integers(0, 100, count).astype(dt)
    return (rng.standard_normal(count) * 4).astype(dt)


def _fold(op, xs):
    """Canonical order of csrc/coll: left fold, in the order given."""
    acc = xs[0].copy()
    for x in xs[1:]:
        if op == "sum":
            acc = np.logical_or(acc, x) if acc.dtype == np.bool_ else (acc + x).astype(acc.dtype)
        elif op == "prod":
            acc = np.logical_and(acc, x) if acc.dtype == np.bool_ else (acc * x).astype(acc.dtype)
        elif op == "max":
            acc = np.maximum(acc, x)
        else:
            acc = np.minimum(acc, x)
    return acc


def host_reference(kind, op, inputs_by_rank, process_of_rank, root=0, perm=None):
    """What every rank's output must be, in the library's canonical (hierarchical) order."""
    n = len(process_of_rank)
    if kind == "permute":
        out = [np.zeros_like(inputs_by_rank[0]) for _ in range(n)]
        for r, d in enumerate(perm):
            if d >= 0:
                out[d] = inputs_by_rank[r]
        return out
    procs = list(dict.fromkeys(process_of_rank))
    if kind in ("all_reduce", "reduce_scatter"):
        partial = [_fold(op, [inputs_by_rank[r] for r in range(n) if process_of_rank[r] == p]) for p in procs]
        total = _fold(op, partial)
        if kind == "all_reduce":
            return [total] * n
        shard = total.size // n
        return [total[r * shard:(r + 1) * shard] for r in range(n)]
    if kind == "all_gather":
        return [np.concatenate(inputs_by_rank)] * n
    if kind == "all_to_all":
        chunk = inputs_by_rank[0].size // n
        return [np.concatenate([inputs_by_rank[r][j * chunk:(j + 1) * chunk] for r in range(n)]) for j in range(n)]
    return [inputs_by_rank[root]] * n


def _host_setup(ep, rank, world, local, rate):
    """(HostCollectives, process_of_rank, my_ranks) for `local` ranks per process; every rail
    to every peer throttled to `rate` bytes/s when given."""
    from jax_r2ccl.transport.host_collectives import HostCollectives
    hc = HostCollectives(ep)
    process_of_rank = [p for p in range(world) for _ in range(local)]
    my_ranks = [r for r, p in enumerate(process_of_rank) if p == rank]
    if rate:
        for peer in range(world):
            if peer != rank:
                for s in ep.rail_stats(peer):
                    ep.inject(peer, s["rail"], "rate", rate)
    return hc, process_of_rank, my_ranks


def host_collective(ep, rank, world, cases, local=1, fault=None, rate=None):
    """Runs each case (kind, dtype, op, count, root) with `local` ranks per process; checks
    every output bit for bit against the canonical-order reference."""
    import ml_dtypes  # noqa: F401
    hc, process_of_rank, my_ranks = _host_setup(ep, rank, world, local, rate)
    bad = []
    timer = None
    for i, (kind, dtype, op, count, root, *perm) in enumerate(cases):
        perm = perm[0] if perm else None
        if fault and i == fault["case"] and rank == 0:
            timer = threading.Timer(fault["after_s"], lambda: ep.inject(fault.get("peer", 1), fault["rail"], fault["fault"]))
            timer.start()
        ins = {r: _rank_input(kind, dtype, count, r, seed=i) for r in range(len(process_of_rank))}
        outs = hc.run(kind, [ins[r] for r in my_ranks], process_of_rank=process_of_rank, my_ranks=my_ranks,
                      op=op, root=root, perm=perm)
        ref = host_reference(kind, op, [ins[r] for r in range(len(process_of_rank))], process_of_rank, root, perm)
        for r, o in zip(my_ranks, outs):
            want = ref[r]
            if o.dtype != want.dtype or o.shape != want.shape or o.tobytes() != want.tobytes():
                diff = int(np.count_nonzero(o.view(np.uint8) != want.view(np.uint8))) if o.nbytes == want.nbytes else -1
                bad.append({"case": [kind, dtype, op, count, root], "rank": r, "bytes_differing": diff})
    if timer:
        timer.join()
    stats = {p: _stats_summary(ep, p) for p in range(world) if p != rank}
    barrier(ep, rank, world)
    hc.close()
    return {"bad": bad, "stats": stats}


def ragged_layout(world, local, in_rows, spr, max_rows, seed, disjoint_inputs=False):
    """Consistent random slices of a ragged_all_to_all over world * local ranks, the same on every
    process: per rank (input_offsets, send_sizes, output_offsets, recv_sizes), K = n * spr each;
    sizes 0..max_rows (zeros included), input slices anywhere (they may overlap), each receiver's
    incoming slices in a random order with gaps, never overlapping (disjoint_inputs: nor do a
    sender's input slices, as a gradient through jax's transpose needs). Returns (slices, out_rows)."""
    rng = np.random.default_rng(seed)
    n = world * local
    K = n * spr
    size = rng.integers(0, max_rows + 1, (n, n, spr))          # [sender, receiver, t]
    in_off = np.zeros((n, K), np.int64)
    out_off = np.zeros((n, K), np.int64)
    ends = []
    for b in range(n):
        pos = int(rng.integers(0, 3))
        for a, t in [divmod(int(i), spr) for i in rng.permutation(n * spr)]:
            out_off[a, b * spr + t] = pos
            pos += int(size[a, b, t]) + int(rng.integers(0, 3))
        ends.append(pos)
    for a in range(n):
        pos = 0
        for b in range(n):
            for t in range(spr):
                if disjoint_inputs:
                    in_off[a, b * spr + t], pos = pos, pos + int(size[a, b, t])
                    assert pos <= in_rows, (pos, in_rows)
                else:
                    in_off[a, b * spr + t] = rng.integers(0, in_rows - size[a, b, t] + 1)
    send = size.reshape(n, K)
    recv = np.stack([size[:, b, :].reshape(K) for b in range(n)])
    return [(in_off[r], send[r], out_off[r], recv[r]) for r in range(n)], max(ends) + 1


def ragged_reference(inputs, initial, slices, spr):
    """jax.lax.ragged_all_to_all's result on every rank (its docstring's pseudocode)."""
    n = len(inputs)
    outs = [o.copy() for o in initial]
    for a in range(n):
        in_off, send, out_off, _ = slices[a]
        for k in range(len(send)):
            b = k // spr
            outs[b][out_off[k]:out_off[k] + send[k]] = inputs[a][in_off[k]:in_off[k] + send[k]]
    return outs


def host_ragged(ep, rank, world, cases, local=1, fault=None, rate=None, break_=None, commands=None):
    """ragged_all_to_all cases (dtype, input rows, row shape, slices per peer, most rows per slice)
    with `local` ranks per process, each output checked bit for bit against the reference; the
    outputs start from their own values (only the received slices change). break_: {"rank": r,
    "what": ...} spoils rank r's slices ("negative", "past_input", "past_output", "overlap",
    "expects_more"); then every error is returned instead. commands: {"fault_cmd", "heal_cmd",
    "fault_after_s", "heal_after_s"}: rank 0 runs them (the test bed's NIC faults) from the start."""
    import ml_dtypes  # noqa: F401
    hc, process_of_rank, my_ranks = _host_setup(ep, rank, world, local, rate)
    n = world * local
    bad, errors, timer, timers = [], [], None, []
    if commands and rank == 0:
        barrier(ep, rank, world)
        timers = [threading.Timer(commands[f"{w}_after_s"], lambda c=commands[f"{w}_cmd"]: subprocess.run(
            c, shell=True, check=True, timeout=30)) for w in ("fault", "heal")]
        for t in timers:
            t.start()
    elif commands:
        barrier(ep, rank, world)
    for i, (dtype, in_rows, row, spr, max_rows) in enumerate(cases):
        if fault and i == fault["case"] and rank == 0:
            timer = threading.Timer(fault["after_s"], lambda: ep.inject(fault.get("peer", 1), fault["rail"], fault["fault"]))
            timer.start()
        slices, out_rows = ragged_layout(world, local, in_rows, spr, max_rows, seed=100 + i)
        row = tuple(row)
        ins = [_rank_input("x", dtype, in_rows * int(np.prod(row)), r, seed=i).reshape((in_rows,) + row)
               for r in range(n)]
        initial = [_rank_input("x", dtype, out_rows * int(np.prod(row)), r + 1000, seed=i).reshape((out_rows,) + row)
                   for r in range(n)]
        ref = ragged_reference(ins, initial, slices, spr)
        if break_ is not None:
            r0, what = break_["rank"], break_["what"]
            sl = [[np.array(a) for a in x] for x in slices]
            in_off, send, out_off, recv = sl[r0]
            k = int(np.argmax(send))          # a slice that moves rows
            if what == "negative":
                in_off[k] = -1
            elif what == "past_input":
                in_off[k] = in_rows - send[k] + 1
            elif what == "past_output":
                out_off[k] = out_rows
            elif what == "expects_more":      # rank r0 expects a row more from rank 0 than it sends
                recv[0] += 1
            elif what == "overlap":           # ranks 0 and 1 both write row 0 of rank r0's output
                for a in (0, 1):
                    sl[a][0][r0 * spr], sl[a][1][r0 * spr], sl[a][2][r0 * spr] = 0, 1, 0
                    sl[r0][3][a * spr] = 1
            slices = [tuple(x) for x in sl]
        outs = [initial[r].copy() for r in my_ranks]
        try:
            hc.run("ragged_all_to_all", [ins[r] for r in my_ranks], outputs=outs, process_of_rank=process_of_rank,
                   my_ranks=my_ranks, ragged=[slices[r] for r in my_ranks], timeout=10.0 if break_ else None)
        except R2cclError as e:
            errors.append({"case": i, "error": str(e), "cause": e.cause})
            continue
        for r, o in zip(my_ranks, outs):
            if o.dtype != ref[r].dtype or o.shape != ref[r].shape or o.tobytes() != ref[r].tobytes():
                bad.append({"case": i, "rank": r, "rows_differing": int(np.count_nonzero(
                    (o != ref[r]).reshape(o.shape[0], -1).any(axis=1)))})
    for t in ([timer] if timer else []) + timers:
        t.join()
    stats = {p: _stats_summary(ep, p) for p in range(world) if p != rank}
    after = hc.run("all_reduce", [np.full(10, rank + 1, np.int64)], process_of_rank=list(range(world)), my_ranks=[rank])
    barrier(ep, rank, world)
    hc.close()
    return {"bad": bad, "errors": errors, "stats": stats, "after": after[0].tolist()}


def permute_with_fault(ep, rank, world, nbytes, iters, fault_cmd, heal_cmd, fault_after_s, heal_after_s):
    """jax.lax.ppermute's collective (kind permute: a ring shift, one rank per process) of
    `nbytes` per rank, `iters` times; rank 0 runs fault_cmd fault_after_s into the loop and
    heal_cmd heal_after_s in. Every output is checked bit for bit."""
    from jax_r2ccl.transport.host_collectives import HostCollectives
    hc = HostCollectives(ep)
    ring = [(r + 1) % world for r in range(world)]
    count = nbytes // 4
    ins = [pattern(nbytes, 31 * r + 5).view(np.float32) for r in range(world)]
    wrong, times, timers = 0, [], []
    barrier(ep, rank, world)
    if rank == 0:
        timers = [threading.Timer(fault_after_s, lambda: subprocess.run(fault_cmd, shell=True, check=True, timeout=30)),
                  threading.Timer(heal_after_s, lambda: subprocess.run(heal_cmd, shell=True, check=True, timeout=30))]
        for t in timers:
            t.start()
    for _ in range(iters):
        t0 = time.monotonic()
        out = hc.run("permute", [ins[rank]], process_of_rank=list(range(world)), my_ranks=[rank], perm=ring)[0]
        times.append(time.monotonic() - t0)
        wrong += int(out.size != count or out.tobytes() != ins[(rank - 1) % world].tobytes())
    for t in timers:
        t.join()
    stats = {p: _stats_summary(ep, p) for p in range(world) if p != rank}
    barrier(ep, rank, world)
    hc.close()
    return {"wrong": wrong, "times": times, "stats": stats}


def host_mismatch(ep, rank, world, what):
    """Processes disagree about a collective: a clear error on every process, no hang, and
    the next collective works."""
    from jax_r2ccl.transport.host_collectives import HostCollectives
    hc = HostCollectives(ep)
    n, dt, op, plan, algo, kind, perm = 1000, np.float32, "sum", "", "", "all_reduce", None
    if what == "perm":   # a permute: process 1 sends the other way round
        kind, perm = "permute", [(r + (1 if rank != 1 else -1)) % world for r in range(world)]
    if what == "bad_perm":   # every process asks for the same impossible permutation
        kind, perm = "permute", [0] * world
    if what == "plan":   # a large all-reduce: the planned path
        n, plan = 100_000, ("optimal" if rank == 1 else "balance")
    if what == "algo":   # process 1 runs direct, the others the ring
        n, algo = 100_000, ("direct" if rank == 1 else "ring")
    if rank == 1:
        if what == "size":
            n = 2000
        elif what == "dtype":
            dt = np.int32
        elif what == "op":
            op = "max"
    out = {}
    t0 = time.monotonic()
    try:
        hc.run(kind, [np.ones(n, dt)], process_of_rank=list(range(world)), my_ranks=[rank], op=op,
               timeout=5.0, plan=plan, algo=algo, perm=perm)
        out["error"] = None
    except R2cclError as e:
        out.update(error=str(e), cause=e.cause)
    out["seconds"] = time.monotonic() - t0
    try:   # (a setting the processes disagree on fails this one too: its cause instead)
        res = hc.run("all_reduce", [np.full(10, rank + 1, np.int64)], process_of_rank=list(range(world)),
                     my_ranks=[rank], timeout=5.0)
        out["after"] = res[0].tolist()
    except R2cclError as e:
        out["after"] = e.cause
    return out


def host_programs(ep, rank, world, same, delay=0.0, n=1000, timeout=20.0):
    """Each process runs "its program": with same=False, process r's collectives carry the
    tags of program "prog-r" (as processes that compiled different programs would); with
    same=True both run one program, process 1 starting `delay` s late. Returns the error (or
    None), its cause, the result and how long the call took."""
    from jax_r2ccl.transport.host_collectives import HostCollectives
    hc = HostCollectives(ep, name="prog" if same else f"prog-{rank}")
    if rank == 1 and delay:
        time.sleep(delay)
    out = {"error": None, "cause": None, "result": None}
    t0 = time.monotonic()
    try:
        res = hc.run("all_reduce", [np.full(n, rank + 1, np.float32)], process_of_rank=list(range(world)),
                     my_ranks=[rank], timeout=timeout)
        out["result"] = float(res[0][0]) if res[0].size and np.all(res[0] == res[0][0]) else "uneven"
    except R2cclError as e:
        out.update(error=str(e), cause=e.cause)
    out["seconds"] = time.monotonic() - t0
    return out


def host_latency(ep, rank, world, n=2, iters=300):
    """Median time of a tiny all-reduce through the host-level API (no JAX)."""
    from jax_r2ccl.transport.host_collectives import HostCollectives
    hc = HostCollectives(ep)
    x = [np.ones(n, np.float32)]
    ts = []
    for i in range(iters):
        t0 = time.perf_counter()
        hc.run("all_reduce", x, process_of_rank=list(range(world)), my_ranks=[rank])
        ts.append(time.perf_counter() - t0)
    barrier(ep, rank, world)
    return {"median_us": float(np.median(ts[20:]) * 1e6)}


def monitored_transfer(ep, rank, world, nbytes, iters, rate=None, steps=(), sample_s=0.05):
    """Rank 0 sends nbytes to rank 1 `iters` times with a health monitor running on both.

    rate: optional cap (bytes/s) on every rail of rank 0 (loopback as a slow network).
    steps: [(at_s, rank, action, arg)] run on that rank at that time after the first send:
    action "rate" (cap rail `arg[0]` at arg[1] bytes/s), "nic" (set_nic_state(arg[0], arg[1]))
    or "cmd" (a shell command: the test bed). Returns per-iteration times, #wrong, the
    monitor's events, a timeline of rail weights and bandwidths (rank 0), step times."""
    from jax_r2ccl.transport.health import HealthMonitor
    peer = 1 - rank
    mon = HealthMonitor(ep)
    if rate and rank == 0:
        for s in ep.rail_stats(peer):
            ep.inject(peer, s["rail"], "rate", rate)
    barrier(ep, rank, world)
    timeline, step_log = [], []
    stop = threading.Event()
    t_start = time.time()

    def sampler():
        while not stop.is_set():
            snap = mon.snapshot()
            timeline.append({"t": time.time() - t_start,
                             "rails": [{k: r[k] for k in ("rail", "state", "weight", "bandwidth_Bps", "tx_bytes")}
                                       for r in snap["peers"].get(peer, [])]})
            stop.wait(sample_s)

    def run_steps():
        for at, who, action, arg in steps:
            if who != rank:
                continue
            delay = t_start + at - time.time()
            if delay > 0 and stop.wait(delay):
                return
            t0 = time.time()
            if action == "rate":
                ep.inject(peer, arg[0], "rate", arg[1])
            elif action == "nic":
                ep.set_nic_state(arg[0], bool(arg[1]), "test")
            elif action == "cmd":
                subprocess.run(arg, shell=True, check=True, timeout=30)
            step_log.append({"action": action, "arg": arg, "t0": t0 - t_start, "t1": time.time() - t_start,
                             "t0_unix": t0, "t1_unix": time.time()})

    threads = [threading.Thread(target=sampler, daemon=True), threading.Thread(target=run_steps, daemon=True)]
    for t in threads:
        t.start()
    times, wrong = [], 0
    for it in range(iters):
        ref = pattern(nbytes, 11 + it)
        t0 = time.monotonic()
        if rank == 0:
            ep.send(1, ref, tag=500 + it)
        else:
            out = np.empty(nbytes, np.uint8)
            ep.recv(0, out, tag=500 + it)
            wrong += int(not np.array_equal(out, ref))
        times.append(time.monotonic() - t0)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    time.sleep(0.3)
    events = mon.events()
    stats = ep.rail_stats(peer)
    nics = mon.snapshot()["nics"]
    mon.close()
    barrier(ep, rank, world)
    return {"times": times, "wrong": wrong, "events": events, "timeline": timeline, "steps": step_log,
            "stats": stats, "nics": nics, "t_start_unix": t_start}


def metrics_scrape(ep, rank, world, nbytes=16 << 20):
    """A transfer with the monitor on, then rank 0 scrapes jax_r2ccl.metrics over loopback."""
    import urllib.request
    from jax_r2ccl.transport.health import HealthMonitor
    from jax_r2ccl.monitoring import metrics
    peer = 1 - rank
    mon = HealthMonitor(ep)
    ref = pattern(nbytes, 3)
    out = {}
    if rank == 0:
        seen = []
        sub = mon.on_event(seen.append)
        ep.send(1, ref, tag=7)
        ep.set_nic_state(1, False, "test")   # a NIC event so events and NIC metrics move
        ep.set_nic_state(1, True, "test")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(e["kind"] == "rail_recovered" for e in seen):
            time.sleep(0.02)
        sub.cancel()
        out["callback_events"] = [e["kind"] for e in seen]
        out["polled_events"] = [e["kind"] for e in mon.events()]
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        server, thread = metrics.serve(port, addr="127.0.0.1", monitor=mon)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                out["text"] = r.read().decode()
        finally:
            server.shutdown()
        out["health"] = mon.snapshot()
    else:
        buf = np.empty(nbytes, np.uint8)
        ep.recv(0, buf, tag=7)
        out["ok"] = bool(np.array_equal(buf, ref))
    mon.close()
    barrier(ep, rank, world)
    return out


def algos_bit_exact(ep, rank, world, capacities, cases, local=1, algos=("direct", "ring", "doubling", "auto")):
    """Every algorithm x plan x kind on the same inputs (this process's capacity is
    capacities[rank], so the plans differ): each output checked bit for bit against the
    canonical-order reference; the algorithm each all-reduce ran, and a digest of every output."""
    import hashlib
    import ml_dtypes  # noqa: F401
    from jax_r2ccl.transport.host_collectives import HostCollectives
    hc = HostCollectives(ep)
    hc.set_capacity(capacities[rank])
    process_of_rank = [p for p in range(world) for _ in range(local)]
    my_ranks = [r for r, p in enumerate(process_of_rank) if p == rank]
    n = len(process_of_rank)
    out = []
    for i, (kind, dtype, op, count) in enumerate(cases):
        ins = {r: _rank_input(kind, dtype, count, r, seed=i) for r in range(n)}
        for root in ([0, n - 1] if kind == "broadcast" else [0]):
            ref = host_reference(kind, op, [ins[r] for r in range(n)], process_of_rank, root)
            plans = ("balance", "optimal", "auto") if kind == "all_reduce" else ("",)
            for algo in algos:
                for plan in plans:
                    outs = hc.run(kind, [ins[r] for r in my_ranks], process_of_rank=process_of_rank,
                                  my_ranks=my_ranks, op=op, plan=plan, algo=algo, root=root)
                    lp = hc.last_plan()
                    out.append({"case": [kind, dtype, op, count, root], "algo": algo, "plan": plan,
                                "ran": [lp["algo"], lp["plan"]] if kind == "all_reduce" else None,
                                "shares": list(lp["shares"]) if kind == "all_reduce" else None,
                                "processes": list(lp["processes"]) if kind == "all_reduce" else None,
                                "exact": all(o.tobytes() == ref[r].tobytes() for r, o in zip(my_ranks, outs)),
                                "digest": hashlib.sha256(b"".join(o.tobytes() for o in outs)).hexdigest()})
    barrier(ep, rank, world)
    hc.close()
    return out


def repeated_all_reduces(ep, rank, world, algos, count=1_000_003, reps=4):
    """Back-to-back large all-reduces under each algorithm, each checked bit for bit (a
    process that finished early and went on found its partner's last round missing: the
    doubling op could finish before posting it)."""
    from jax_r2ccl.transport.host_collectives import HostCollectives
    hc = HostCollectives(ep)
    pr = list(range(world))
    ins = {r: _rank_input("all_reduce", "float32", count, r, seed=11) for r in pr}
    ref = host_reference("all_reduce", "sum", [ins[r] for r in pr], pr)[rank].tobytes()
    wrong = 0
    for algo in algos:
        for _ in range(reps):
            out = hc.run("all_reduce", [ins[rank]], process_of_rank=pr, my_ranks=[rank], algo=algo)
            wrong += int(out[0].tobytes() != ref)
    hc.close()
    return {"wrong": wrong, "calls": len(algos) * reps}


def ring_connections(ep, rank, world, count=300_007):
    """Connections on demand: which peers this process opened, and its rails up, after
    start-up, after each ring collective (checked bit for bit), and after an all-to-all
    (always direct: it opens every peer)."""
    import ml_dtypes  # noqa: F401
    from jax_r2ccl.transport.host_collectives import HostCollectives

    def rails_up():
        return sum(s["state"] == "up" for p in range(world) if p != rank for s in ep.rail_stats(p))
    seen = [{"when": "start", "opened": ep.opened_peers(), "rails_up": rails_up()}]
    hc = HostCollectives(ep)
    pr = list(range(world))
    hc.run("all_reduce", [np.zeros(1, np.int32)], process_of_rank=pr, my_ranks=[rank], algo="ring")
    bad = []
    algos = []
    for i, kind in enumerate(("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_reduce", "all_to_all")):
        n = count - count % world if kind in ("reduce_scatter", "all_to_all") else (1000 if i == 4 else count)
        ins = [_rank_input(kind, "float32", n, r, seed=i) for r in range(world)]
        root = world - 1
        serial = hc.last_plan()["serial"]
        out = hc.run(kind, [ins[rank]], process_of_rank=pr, my_ranks=[rank], root=root)
        ref = host_reference(kind, "sum", ins, pr, root)
        if out[0].tobytes() != ref[rank].tobytes():
            bad.append(kind)
        if kind == "all_reduce":   # (a small direct all-reduce records nothing: None)
            lp = hc.last_plan()
            algos.append(lp["algo"] if lp["serial"] != serial else None)
        # Fences (tiny ring all-reduces): every process has finished this step before any
        # looks, and has looked before any goes on (a process ahead may open a connection here).
        fence = [np.zeros(1, np.int32)]
        hc.run("all_reduce", fence, process_of_rank=pr, my_ranks=[rank], algo="ring")
        seen.append({"when": kind, "opened": ep.opened_peers(), "rails_up": rails_up()})
        hc.run("all_reduce", fence, process_of_rank=pr, my_ranks=[rank], algo="ring")
    hc.close()
    barrier(ep, rank, world)
    return {"seen": seen, "bad": bad, "algos": algos, "rails_per_peer": len(ep.rail_stats((rank + 1) % world))}


def two_level_connections(ep, rank, world, count=1_000_003, rounds=3):
    """The peers this process opened at start-up and after large all-reduces under auto past
    R2CCL_MAX_PEERS (two_level), each checked bit for bit."""
    from jax_r2ccl.transport.host_collectives import HostCollectives
    seen = {"start": ep.opened_peers()}
    hc = HostCollectives(ep)
    pr = list(range(world))
    bad, algos = [], []
    for i in range(rounds):
        ins = [_rank_input("all_reduce", "float32", count, r, seed=i) for r in pr]
        out = hc.run("all_reduce", [ins[rank]], process_of_rank=pr, my_ranks=[rank])
        bad += [i] if out[0].tobytes() != host_reference("all_reduce", "sum", ins, pr)[rank].tobytes() else []
        algos.append(hc.last_plan()["algo"])
    seen["after"] = ep.opened_peers()
    hc.close()
    return {"seen": seen, "bad": bad, "algos": algos}


def plans_bit_exact(ep, rank, world, capacities, cases, local=1):
    """Every all-reduce plan on the same inputs with this process's capacity set to
    capacities[rank]: each output checked bit for bit against the canonical-order reference,
    and the plan each call ran with recorded (a digest of each output too)."""
    import hashlib
    import ml_dtypes  # noqa: F401
    from jax_r2ccl.transport.host_collectives import HostCollectives
    hc = HostCollectives(ep)
    hc.set_capacity(capacities[rank])
    process_of_rank = [p for p in range(world) for _ in range(local)]
    my_ranks = [r for r, p in enumerate(process_of_rank) if p == rank]
    out = []
    for i, (dtype, op, count) in enumerate(cases):
        ins = {r: _rank_input("all_reduce", dtype, count, r, seed=i) for r in range(len(process_of_rank))}
        ref = host_reference("all_reduce", op, [ins[r] for r in range(len(process_of_rank))], process_of_rank)
        for plan in ("balance", "r2cc", "weighted", "optimal", "auto"):
            outs = hc.run("all_reduce", [ins[r] for r in my_ranks], process_of_rank=process_of_rank,
                          my_ranks=my_ranks, op=op, plan=plan)
            exact = all(o.tobytes() == ref[r].tobytes() for r, o in zip(my_ranks, outs))
            lp = hc.last_plan()
            out.append({"case": [dtype, op, count], "plan": plan, "ran": lp["plan"], "shares": lp["shares"],
                        "capacities": lp["capacities"], "exact": exact,
                        "digest": hashlib.sha256(b"".join(o.tobytes() for o in outs)).hexdigest()})
    barrier(ep, rank, world)
    hc.close()
    return out


class _MonitoredAllReduce:
    """The set-up the loop workers share: the health monitor feeding the planner (as
    jax_r2ccl.initialize() runs it), one float32 all-reduce input per process and its
    canonical reference; loop() runs it `iters` times, every output checked bit for bit,
    while rank 0 runs fault_cmd fault_after_s in."""

    def __init__(self, ep, rank, world, count, seed):
        from jax_r2ccl.transport.health import HealthMonitor
        from jax_r2ccl.transport.host_collectives import HostCollectives
        self.rank = rank
        self.mon = HealthMonitor(ep)
        self.hc = HostCollectives(ep)
        self.hc.set_capacity(self.mon)
        self.pr = list(range(world))
        ins = {r: _rank_input("all_reduce", "float32", count, r, seed=seed) for r in self.pr}
        self.mine = ins[rank]
        self.ref = host_reference("all_reduce", "sum", [ins[r] for r in self.pr], self.pr)[rank].tobytes()

    def loop(self, iters, fault_cmd, fault_after_s, after_each):
        """Returns (wrong, times); after_each() runs after every call (to record its plan)."""
        timer = None
        if fault_cmd and self.rank == 0:
            timer = threading.Timer(fault_after_s, lambda: subprocess.run(fault_cmd, shell=True, check=True, timeout=30))
            timer.start()
        wrong, times = 0, []
        for _ in range(iters):
            t0 = time.monotonic()
            out = self.hc.run("all_reduce", [self.mine], process_of_rank=self.pr, my_ranks=[self.rank])
            times.append(time.monotonic() - t0)
            wrong += int(out[0].tobytes() != self.ref)
            after_each()
        if timer:
            timer.join()
        return wrong, times

    def stop_monitor(self):
        self.hc.set_capacity(None)
        self.mon.close()


def ring_scale_loop(ep, rank, world, count, iters, fault_cmd=None, fault_after_s=1.0, victim=-1, fence_algo="ring"):
    """A job that scales: the peers this process opened and its rails up after start-up and
    after an all-reduce loop (the health monitor running, as jax_r2ccl.initialize() runs it);
    rank 0 runs fault_cmd mid-loop. Every output checked bit for bit. No barrier: that would
    talk to every process; tiny all-reduces under `fence_algo` (the loop's peers) fence the
    looks instead."""
    def rails_up():
        return sum(s["state"] == "up" for p in range(world) if p != rank for s in ep.rail_stats(p))
    start = {"opened": ep.opened_peers(), "rails_up": rails_up()}
    job = _MonitoredAllReduce(ep, rank, world, count, seed=7)
    hc, pr = job.hc, job.pr
    fence = [np.zeros(1, np.int32)]
    hc.run("all_reduce", fence, process_of_rank=pr, my_ranks=[rank], algo=fence_algo)
    algos = set()
    wrong, times = job.loop(iters, fault_cmd, fault_after_s, lambda: algos.add(hc.last_plan()["algo"]))
    hc.run("all_reduce", fence, process_of_rank=pr, my_ranks=[rank], algo=fence_algo)
    end = {"opened": ep.opened_peers(), "rails_up": rails_up()}
    failures = sum(s["failures"] for p in range(world) if p != rank for s in ep.rail_stats(p))
    hc.run("all_reduce", fence, process_of_rank=pr, my_ranks=[rank], algo=fence_algo)
    job.stop_monitor()
    hc.close()
    return {"wrong": wrong, "times": times, "algos": sorted(algos), "start": start, "end": end,
            "rails_per_peer": len(ep.rail_stats((rank + 1) % world)), "rail_failures": failures}


def replan_loop(ep, rank, world, count, iters, fault_cmd=None, fault_after_s=1.0):
    """All-reduces in a loop with the health monitor feeding the planner (R2CCL_PLAN=auto);
    rank 0 runs fault_cmd mid-loop. Every output checked bit for bit; the plan of every
    call recorded."""
    job = _MonitoredAllReduce(ep, rank, world, count, seed=5)
    barrier(ep, rank, world)
    plans = []

    def record():
        lp = job.hc.last_plan()
        plans.append({"plan": lp["plan"], "shares": lp["shares"], "capacities": lp["capacities"]})
    wrong, times = job.loop(iters, fault_cmd, fault_after_s, record)
    job.stop_monitor()
    barrier(ep, rank, world)
    job.hc.close()
    return {"wrong": wrong, "plans": plans, "times": times}


def host_kind_mismatch(ep, rank, world, n=99_999, other="reduce_scatter", late=None):
    """Collectives of different kinds on different processes (all-reduce here, `other`
    there): the signature comparison names both, on every process.
    late: {"rank": r, "s": seconds}: that rank enters the call so much later (the others may
    have found the mismatch, failed and closed by then)."""
    from jax_r2ccl.transport.host_collectives import HostCollectives
    hc = HostCollectives(ep)
    kind = "all_reduce" if rank == 0 else other
    out = {}
    if late and late["rank"] == rank:
        time.sleep(late["s"])
    t0 = time.monotonic()
    try:
        hc.run(kind, [np.ones(n, np.float32)], process_of_rank=list(range(world)), my_ranks=[rank], timeout=10.0)
        out["error"] = None
    except R2cclError as e:
        out.update(error=str(e), cause=e.cause)
    out["after_s"] = time.monotonic() - t0
    return out


def staged_collective(ep, rank, world, cases, local=1, chunk_bytes=4096, pool_bytes=1 << 20, depth=3, fault=None,
                      rate=None, fail_copy=None, repeat=1, device_fold=True, small=True, reserve=0, register=True):
    """The platform-neutral chunk pipeline (csrc/stage) that the CUDA platform runs, with
    memcpy standing in for the copy engine: each local rank on its own thread hands its part
    to the process's runtime through _core.testing_staged_call, like a GPU's launch thread.
    Every output is checked bit for bit against the canonical-order reference.

    fail_copy: {"case": i, "rank": r, "batch": b} makes that local rank's copy batch b fail.
    small: calls that fit the pool's small area take the small path (one read with the group
    and rank, no pipeline), as the CUDA handler does; a list gives it per process.
    reserve: slots each pool allocates before the first call (the GPU's pool reserves 3).
    register: the pools' buffers are registered with the endpoint, as on a GPU (False: the
    copy path, the baseline of the zero-copy rows).
    Returns the mismatches, every call's error, chunk counts, which calls took the small path
    and the pools' statistics."""
    import ml_dtypes  # noqa: F401
    from jax_r2ccl import _core
    from jax_r2ccl.errors import R2cclError
    process_of_rank = [p for p in range(world) for _ in range(local)]
    my_ranks = [r for r, p in enumerate(process_of_rank) if p == rank]
    ex = _core.Collectives(ep._ep, rank)
    _core.runtime_install(ep._ep, ex, rank, float(ep.config.timeout_s))
    comm_id = 77
    _core.register_comm(comm_id, [process_of_rank], "staged test")
    pools = {r: _core.StagingPool(pool_bytes, chunk_bytes) for r in my_ranks}
    for p in pools.values():
        p.reserve(reserve)
    my_small = small[rank] if isinstance(small, list) else small
    if rate:
        for peer in range(world):
            if peer != rank:
                for s in ep.rail_stats(peer):
                    ep.inject(peer, s["rail"], "rate", rate)
    bad, errors, chunks, allocations, folded, smalls = [], [], [], [], [], []
    first = None
    timer = None
    try:
        for rep in range(repeat):
            for i, (kind, dtype, op, count, root) in enumerate(cases):
                if fault and i == fault["case"] and rank == 0 and rep == 0:
                    timer = threading.Timer(fault["after_s"], lambda: ep.inject(fault.get("peer", 1), fault["rail"], fault["fault"]))
                    timer.start()
                ins = {r: _rank_input(kind, dtype, count, r, seed=i) for r in range(len(process_of_rank))}
                n = len(process_of_rank)
                out_count = {"all_gather": count * n, "reduce_scatter": count // n}.get(kind, count)
                outs = {r: np.zeros(out_count, ins[r].dtype) for r in my_ranks}
                res, errs = {}, {}

                def one(r):
                    fb = -1
                    if fail_copy and fail_copy["case"] == i and fail_copy["rank"] == r and rep == 0:
                        fb = fail_copy["batch"]
                    try:
                        res[r] = _core.testing_staged_call(
                            comm_id, 0, r, 1000 + rep, i + 1, kind, np.dtype(dtype).name, op, root,
                            ins[r].view(np.uint8), outs[r].view(np.uint8), pools[r], chunk_bytes, depth, fb,
                            float(ep.config.timeout_s), device_fold, my_small, register)
                    except R2cclError as e:
                        errs[r] = {"error": str(e), "cause": e.cause, "peer": e.peer}

                ts = [threading.Thread(target=one, args=(r,)) for r in my_ranks]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join(120)
                if any(t.is_alive() for t in ts):
                    raise RuntimeError(f"case {i}: a staged call is still running after 120 s")
                if errs:
                    errors.append({"case": i, "rep": rep, "errors": errs})
                    continue
                chunks.append(res[my_ranks[0]]["chunks"])
                smalls.append(all(res[r]["small"] for r in my_ranks))
                folded.append([kind, all(res[r]["device_fold"] for r in my_ranks)])
                ref = host_reference(kind, op, [ins[r] for r in range(n)], process_of_rank, root)
                for r in my_ranks:
                    o, want = outs[r], ref[r]
                    if o.tobytes() != want.tobytes():
                        diff = int(np.count_nonzero(o.view(np.uint8) != want.view(np.uint8)))
                        bad.append({"case": [kind, dtype, op, count, root], "rank": r, "bytes_differing": diff})
            allocations.append({r: pools[r].stats()["allocations"] for r in my_ranks})
            if rep == 0:   # the rails' counters after the first round (its set-up and warm-up)
                first = {p: _stats_summary(ep, p) for p in range(world) if p != rank}
        if timer:
            timer.join()
        stats = {p: _stats_summary(ep, p) for p in range(world) if p != rank}
        barrier(ep, rank, world)
    finally:
        _core.runtime_uninstall()
        ex.close()
    return {"bad": bad, "errors": errors, "chunks": chunks, "allocations": allocations, "folded": folded, "small": smalls,
            "pools": {r: pools[r].stats() for r in my_ranks}, "stats": stats, "stats_after_first": first}


def caller_path_order(ep, rank, world, rounds=200):
    """Small sends (the caller's path) and large ones (the engine thread's) on one tag from one
    thread, interleaved: they arrive in the order sent, each bit-exact. Small ones are posted
    right behind large ones still queued for the engine thread, so one would overtake the
    other if the caller's path ignored the queue."""
    peer = 1 - rank
    sizes = [(100 if i % 3 else 1 << 20) if i % 2 else 4096 for i in range(rounds)]
    if rank == 0:
        reqs = [ep.isend(peer, pattern(n, 1000 + i), tag=5) for i, n in enumerate(sizes)]
        for r in reqs:
            r.wait()
        barrier(ep, rank, world)
        return {}
    wrong = []
    for i, n in enumerate(sizes):
        buf = np.empty(n, np.uint8)
        try:
            ep.recv(peer, buf, tag=5)
        except R2cclError as e:
            wrong.append([i, n, f"{e.cause}: {e}"])
            break
        if not np.array_equal(buf, pattern(n, 1000 + i)):
            wrong.append([i, n, "content"])
    barrier(ep, rank, world)
    return {"wrong": wrong, "n": len(sizes)}


def caller_path_threads(ep, rank, world, threads=4, rounds=300):
    """Several threads of one process ping-pong small messages at once, each on its own tag:
    they share the engine's work between them and the engine thread (run_mu_). Every
    message arrives once, bit-exact, and none waits past its timeout."""
    import threading
    peer = 1 - rank
    errors, counts = [], [0] * threads

    def run(k):
        try:
            for i in range(rounds):
                n = 1 + (i * 977 + k * 131) % 8192
                out, back = pattern(n, 7 * k + i), np.empty(n, np.uint8)
                if rank == 0:
                    ep.send(peer, out, tag=100 + k, timeout=20)
                    ep.recv(peer, back, tag=100 + k, timeout=20)
                else:
                    ep.recv(peer, back, tag=100 + k, timeout=20)
                    ep.send(peer, back, tag=100 + k, timeout=20)
                if rank == 0 and not np.array_equal(back, out):
                    errors.append([k, i, "content"])
                    return
                counts[k] += 1
        except R2cclError as e:
            errors.append([k, -1, f"{e.cause}: {e}"])

    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    barrier(ep, rank, world)
    return {"errors": errors, "counts": counts, "alive": sum(t.is_alive() for t in ts)}


def eager_sends(ep, rank, world, n=48, size=4096, big=1 << 20, stall_s=0.15, eager=True):
    """Small sends complete when copied (R2CCL_EAGER_BYTES): while every rail is stalled a
    small send finishes and its buffer is reused at once, a large one waits for its acks;
    the receiver gets exactly the bytes sent. Then small sends and an immediate close: they
    are still delivered. eager=False (R2CCL_EAGER_BYTES=0): a small send waits for its acks."""
    peer = 1 - rank
    out = {}
    if not eager:
        n = 4
    if rank == 0:
        rails = [s["rail"] for s in ep.rail_stats(peer)]
        for r in rails:
            ep.inject(peer, r, "stall")
        t0 = time.monotonic()
        buf = np.empty(size, np.uint8)
        finished, pending = 0, []
        for i in range(n):
            if eager:
                buf[:] = pattern(size, 100 + i)
                ep.isend(peer, buf, tag=5).wait(timeout=stall_s / 2)
                finished += 1
                buf[:] = 0xA5   # the caller reuses its buffer: what was sent must be the copy
            else:
                pending.append(ep.isend(peer, pattern(size, 100 + i), tag=5))
        large = ep.isend(peer, pattern(big, 7), tag=6)
        while time.monotonic() - t0 < stall_s:
            time.sleep(0.01)
        out["small_finished_while_stalled"] = finished + sum(bool(r.done()) for r in pending)
        out["large_done_while_stalled"] = bool(large.done())
        for r in rails:
            ep.inject(peer, r, "heal")
        for r in pending:
            r.wait()
        large.wait()
        barrier(ep, rank, world)
        for r in rails if eager else []:   # 1 MB/s in all: most is still queued at the close
            ep.inject(peer, r, "rate", 250e3)
        for i in range(n):
            buf[:] = pattern(size, 200 + i)
            ep.isend(peer, buf, tag=7).wait(timeout=stall_s)
            buf[:] = 0x5A
        return out   # and rank_main closes the endpoint at once
    got = np.empty(size, np.uint8)
    wrong = []
    for i in range(n):
        ep.recv(peer, got, tag=5)
        if not np.array_equal(got, pattern(size, 100 + i)):
            wrong.append(["stalled", i])
    large = np.empty(big, np.uint8)
    ep.recv(peer, large, tag=6)
    out["large_exact"] = bool(np.array_equal(large, pattern(big, 7)))
    barrier(ep, rank, world)
    time.sleep(0.5)   # the sender has closed by now: the messages wait here, whole
    for i in range(n):
        ep.recv(peer, got, tag=7)
        if not np.array_equal(got, pattern(size, 200 + i)):
            wrong.append(["closed", i])
    out["wrong"] = wrong
    return out


def eager_undeliverable(ep, rank, world, size=4096, down_s=2.0):
    """An eager send whose every rail stays down past R2CCL_TIMEOUT: the next operation with
    that peer fails saying so; once rails are back the receiver learns the message was
    abandoned, and the channel goes on."""
    peer = 1 - rank
    out = {}
    if rank == 0:
        rails = [s["rail"] for s in ep.rail_stats(peer)]
        for r in rails:
            ep.inject(peer, r, "close")
        ep.isend(peer, pattern(size, 1), tag=1).wait(timeout=1.0)   # eager: finished when copied
        time.sleep(down_s)
        try:
            ep.send(peer, pattern(size, 2), tag=2, timeout=5)
            out["next"] = None
        except R2cclError as e:
            out["next"] = [e.cause, e.peer, str(e)]
        for r in rails:
            ep.inject(peer, r, "heal")
        ep.send(peer, pattern(1 << 16, 3), tag=3, timeout=10)
    else:
        time.sleep(down_s + 1.0)
        out.update(_abandoned_then_ok(ep, peer, size, 1, 1 << 16, 3, 3))
    # (R2CCL_TIMEOUT is 1 s here, for the fault; the ranks may part by more on a loaded machine)
    barrier(ep, rank, world, timeout=30)
    return out


def carrier_failback(ep, rank, world, cut_cmd, heal_cmd, rail=1, nbytes=8 << 20, down_wait_s=10.0, up_wait_s=20.0):
    """Rank 0 has a NIC's carrier cut from outside (cut_cmd), waits for its rail to go down,
    has it healed (heal_cmd), and measures how soon the rail is up again (a new connection:
    on verbs, new queue pairs) and that it carries a transfer, checked byte for byte on rank 1."""
    peer = 1 - rank
    res = {}
    if rank == 0:
        subprocess.run(cut_cmd, shell=True, check=True, timeout=30)
        t0 = time.monotonic()
        while ep.rail_stats(peer)[rail]["state"] == "up":
            if time.monotonic() - t0 > down_wait_s:
                raise AssertionError(f"rail {rail} still up {down_wait_s} s after its NIC was cut")
            time.sleep(0.005)
        res["down_after_s"] = time.monotonic() - t0
        time.sleep(0.5)
        subprocess.run(heal_cmd, shell=True, check=True, timeout=30)
        t1 = time.monotonic()
        while ep.rail_stats(peer)[rail]["state"] != "up":
            if time.monotonic() - t1 > up_wait_s:
                raise AssertionError(f"rail {rail} not re-admitted {up_wait_s} s after its NIC was healed")
            time.sleep(0.005)
        res["up_after_s"] = time.monotonic() - t1
        before = ep.rail_stats(peer)[rail]["tx_bytes"]
        ep.send(peer, pattern(nbytes, 9), tag=7, timeout=60)
        res["carried"] = ep.rail_stats(peer)[rail]["tx_bytes"] - before
        res["stats"] = _stats_summary(ep, peer)
    else:
        out = np.empty(nbytes, np.uint8)
        ep.recv(peer, out, tag=7, timeout=60)
        res["ok"] = bool(np.array_equal(out, pattern(nbytes, 9)))
    barrier(ep, rank, world)
    return res


def _rss_fds():
    """(resident bytes, open descriptors) of this process."""
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return rss, len(os.listdir("/proc/self/fd"))


def stranger_storm(ep, rank, world, nbytes=4 << 20, steps=25, phases=4, rate=40e6, half_open=200, settle_s=3.0):
    """Steps of a job (rank 0 sends `nbytes` to rank 1, which answers with one byte; every rail
    capped at `rate`, so a step is set by the links, as on a real network, not by this
    machine's two cores) in `phases` phases of `steps` steps: quiet, storm, quiet, storm...
    During a storm a stranger process (tests/stranger.py) hammers rank 1's listeners. Rank 0
    times the steps; rank 1 checks every byte, and its memory and descriptors before the
    first storm and `settle_s` after the last one (the listener has dropped every stranger)."""
    import json
    import sys
    peer = 1 - rank
    for s in ep.rail_stats(peer):
        ep.inject(peer, s["rail"], "rate", rate)
    data = pattern(nbytes, 5)
    one = np.ones(1, np.uint8)
    times = []
    wrong = 0
    stranger = None
    before = after = None
    counts = {}
    buf = np.empty(nbytes, np.uint8)
    for phase in range(phases):
        storm = phase % 2 == 1
        if rank == 1:
            if storm:
                here = os.path.dirname(os.path.abspath(__file__))
                if before is None:
                    before = _rss_fds()
                stranger = subprocess.Popen([sys.executable, os.path.join(here, "stranger.py"), "--seconds", "120",
                                             "--half-open", str(half_open), *ep.addresses], stdout=subprocess.PIPE,
                                            text=True)
                time.sleep(0.5)   # the storm is on before the phase's first step
            elif stranger is not None:
                stranger.terminate()
                out, _ = stranger.communicate(timeout=30)
                for k, v in json.loads(out.strip().splitlines()[-1]).items():
                    counts[k] = counts.get(k, 0) + v
                stranger = None
        barrier(ep, rank, world)
        for _ in range(steps):
            if rank == 0:
                t0 = time.monotonic()
                ep.send(peer, data, tag=3)
                ep.recv(peer, np.empty(1, np.uint8), tag=4)
                times.append((phase, time.monotonic() - t0))
            else:
                ep.recv(peer, buf, tag=3)
                wrong += int(not np.array_equal(buf, data))
                ep.send(peer, one, tag=4)
    if rank == 1:
        if stranger is not None:
            stranger.terminate()
            out, _ = stranger.communicate(timeout=30)
            for k, v in json.loads(out.strip().splitlines()[-1]).items():
                counts[k] = counts.get(k, 0) + v
        time.sleep(settle_s)
        after = _rss_fds()
    barrier(ep, rank, world)
    return {"times": times, "wrong": wrong, "before": before, "after": after, "stranger": counts}


def many_collectives(ep, rank, world, n=100_000, samples=20, seed=3):
    """`n` host collectives of mixed kinds and sizes (mostly small, now and then 256 KiB), each
    checked against its reference now and then; (count, RSS, descriptors) sampled `samples`
    times. Leaks show as growth after the warm-up."""
    from jax_r2ccl.transport.host_collectives import HostCollectives
    hc = HostCollectives(ep)
    rng = np.random.default_rng(seed)   # the same sequence on every process
    kinds = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
    sizes = [1, 4, 64, 1000, 4096, 16384, 65536]
    process_of_rank = list(range(world))
    trace = []
    bad = 0
    t0 = time.monotonic()
    for i in range(n):
        kind = kinds[int(rng.integers(len(kinds)))]
        count = sizes[int(rng.integers(len(sizes)))] * world if rng.random() < 0.999 else (256 << 10) // 4 * world
        x = np.full(count, rank + 1 + (i % 7), np.float32)
        out = hc.run(kind, [x], process_of_rank=process_of_rank, my_ranks=[rank], op="sum")[0]
        if i % 97 == 0:
            ins = [np.full(count, r + 1 + (i % 7), np.float32) for r in range(world)]
            want = host_reference(kind, "sum", ins, process_of_rank)[rank]
            bad += int(out.tobytes() != want.tobytes())
        if i % (n // samples) == 0 or i == n - 1:
            trace.append((i + 1, *_rss_fds()))
    seconds = time.monotonic() - t0
    barrier(ep, rank, world)
    hc.close()
    return {"trace": trace, "bad": bad, "seconds": seconds}


def threads_in_flight(ep, rank, world, n=1000, count=64):
    """`n` small all-reduces issued at once from `n` threads (each names its call, so the
    processes may issue them in different orders), on one executor: each result checked;
    the most the executor held in flight at once."""
    from jax_r2ccl.transport.host_collectives import HostCollectives
    hc = HostCollectives(ep)
    order = list(range(n))
    if rank % 2:
        order.reverse()   # the other process issues them in the opposite order
    results, errors = {}, []
    go = threading.Event()

    def one(i):
        go.wait()
        try:
            x = np.full(count, rank + i, np.int64)
            results[i] = hc.run("all_reduce", [x], process_of_rank=list(range(world)), my_ranks=[rank], key=f"c{i}")[0]
        except Exception as e:  # noqa: BLE001 - reported to the test
            errors.append(f"{i}: {e}")
    threads = [threading.Thread(target=one, args=(i,)) for i in order]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    go.set()
    for t in threads:
        t.join(timeout=120)
    seconds = time.monotonic() - t0
    bad = [i for i in range(n) if i not in results or not np.array_equal(results[i], np.full(
        count, sum(r + i for r in range(world)), np.int64))]
    peak = hc._ex.peak_in_flight()
    barrier(ep, rank, world)
    hc.close()
    return {"bad": bad[:10], "n_bad": len(bad), "errors": errors[:5], "peak": peak, "seconds": seconds}
