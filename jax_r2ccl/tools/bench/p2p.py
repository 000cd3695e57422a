"""`python -m jax_r2ccl bench p2p`: point-to-point bandwidth of the multi-rail transport,
rank 2k -> 2k+1, every byte checked, with baselines (one rail; MPTCP over the same hosts)
and an optional fault injected mid-transfer. See BENCHMARKS.md for the test-bed numbers."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

import numpy as np

from ..launch import coordinator_port
from .common import (Column, Dist, FaultTrigger, add_common_args, cpu_seconds, format_size, format_table,
                     median, nic_ipv4, per_gb, stall_count, thread_cpu, thread_cpu_delta, write_json)

IPPROTO_MPTCP = 262
SOL_MPTCP = 284
MPTCP_INFO = 1
TAG_DATA, TAG_READY, TAG_GO = 1, 2, 3
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def add_args(p: argparse.ArgumentParser) -> None:
    add_common_args(p)
    p.add_argument("--no-baselines", action="store_true",
                   help="only the multi-rail transport (skip r2ccl-1rail and mptcp)")
    p.add_argument("--thread-baseline", action="store_true",
                   help="also run r2ccl-thread: the same rails with R2CCL_POLL_US=0, so every request "
                        "goes through the progress thread (no caller's path)")
    p.add_argument("--poll-baseline", action="store_true",
                   help="also run mptcp-poll: the MPTCP baseline with every receive busy-polling its "
                        "socket for up to R2CCL_POLL_US before it blocks, as r2ccl's caller's path does "
                        "(the same CPU spent waiting, so the two compare like for like)")
    p.add_argument("--transports", default="", metavar="T[,T...]",
                   help="also run jax_r2ccl with each of these R2CCL_TRANSPORT values (socket, ibverbs), "
                        "rows r2ccl-<T>, on the same NICs in the same run: verbs beside sockets")
    p.add_argument("--zero-copy", action="store_true",
                   help="also run each --transports row with its buffers registered (Endpoint.register_memory): "
                        "rows r2ccl-<T>-zc, where verbs moves data by one-sided writes with no copy")
    p.add_argument("--io-threads", default="", metavar="N[,N...]",
                   help="also run r2ccl over the same rails with R2CCL_IO_THREADS=N for each N given "
                        "(impl r2ccl-ioN): socket I/O threads side by side in one run")
    p.add_argument("--baseline", action="append", default=[], choices=("iperf3", "tcp-threads"),
                   help="iperf3: also run iperf3 over the same NICs, one stream per NIC ('iperf3') and one "
                        "stream on the first NIC ('iperf3-1'), each iteration SIZE bytes in all, with its "
                        "own client and server processes (the CPU-bound comparison: unshaped rails). "
                        "tcp-threads: plain TCP, one connection and one thread per NIC on each end, moving "
                        "the same buffers as r2ccl (cold source, destination in place, checked)")
    p.add_argument("--mptcp-port", type=int, default=0, metavar="P",
                   help="MPTCP server port on the receiver (pair k uses P+k); 0: any free port")
    p.add_argument("--fault-at", type=float, default=None, metavar="SECONDS",
                   help="process 0 fires the fault this long after the first timed iteration of "
                        "the largest size starts (r2ccl only)")
    p.add_argument("--fault-cmd", default=None, metavar="CMD",
                   help="shell command process 0 runs at --fault-at (e.g. jax-r2ccl testbed fail 1 2)")
    p.add_argument("--inject-rail", type=int, default=None, metavar="R",
                   help="at --fault-at, inject a software fault on rail R of process 0's endpoint")
    p.add_argument("--inject", default=None, choices=("close", "stall", "rate"),
                   help="the software fault for --inject-rail")
    p.add_argument("--inject-rate", type=float, default=0.0, metavar="BYTES_PER_S",
                   help="rate for --inject rate")
    p.add_argument("--inject-heal-after", type=float, default=None, metavar="S",
                   help="heal the injected fault this many seconds after it fired")
    p.add_argument("--print-iters", action="store_true",
                   help="also print every timed iteration (always on with a fault)")
    p.add_argument("--prefix", default="bench-p2p",
                   help="bootstrap key prefix (distinct per run sharing a coordinator)")


# ---------------------------------------------------------------- data pattern


class Pattern:
    """A message-sized byte pattern that depends on (size, message number): 64-bit words
    arange*golden XOR a per-message seed whose bytes all change from one message to the
    next, so a chunk in the wrong place or from another message cannot go unnoticed."""

    def __init__(self, size: int):
        self.size = size
        self.words = (size + 7) // 8
        self.base = np.arange(self.words, dtype=np.uint64) * _GOLDEN

    def seed(self, msg: int) -> np.uint64:
        b = (2 * msg + 1 + (self.size * 131) % 251) & 0xFF
        return np.uint64(b * 0x0101010101010101)

    def buffer(self) -> np.ndarray:
        return np.empty(self.words, dtype=np.uint64)

    def fill(self, out: np.ndarray, msg: int) -> None:
        np.bitwise_xor(self.base, self.seed(msg), out=out)

    def view(self, words: np.ndarray) -> np.ndarray:
        """The message's bytes (the buffer may hold up to 7 bytes more)."""
        return words.view(np.uint8)[: self.size]


# ---------------------------------------------------------------- roles


def pair_of(rank: int, world: int) -> tuple[str, int, int]:
    """('send', peer, pair index), ('recv', peer, pair index) or ('idle', -1, -1)."""
    if rank % 2 == 0 and rank + 1 < world:
        return "send", rank + 1, rank // 2
    if rank % 2 == 1:
        return "recv", rank - 1, rank // 2
    return "idle", -1, -1


class Runner:
    def __init__(self, args, dist: Dist, nics: list[str]):
        self.args, self.dist, self.nics = args, dist, nics
        self.role, self.peer, self.pair = pair_of(dist.rank, dist.world)
        self.results: list[dict] = []
        self.iterations: list[dict] = []
        self.send_times: dict[str, float] = {}   # sender: "impl/size/iter" -> us until its send completed
        self.send_cpu: dict[str, list] = {}      # sender: "impl/size" -> [user s, system s, bytes] while timed
        self.send_copies: dict[str, float] = {}  # sender: "impl/size" -> payload bytes its transport copied per byte sent
        self.thread_cpu: dict[str, dict] = {}    # "impl/size" -> wall s and CPU s by thread role while timed
        self.rail_stats: dict[str, Any] = {}
        self.notes: list[str] = []
        self.errors: list[str] = []
        self.fault: FaultTrigger | None = None
        self.msg = 0           # message counter: every message has its own pattern

    # ---- one implementation, as callables. Per iteration, untimed: the sender says "ready"
    # once its previous send has completed (sender_sync, which then waits for "go") and the
    # receiver waits for it (receiver_sync). Timed on the receiver: recv(data) posts the
    # receive, says "go" and waits for every byte.

    def run_impl(self, impl: str, send, recv, sender_sync, receiver_sync, rails_fn, arm_fault: bool,
                 per_iter_rails=None, copied_fn=None, register_fn=None, deregister_fn=None) -> None:
        """copied_fn (r2ccl only): () -> (tx, rx) payload bytes the transport copied on the CPU so far
        (RailStats tx_copied_bytes / rx_copied_bytes), for each row's copies per byte.
        register_fn: registers each size's buffer (r2ccl-<T>-zc rows; deregister_fn after it)."""
        a = self.args
        largest = max(a.sizes)
        for size in a.sizes:
            pat = Pattern(size)
            if self.role == "send":
                buf = pat.buffer()
                data = pat.view(buf)
            else:
                buf, expect = pat.buffer(), pat.buffer()
                data, expect_b = pat.view(buf), pat.view(expect)
            reg_id = register_fn(buf) if register_fn and size > 0 else None
            times, wrong, failed = [], 0, None
            cpu = [0.0, 0.0]    # this process's CPU (all threads) during the timed transfers
            rails_before = rails_fn() if (rails_fn and self.role == "recv") else None
            copied_before = copied_fn() if copied_fn else None
            moved = 0           # message bytes this size moved (warm-up included: it takes the same path)
            for it in range(a.warmup + a.iters):
                timed = it >= a.warmup
                msg = self.msg
                self.msg += 1
                try:
                    if self.role == "send":
                        pat.fill(buf, msg)
                        sender_sync()
                        if arm_fault and self.fault and timed and size == largest and it == a.warmup:
                            self.fault.arm()
                        th0 = thread_cpu() if timed else None
                        c0 = cpu_seconds()
                        t0 = time.perf_counter()
                        send(data)
                        moved += size
                        if timed:
                            self.send_times[f"{impl}/{size}/{it - a.warmup}"] = (time.perf_counter() - t0) * 1e6
                            c1 = cpu_seconds()
                            self._add_thread_cpu(impl, size, th0, time.perf_counter() - t0)
                            acc = self.send_cpu.setdefault(f"{impl}/{size}", [0.0, 0.0, 0])
                            acc[0] += c1[0] - c0[0]
                            acc[1] += c1[1] - c0[1]
                            acc[2] += size
                    else:
                        pat.fill(expect, msg)
                        np.invert(expect, out=buf)              # poison: every byte differs
                        receiver_sync()
                        before = per_iter_rails() if (per_iter_rails and timed) else None
                        t0u = time.time()
                        th0 = thread_cpu() if timed else None
                        c0 = cpu_seconds()
                        t0 = time.perf_counter()
                        recv(data)
                        moved += size
                        t1 = time.perf_counter()
                        c1 = cpu_seconds()
                        if timed:
                            self._add_thread_cpu(impl, size, th0, t1 - t0)
                        ok = np.array_equal(data, expect_b)
                        if timed:
                            dt = t1 - t0
                            times.append(dt)
                            cpu[0] += c1[0] - c0[0]
                            cpu[1] += c1[1] - c0[1]
                            wrong += not ok
                            rec = {"impl": impl, "op": "p2p", "size_bytes": size, "iter": it - a.warmup,
                                   "t_start": t0u, "t_end": t0u + dt, "time_us": dt * 1e6,
                                   "wrong": int(not ok), "pair": self.pair}
                            if before is not None:
                                after = per_iter_rails()
                                rec["rail_bytes"] = [x - y for x, y in zip(after, before)]
                            self.iterations.append(rec)
                        elif not ok:
                            wrong += 1     # a wrong warm-up message is still wrong
                except Exception as e:  # noqa: BLE001 - a failed transfer is a result
                    failed = f"{type(e).__name__}: {e}"
                    self.errors.append(f"{impl} {format_size(size)} iteration {it}: {failed}")
                    print(f"bench: rank {self.dist.rank}: {impl} {format_size(size)} iteration {it}: {failed}",
                          file=sys.stderr, flush=True)
                    if self.role == "recv":
                        wrong += 1
                        if timed:
                            self.iterations.append({"impl": impl, "op": "p2p", "size_bytes": size,
                                                    "iter": it - a.warmup, "t_start": None, "t_end": None,
                                                    "time_us": None, "wrong": 1, "pair": self.pair,
                                                    "error": failed})
                    break
            if reg_id is not None:
                deregister_fn(reg_id)
            copies = None
            if copied_fn and moved:
                after = copied_fn()
                side = 0 if self.role == "send" else 1
                copies = (after[side] - copied_before[side]) / moved
                if self.role == "send":
                    self.send_copies[f"{impl}/{size}"] = copies
            if self.role == "recv":
                rails = None
                if rails_fn:
                    after = rails_fn()
                    if isinstance(after, list):
                        rails = sum(1 for x, y in zip(after, rails_before) if x > y)
                    else:
                        rails = after
                row = self._row(impl, size, rails, times, cpu, wrong, failed)
                if copies is not None:
                    row["copies_per_byte"] = {"send": None, "recv": copies}
                self.results.append(row)
            if failed:
                return

    def _row(self, impl: str, size: int, rails, times: list[float], cpu: list[float], wrong: int,
             failed: str | None) -> dict:
        """One size's table row, on the receiver: times in seconds, its CPU while they ran."""
        t = median(times)
        row = {"impl": impl, "op": "p2p", "size_bytes": size, "iters": len(times), "rails": rails,
               "time_us_median": None if t is None else t * 1e6,
               "time_us_min": min(times) * 1e6 if times else None,
               "time_us_max": max(times) * 1e6 if times else None,
               "algbw_GBps": None if not t else size / t / 1e9,
               "cpu_recv": cpu if times else None,
               "cpu_recv_s_per_GB": per_gb(cpu, size * len(times)),
               "wrong": wrong, "pair": self.pair}
        if failed:
            row["error"] = failed
            row["note"] = f"failed: {failed[:120]}"
        return row

    # ---- r2ccl over a set of NICs

    def _add_thread_cpu(self, impl: str, size: int, before: dict, wall: float) -> None:
        e = self.thread_cpu.setdefault(f"{impl}/{size}", {"wall": 0.0, "roles": {}})
        e["wall"] += wall
        thread_cpu_delta(before, thread_cpu(), e["roles"])

    def run_r2ccl(self, impl: str, nics: list[str], arm_fault: bool, register: bool = False, **overrides) -> None:
        from ...transport.bootstrap import connect_jax
        from ...config import Config
        a = self.args
        cfg = Config.from_env(**overrides)
        ep = connect_jax(nics=nics, config=cfg, prefix=f"{a.prefix}/{impl}", timeout=a.timeout)
        try:
            empty = np.empty(0, dtype=np.uint8)
            peer = self.peer

            def send(data):
                ep.isend(peer, data, TAG_DATA).wait(a.timeout)

            def sender_sync():
                ep.send(peer, empty, TAG_READY, timeout=a.timeout)
                ep.recv(peer, np.empty(0, dtype=np.uint8), TAG_GO, timeout=a.timeout)

            def receiver_sync():
                ep.recv(peer, np.empty(0, dtype=np.uint8), TAG_READY, timeout=a.timeout)

            def recv(data):
                r = ep.irecv(peer, data, TAG_DATA)
                go = ep.isend(peer, empty, TAG_GO)
                r.wait(a.timeout)
                go.wait(a.timeout)

            def rail_rx():
                return [s["rx_bytes"] for s in ep.rail_stats(peer)]

            def copied():
                st = ep.rail_stats(peer)
                return sum(s["tx_copied_bytes"] for s in st), sum(s["rx_copied_bytes"] for s in st)

            if arm_fault and self.role == "send" and (a.fault_cmd or a.inject):
                self.fault = self._make_fault(ep)
            if self.role != "idle":
                self.run_impl(impl, send, recv, sender_sync, receiver_sync, rail_rx, arm_fault,
                              per_iter_rails=rail_rx, copied_fn=copied,
                              register_fn=ep.register_memory if register else None,
                              deregister_fn=ep.deregister_memory)
            if self.fault and arm_fault:
                self.fault.join(timeout=a.timeout)
            self.dist.barrier(f"{a.prefix}/{impl}/done")
            if self.role != "idle":
                self.rail_stats[impl] = {"peer": peer, "rails": ep.rail_stats(peer)}
        finally:
            ep.close()

    def _make_fault(self, ep) -> FaultTrigger:
        a = self.args
        action = None
        if a.inject:
            rail, fault, rate, heal = a.inject_rail, a.inject, a.inject_rate, a.inject_heal_after

            def action():
                ep.inject(self.peer, rail, fault, rate)
                if heal is not None:
                    time.sleep(heal)
                    ep.inject(self.peer, rail, "heal")
        return FaultTrigger(a.fault_at or 0.0, a.fault_cmd, action)

    # ---- MPTCP baseline

    def run_mptcp(self, impl: str = "mptcp", poll_us: int = 0) -> None:
        a = self.args
        key = f"{a.prefix}/{impl}/{self.pair}"
        port = (a.mptcp_port + self.pair) if a.mptcp_port else 0
        sock = conn = None
        info_rails = None
        try:
            if self.role == "recv":
                try:
                    ip = nic_ipv4(self.nics[0])
                    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP)
                    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    srv.bind((ip, port))
                    srv.listen(1)
                    sock = srv
                    self.dist.set_json(f"{key}/server", {"ok": True, "addr": [ip, srv.getsockname()[1]]})
                except OSError as e:
                    self.dist.set_json(f"{key}/server", {"ok": False, "error": _oserr(e)})
                    raise _Unavailable(f"the receiver could not open an MPTCP socket: {_oserr(e)}")
                client = self.dist.get_json(f"{key}/client")
                if not client["ok"]:
                    raise _Unavailable(client["error"])
                srv.settimeout(a.timeout)
                conn, _ = srv.accept()
                conn.settimeout(a.timeout)
            elif self.role == "send":
                server = self.dist.get_json(f"{key}/server")
                if not server["ok"]:
                    raise _Unavailable(server["error"])
                try:
                    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP)
                    conn.bind((nic_ipv4(self.nics[0]), 0))
                except OSError as e:
                    self.dist.set_json(f"{key}/client", {"ok": False, "error": f"the sender could not open "
                                                         f"an MPTCP socket: {_oserr(e)}"})
                    raise _Unavailable(_oserr(e))
                self.dist.set_json(f"{key}/client", {"ok": True})
                conn.settimeout(a.timeout)
                conn.connect(tuple(server["addr"]))
            else:
                return
            try:   # the 1-byte sync messages must not wait for Nagle / delayed acks
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            if poll_us > 0:
                conn.setblocking(False)

            def recv_some(mv) -> int:
                if poll_us <= 0:
                    return conn.recv_into(mv)
                # Spin on the socket for up to poll_us, then sleep in select (up to the timeout).
                until = time.perf_counter() + poll_us * 1e-6
                while True:
                    try:
                        return conn.recv_into(mv)
                    except BlockingIOError:
                        pass
                    if time.perf_counter() > until:
                        if not select.select([conn], [], [], a.timeout)[0]:
                            raise TimeoutError(f"{impl}: no data within {a.timeout} s")
                        until = time.perf_counter() + poll_us * 1e-6

            def send(data):
                mv = memoryview(data).cast("B")
                while mv:
                    try:
                        mv = mv[conn.send(mv):]
                    except BlockingIOError:
                        select.select([], [conn], [], a.timeout)

            def expect_byte(b: bytes):
                one = bytearray(1)
                if recv_some(memoryview(one)) != 1 or bytes(one) != b:
                    raise ConnectionError("MPTCP peer closed the connection")

            def sender_sync():
                send(b"S")
                expect_byte(b"R")

            def receiver_sync():
                expect_byte(b"S")

            def recv(data):
                send(b"R")
                mv = memoryview(data).cast("B")
                got, n = 0, len(data)
                while got < n:
                    k = recv_some(mv[got:])
                    if k == 0:
                        raise ConnectionError(f"MPTCP peer closed the connection after {got} of {n} bytes")
                    got += k

            def rails():
                return mptcp_subflows(conn)

            self.run_impl(impl, send, recv, sender_sync, receiver_sync, rails, arm_fault=False)
            self.rail_stats[impl] = {"subflows": mptcp_subflows(conn), "info": mptcp_info(conn)}
        except _Unavailable as e:
            self._unavailable(str(e), impl)
        except OSError as e:
            if self.role == "recv" and not any(r["impl"] == impl for r in self.results):
                self._unavailable(f"MPTCP connection failed: {_oserr(e)}", impl)
            else:
                self.errors.append(f"{impl}: {_oserr(e)}")
        finally:
            for s in (conn, sock):
                if s is not None:
                    s.close()
            self.dist.barrier(f"{a.prefix}/{impl}/done")

    # ---- plain TCP from threads: the reference a threaded sockets library could reach

    def run_tcp_threads(self, impl: str, nics: list[str]) -> None:
        """One plain TCP connection per NIC (from the sender's address on that NIC to the
        receiver's), each driven by its own Python thread (the GIL is released in every send
        and receive call), moving a contiguous share of the same buffers r2ccl moves: the
        sender reads the message from its (cache-cold) source buffer and the receiver lands
        it in place in its destination, every byte checked as for r2ccl. No chunking, acks,
        retransmit or failover: what the kernel's TCP gives a program that only copies,
        beside iperf3, which sends one small buffer over and over from cache."""
        from concurrent.futures import ThreadPoolExecutor
        a = self.args
        key = f"{a.prefix}/{impl}/{self.pair}"
        conns: list[socket.socket] = []
        listeners: list[socket.socket] = []
        pool = None
        try:
            if self.role == "recv":
                addrs = []
                for nic in nics:
                    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    srv.bind((nic_ipv4(nic), 0))
                    srv.listen(1)
                    srv.settimeout(a.timeout)
                    listeners.append(srv)
                    addrs.append([nic_ipv4(nic), srv.getsockname()[1]])
                self.dist.set_json(f"{key}/server", {"addrs": addrs})
                for srv in listeners:       # connection k arrives on NIC k's listener
                    c, _ = srv.accept()
                    conns.append(c)
            elif self.role == "send":
                addrs = self.dist.get_json(f"{key}/server")["addrs"]
                for nic, addr in zip(nics, addrs):
                    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    c.bind((nic_ipv4(nic), 0))
                    c.settimeout(a.timeout)
                    c.connect(tuple(addr))
                    conns.append(c)
            else:
                return
            for c in conns:
                c.settimeout(a.timeout)
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pool = ThreadPoolExecutor(max_workers=len(conns), thread_name_prefix="tcp-threads")
            first = conns[0]

            def shares(mv):
                parts, at = [], 0
                for n in split_sizes(len(mv), len(conns)):
                    parts.append(mv[at:at + n])
                    at += n
                return parts

            def send_all(c, part):
                c.sendall(part)

            def recv_all(c, part):
                got, n = 0, len(part)
                while got < n:
                    k = c.recv_into(part[got:])
                    if k == 0:
                        raise ConnectionError(f"{impl}: peer closed after {got} of {n} bytes")
                    got += k

            def expect_byte(b: bytes):
                one = bytearray(1)
                if first.recv_into(one) != 1 or bytes(one) != b:
                    raise ConnectionError(f"{impl}: peer closed the connection")

            def send(data):
                mv = memoryview(data).cast("B")
                for f in [pool.submit(send_all, c, part) for c, part in zip(conns, shares(mv))]:
                    f.result()

            def sender_sync():
                first.sendall(b"S")
                expect_byte(b"R")

            def receiver_sync():
                expect_byte(b"S")

            def recv(data):
                first.sendall(b"R")
                mv = memoryview(data).cast("B")
                for f in [pool.submit(recv_all, c, part) for c, part in zip(conns, shares(mv))]:
                    f.result()

            self.run_impl(impl, send, recv, sender_sync, receiver_sync, lambda: len(conns), arm_fault=False)
        except OSError as e:
            self.errors.append(f"{impl}: {_oserr(e)}")
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
            for c in conns + listeners:
                c.close()
            self.dist.barrier(f"{a.prefix}/{impl}/done")

    def _unavailable(self, why: str, impl: str = "mptcp") -> None:
        self.notes.append(f"{impl} unavailable: {why}")
        if self.role == "recv":
            self.results.append({"impl": impl, "op": "p2p", "size_bytes": None, "iters": 0, "rails": None,
                                 "time_us_median": None, "algbw_GBps": None, "wrong": 0, "pair": self.pair,
                                 "available": False, "note": f"{impl} unavailable: {why}"})


    # ---- iperf3 baseline: the kernel's TCP with iperf3's own processes, over the same NICs

    def run_iperf3(self, impl: str, nics: list[str]) -> None:
        """Per iteration the receiver starts one one-shot iperf3 server per NIC (bound to its
        address there) and the sender one client per NIC, each sending its share of SIZE from
        its own address on that NIC. The time is the longest stream's as iperf3 reports it
        (the longer of its send and its receive; process start-up and the control connection
        left out: a shorter time than the wall clock would give; iperf3's own timing is coarse
        below a few MiB, so its rows mean most at the large sizes). CPU is what iperf3 measures
        of itself over the test (its cpu_utilization_percent x the stream's time, user and
        system, client and server), start-up left out as well. Bytes are counted, not checked: iperf3 sends its
        own buffer."""
        a = self.args
        key = f"{a.prefix}/{impl}/{self.pair}"
        exe = shutil.which("iperf3")
        try:
            if self.role == "idle":
                return
            if exe is None:
                raise _Unavailable("iperf3 is not on PATH (Debian: apt install iperf3)")
            for size in a.sizes:
                shares = split_sizes(size, len(nics))
                times, wrong, failed = [], 0, None
                cpu = [0.0, 0.0]
                for it in range(a.warmup + a.iters):
                    timed = it >= a.warmup
                    k = f"{key}/{size}/{it}"
                    if self.role == "recv":
                        res = self._iperf3_servers(exe, nics, k)
                    else:
                        res = self._iperf3_clients(exe, nics, shares, k)
                    if self.role == "send":
                        self.dist.set_json(f"{k}/result", res)
                        if timed and "error" not in res:
                            acc = self.send_cpu.setdefault(f"{impl}/{size}", [0.0, 0.0, 0])
                            acc[0] += res["cpu_send"][0]
                            acc[1] += res["cpu_send"][1]
                            acc[2] += size
                        if "error" in res:
                            self.errors.append(f"{impl} {format_size(size)} iteration {it}: {res['error']}")
                        if not self.dist.get_json(f"{k}/verdict")["ok"] or "error" in res:
                            break
                        continue
                    mine, res = res, self.dist.get_json(f"{k}/result")
                    if "error" in res or "error" in mine or res["bytes"] < size:
                        failed = (res.get("error") or mine.get("error")
                                  or f"iperf3 moved {res['bytes']} of {size} bytes")
                        print(f"bench: rank {self.dist.rank}: {impl} {format_size(size)} iteration {it}: {failed}",
                              file=sys.stderr, flush=True)
                        wrong += 1
                    self.dist.set_json(f"{k}/verdict", {"ok": not failed})
                    if failed:
                        break
                    if timed:
                        times.append(res["seconds"])
                        cpu[0] += res["cpu_recv"][0]
                        cpu[1] += res["cpu_recv"][1]
                if self.role == "recv":
                    self.results.append(self._row(impl, size, len(nics), times, cpu, wrong, failed))
                    if failed:
                        self.errors.append(f"{impl} {format_size(size)}: {failed}")
                if failed:
                    return
        except _Unavailable as e:
            self._unavailable(str(e), impl)
        finally:
            self.dist.barrier(f"{a.prefix}/{impl}/done")

    def _iperf3_servers(self, exe: str, nics: list[str], key: str) -> dict:
        procs, addrs = [], []
        try:
            for nic in nics:
                ip = nic_ipv4(nic)
                # Below the ephemeral range (launch.coordinator_port): a port picked by binding
                # port 0 may be taken as the local port of an outgoing connection before iperf3
                # binds it, and the server then exits "Address already in use".
                port = coordinator_port()
                procs.append(subprocess.Popen([exe, "-s", "-1", "-B", ip, "-p", str(port)],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
                addrs.append([ip, port])
            self.dist.set_json(key, {"servers": addrs})
            errs = []
            deadline = time.monotonic() + self.args.timeout
            for p in procs:
                try:
                    _, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    _, err = p.communicate()
                    errs.append(f"an iperf3 server ran past {self.args.timeout} s")
                    continue
                if p.returncode != 0:
                    errs.append(f"iperf3 server exit {p.returncode}: {err.strip()[:200]}")
            return {"error": "; ".join(errs)} if errs else {}
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()

    def _iperf3_clients(self, exe: str, nics: list[str], shares: list[int], key: str) -> dict:
        servers = self.dist.get_json(key)["servers"]
        deadline = time.monotonic() + self.args.timeout

        def start(k: int) -> subprocess.Popen:
            ip, port = servers[k]
            return subprocess.Popen([exe, "-c", ip, "-p", str(port), "-B", nic_ipv4(nics[k]), "-n", str(shares[k]),
                                     "-J"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        procs = [start(k) for k in range(len(nics))]
        got, seconds, errs = 0, 0.0, []
        cpu_send, cpu_recv = [0.0, 0.0], [0.0, 0.0]
        for k in range(len(nics)):
            while True:
                try:
                    out, err = procs[k].communicate(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    procs[k].kill()
                    procs[k].communicate()
                    errs.append(f"an iperf3 client ran past {self.args.timeout} s")
                    break
                try:
                    doc = json.loads(out)
                except ValueError:
                    doc = {"error": (err or out).strip()[:200] or f"exit {procs[k].returncode}"}
                # The server may not be listening yet: a refused connection is tried again.
                if "error" in doc and "refused" in str(doc["error"]) and time.monotonic() < deadline:
                    time.sleep(0.01)
                    procs[k] = start(k)
                    continue
                if "error" in doc:
                    errs.append(f"iperf3 client to {servers[k][0]}: {doc['error']}")
                else:
                    # Bytes: what the client wrote (its receiver's count can miss the last ones);
                    # time: the longer of its send and its server's receive.
                    tx, rx = doc["end"]["sum_sent"], doc["end"]["sum_received"]
                    got += int(tx["bytes"])
                    seconds = max(seconds, float(tx["seconds"]), float(rx["seconds"]))
                    util = doc["end"].get("cpu_utilization_percent", {})
                    for acc, side, span in ((cpu_send, "host", tx["seconds"]), (cpu_recv, "remote", rx["seconds"])):
                        acc[0] += float(util.get(f"{side}_user", 0.0)) / 100 * float(span)
                        acc[1] += float(util.get(f"{side}_system", 0.0)) / 100 * float(span)
                break
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        return ({"error": "; ".join(errs)} if errs else
                {"bytes": got, "seconds": seconds, "cpu_send": cpu_send, "cpu_recv": cpu_recv})


def split_sizes(size: int, k: int) -> list[int]:
    """SIZE bytes in K contiguous shares, the first size % k one byte larger (the per-NIC
    split of the baselines that stripe by hand: iperf3, tcp-threads)."""
    return [size // k + (1 if i < size % k else 0) for i in range(k)]


class _Unavailable(Exception):
    pass


def _oserr(e: OSError) -> str:
    name = errno.errorcode.get(e.errno, "") if e.errno else ""
    return f"{name} {e}".strip()


def mptcp_info(s: socket.socket) -> dict | None:
    """A few fields of struct mptcp_info (linux/mptcp.h), or None on a plain TCP socket."""
    try:
        raw = s.getsockopt(SOL_MPTCP, MPTCP_INFO, 256)
    except OSError:
        return None
    if len(raw) < 8:
        return None
    return {"subflows": raw[0], "add_addr_signal": raw[1], "add_addr_accepted": raw[2],
            "subflows_max": raw[3]}


def mptcp_subflows(s: socket.socket) -> int | str:
    """Subflows of an MPTCP connection (the initial one plus joined ones); 'tcp' on fallback."""
    info = mptcp_info(s)
    return "tcp" if info is None else info["subflows"] + 1


# ---------------------------------------------------------------- driver


COLUMNS = [
    Column("impl", "impl", align="<"),
    Column("size", "size_bytes", format_size),
    Column("rails", "rails", lambda v: str(v)),
    Column("iters", "iters", "d"),
    Column("time(us)", "time_us_median", ".1f"),
    Column("min(us)", "time_us_min", ".1f"),
    Column("max(us)", "time_us_max", ".1f"),
    Column("algbw(GB/s)", "algbw_GBps", ".4f"),
    Column("cpu/GB snd", "cpu_send_s_per_GB", ".3f"),
    Column("cpu/GB rcv", "cpu_recv_s_per_GB", ".3f"),
    # payload bytes the transport copied on the CPU per byte moved, sender + receiver (verbs
    # bounce buffers: 1 + 1; sockets: 0 + 0, the kernel's copies are not the transport's)
    Column("copies/B", "copies_per_byte", lambda v: "-" if not v or v.get("send") is None or v.get("recv") is None
           else f"{v['send']:.2f}+{v['recv']:.2f}"),
    Column("#wrong", "wrong", "d"),
]

ITER_COLUMNS = [
    Column("impl", "impl", align="<"),
    Column("size", "size_bytes", format_size),
    Column("iter", "iter", "d"),
    Column("t_start(s)", "t_rel", ".3f"),
    Column("time(us)", "time_us", ".1f"),
    Column("GB/s", "algbw_GBps", ".4f"),
    Column("send(us)", "send_time_us", ".1f"),
    Column("rail bytes (MiB)", "rail_mib", lambda v: " ".join(f"{x:.1f}" for x in v)),
    Column("#wrong", "wrong", "d"),
]


def main(args: argparse.Namespace) -> int:
    if args.num_processes < 2:
        print("bench p2p: needs at least 2 processes", file=sys.stderr)
        return 2
    if args.inject == "rate" and not args.inject_rate > 0:
        print("bench p2p: --inject rate needs --inject-rate BYTES_PER_S > 0", file=sys.stderr)
        return 2
    if args.fault_at is not None and not (args.fault_cmd or args.inject):
        print("bench p2p: --fault-at needs --fault-cmd or --inject", file=sys.stderr)
        return 2
    if (args.fault_cmd or args.inject) and args.fault_at is None:
        args.fault_at = 0.0
    if args.inject and args.inject_rail is None:
        args.inject_rail = 0
    try:
        io_sweep = [int(x) for x in args.io_threads.split(",") if x.strip()]
    except ValueError:
        print(f"bench p2p: --io-threads {args.io_threads!r}: give integers, e.g. 0,1,2", file=sys.stderr)
        return 2
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    bad = [t for t in transports if t not in ("socket", "ibverbs")]
    if bad:
        print(f"bench p2p: --transports {args.transports!r}: use socket and/or ibverbs", file=sys.stderr)
        return 2
    build = core_build()   # the library this process loaded (the build may change under us)
    dist = Dist(args.coordinator, args.num_processes, args.process_id, args.timeout)
    from ...config import Config
    cfg = Config.from_env()
    nics = [n.strip() for n in args.nics.split(",") if n.strip()] if args.nics else cfg.nic_list()
    run = Runner(args, dist, nics)
    t_begin = time.time()
    aborted = None
    try:
        run.run_r2ccl("r2ccl", nics, arm_fault=True)
        for t in transports:
            run.run_r2ccl(f"r2ccl-{t}", nics, arm_fault=False, transport=t)
            if args.zero_copy:
                run.run_r2ccl(f"r2ccl-{t}-zc", nics, arm_fault=False, register=True, transport=t)
        for n in io_sweep:
            run.run_r2ccl(f"r2ccl-io{n}", nics, arm_fault=False, io_threads=n)
        if args.thread_baseline:
            run.run_r2ccl("r2ccl-thread", nics, arm_fault=False, poll_us=0)
        if not args.no_baselines:
            run.run_r2ccl("r2ccl-1rail", nics[:1], arm_fault=False)
            run.run_mptcp()
            if args.poll_baseline:
                run.run_mptcp("mptcp-poll", poll_us=cfg.poll_us)
        if "tcp-threads" in args.baseline:
            run.run_tcp_threads("tcp-threads", nics)
        if "iperf3" in args.baseline:
            run.run_iperf3("iperf3", nics)
            if len(nics) > 1:
                run.run_iperf3("iperf3-1", nics[:1])
    except Exception as e:  # noqa: BLE001 - a lost peer or coordinator: report what we have
        aborted = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        run.errors.append(f"aborted: {aborted}")
    mine = {"rank": dist.rank, "role": run.role, "results": run.results, "iterations": run.iterations,
            "send_times": run.send_times, "send_cpu": run.send_cpu, "send_copies": run.send_copies, "thread_cpu": run.thread_cpu,
            "rail_stats": run.rail_stats, "notes": run.notes, "errors": run.errors,
            "fault": run.fault.summary() if run.fault else None}
    everyone = None
    if aborted is None:
        try:
            everyone = dist.gather(f"{args.prefix}/report", mine)
            if dist.rank != 0:
                everyone = []
        except Exception as e:  # noqa: BLE001
            aborted = f"gathering the results: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            run.errors.append(f"aborted: {aborted}")
    rc = 1 if (any(r.get("wrong") for r in run.results) or run.errors) else 0
    if aborted is not None:
        # Every process prints what it measured itself; process 0 writes it as JSON.
        print(f"bench p2p: rank {dist.rank}: {aborted}", file=sys.stderr)
        report(args, cfg, nics, [mine], t_begin, build, write=dist.rank == 0)
        # jax.distributed's shutdown barrier would wait for the lost process: leave now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    if everyone:
        rc = max(rc, report(args, cfg, nics, everyone, t_begin, build))
    dist.barrier(f"{args.prefix}/end")
    dist.shutdown()
    return rc


def core_build() -> dict:
    """Which C++ core ran: its file, modification time and a digest (the tree may be dirty)."""
    import hashlib
    from ... import _core
    path = os.path.realpath(_core.__file__)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"path": path, "mtime_unix": os.path.getmtime(path), "sha256": h.hexdigest()[:16]}


def thread_lines(everyone: list[dict], results: list[dict]) -> list[str]:
    """Where each r2ccl row's CPU went, on each end, at the largest size: every thread role's
    CPU seconds over the timed transfers' wall time (1.00: one core busy throughout), so a
    thread that caps the rate shows as one near 1.00."""
    largest = max((r.get("size_bytes") or 0 for r in results), default=0)
    impls = [r["impl"] for r in results if r.get("size_bytes") == largest and r["impl"].startswith("r2ccl")]
    lines = []
    for impl in dict.fromkeys(impls):
        parts = []
        for rep in sorted(everyone, key=lambda rep: rep["rank"]):
            e = rep.get("thread_cpu", {}).get(f"{impl}/{largest}")
            if not e or not e["wall"]:
                continue
            w = e["wall"]
            roles = []
            for role, (sec, n, top) in sorted(e["roles"].items(), key=lambda kv: -kv[1][0]):
                if sec / w < 0.005:
                    continue
                roles.append(f"{role} {sec / w:.2f}" + (f" ({n} threads, busiest {top / w:.2f})" if n > 1 else ""))
            parts.append(f"{rep['role']} " + ", ".join(roles))
        if parts:
            lines.append(f"# cpu by thread, {impl} {format_size(largest)} (cores busy over the transfers): "
                         + "; ".join(parts))
    return lines


def report(args, cfg, nics, everyone: list[dict], t_begin: float, build: dict, write: bool = True) -> int:
    results = [r for rep in everyone for r in rep["results"]]
    iterations = [r for rep in everyone for r in rep["iterations"]]
    senders = {rep["rank"]: rep for rep in everyone}
    for r in iterations:   # the sender's view: "go" received -> its send completed (all acked)
        sender = senders.get(2 * r["pair"])
        if sender is not None:
            r["send_time_us"] = sender["send_times"].get(f"{r['impl']}/{r['size_bytes']}/{r['iter']}")
    for r in results:      # the sender's CPU while its timed sends ran
        sender = senders.get(2 * r["pair"])
        acc = sender.get("send_cpu", {}).get(f"{r['impl']}/{r['size_bytes']}") if sender else None
        if acc:
            r["cpu_send"] = acc[:2]
            r["cpu_send_s_per_GB"] = per_gb(acc[:2], acc[2])
        copies = sender.get("send_copies", {}).get(f"{r['impl']}/{r['size_bytes']}") if sender else None
        if "copies_per_byte" in r:
            r["copies_per_byte"]["send"] = copies

    notes = [n for rep in everyone for n in rep["notes"]]
    errors = [f"rank {rep['rank']}: {e}" for rep in everyone for e in rep["errors"]]
    fault = next((rep["fault"] for rep in everyone if rep["fault"]), None)
    pairs = sorted({r["pair"] for r in results})
    cols = list(COLUMNS)
    if len(pairs) > 1:
        cols.insert(1, Column("pair", "pair", "d"))
    print(f"# bench p2p: {args.num_processes} processes, pairs 2k->2k+1, NICs {','.join(nics)}; "
          f"iters {args.iters}, warmup {args.warmup}; time = median on the receiver, "
          f"algbw = size/time (GB/s = 1e9 B/s); cpu/GB = CPU seconds (user + system, every thread) "
          f"per GB moved, on each end, while the timed transfers ran")
    from ... import _core
    print(f"# socket I/O threads per process: r2ccl {_core.io_threads_for(cfg.io_threads, len(nics))} "
          f"(R2CCL_IO_THREADS={cfg.io_threads}), r2ccl-1rail {_core.io_threads_for(cfg.io_threads, 1)}; "
          f"r2ccl-ioN: N")
    print(format_table(cols, results))
    if fault or args.print_iters:
        t0 = min((r["t_start"] for r in iterations if r.get("t_start")), default=t_begin)
        if fault and fault.get("fired_unix"):
            print(f"# fault fired at {fault['fired_unix'] - t0:.3f} s (relative to the first timed "
                  f"iteration): {fault.get('cmd') or ''} {'(inject ' + args.inject + ')' if args.inject else ''}"
                  f"{' rc=' + str(fault['rc']) if fault.get('rc') is not None else ''}")
        rows = []
        for r in iterations:
            row = dict(r)
            row["t_rel"] = (r["t_start"] - t0) if r.get("t_start") else None
            row["algbw_GBps"] = (r["size_bytes"] / r["time_us"] / 1e3) if r.get("time_us") else None
            if r.get("rail_bytes") is not None:
                row["rail_mib"] = [b / (1 << 20) for b in r["rail_bytes"]]
            rows.append(row)
        icols = list(ITER_COLUMNS)
        if len(pairs) > 1:
            icols.insert(1, Column("pair", "pair", "d"))
        print(format_table(icols, rows))
    for line in thread_lines(everyone, results):
        print(line)
    for n in sorted(set(notes)):
        print(f"# note: {n}")
    for e in errors:
        print(f"# error: {e}")
    # Rails each process's core declared stalled and failed over (0 on a healthy bed).
    stalls = {str(rep["rank"]): {impl: stall_count(st.get("rails", [])) for impl, st in rep["rail_stats"].items()
                                 if impl.startswith("r2ccl")} for rep in (everyone or []) if rep["rail_stats"]}
    if stalls:
        print("# stalls declared: " + ", ".join(f"rank {r}: " + " ".join(f"{i}={n}" for i, n in v.items())
                                                for r, v in stalls.items()))
    wrong = sum(r.get("wrong") or 0 for r in results)
    if args.json and write:
        config = {k: v for k, v in vars(args).items() if k not in ("sizes", "handler", "command", "bench")}
        config["sizes"] = list(args.sizes)
        config["nic_list"] = nics
        config["r2ccl"] = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "secret"}
        config["host"] = {"hostname": socket.gethostname(), "cpus": os.cpu_count(),
                          "kernel": os.uname().release, "python": sys.version.split()[0],
                          "numpy": np.__version__}
        config["started_unix"] = t_begin
        config["core_build"] = build
        rail_stats = {str(rep["rank"]): rep["rail_stats"] for rep in everyone if rep["rail_stats"]}
        threads = {str(rep["rank"]): rep.get("thread_cpu", {}) for rep in everyone}
        write_json(args.json, {"config": config, "results": results, "iterations": iterations,
                               "rail_stats": rail_stats, "stalls": stalls, "fault": fault, "notes": notes,
                               "errors": errors, "thread_cpu": threads})
        print(f"# wrote {args.json}")
    if wrong:
        print(f"# FAILED: {wrong} wrong iteration(s)")
    return 1 if (wrong or errors) else 0
