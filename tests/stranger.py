"""A stranger on a job's listen ports, for the storm test (tests/test_load.py): until it is
killed or SECONDS pass, it keeps, against every ADDR (ip:port):

  - HALF_OPEN connections that send nothing (reopened as the listener drops them),
  - slow senders dribbling a hello header one byte every 50 ms,
  - oversized headers: valid checksums, lengths no frame of their type can have (a 2 GiB
    hello, a data chunk of a 2^60-byte message, an ack of 10^6 ranges), 20 a second,
  - garbage: 4 KiB of random bytes, 20 a second.

It never holds the job's secret. Prints one JSON line of counts when it ends.

    python tests/stranger.py --seconds 30 --half-open 200 127.0.0.2:40001 [...]
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import struct
import time

MAGIC, VERSION = 0x43433252, 2


def header(ftype: int, payload_len: int, seq: int = 0, msg_len: int = 0) -> bytes:
    """A 64-byte frame header with a valid checksum (layout: csrc/core/wire.cc)."""
    from jax_r2ccl import _core
    h = bytearray(struct.pack("<IHBBIIQQQQQII", MAGIC, VERSION, ftype, 0, payload_len, 0, seq, 1, 0, 0, msg_len, 0, 0))
    struct.pack_into("<I", h, 12, _core.crc32c(bytes(h)))
    return bytes(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("addrs", nargs="+")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--half-open", type=int, default=200)
    ap.add_argument("--slow", type=int, default=8)
    a = ap.parse_args()
    targets = [(h, int(p)) for h, p in (x.rsplit(":", 1) for x in a.addrs)]
    oversized = [header(1, 0x7FFFFFFF), header(5, 1 << 20, msg_len=1 << 60), header(6, 16 * 10**6, seq=10**6),
                 header(3, 1 << 31)]
    slow_bytes = header(1, 56)
    counts = {"connects": 0, "refused": 0, "dropped_by_listener": 0, "oversized_sent": 0, "garbage_sent": 0,
              "slow_bytes": 0}
    sel = selectors.DefaultSelector()
    half: dict[socket.socket, tuple] = {}
    slow: dict[socket.socket, list] = {}
    stop = time.monotonic() + a.seconds
    done = []
    signal.signal(signal.SIGTERM, lambda *_: done.append(1))

    def dial(t):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(t)
        except BlockingIOError:
            pass
        except OSError:
            counts["refused"] += 1
            s.close()
            return None
        counts["connects"] += 1
        return s

    def one_shot(t, data):
        s = socket.socket()
        s.settimeout(0.5)
        try:
            s.connect(t)
            s.sendall(data)
        except OSError:
            pass
        finally:
            s.close()

    next_burst = next_slow = 0.0
    i = 0
    while not done and time.monotonic() < stop:
        now = time.monotonic()
        while len(half) < a.half_open:
            t = targets[len(half) % len(targets)]
            s = dial(t)
            if s is None:
                break
            half[s] = t
            sel.register(s, selectors.EVENT_READ)
        while len(slow) < a.slow:
            t = targets[len(slow) % len(targets)]
            s = dial(t)
            if s is None:
                break
            slow[s] = [t, 0]
        if now >= next_slow:
            next_slow = now + 0.05
            for s, st in list(slow.items()):
                try:
                    if st[1] < len(slow_bytes):
                        s.send(slow_bytes[st[1]:st[1] + 1])
                        st[1] += 1
                        counts["slow_bytes"] += 1
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    counts["dropped_by_listener"] += 1
                    s.close()
                    del slow[s]
        if now >= next_burst:
            next_burst = now + 0.05
            t = targets[i % len(targets)]
            one_shot(t, oversized[i % len(oversized)])
            counts["oversized_sent"] += 1
            one_shot(t, os.urandom(4096))
            counts["garbage_sent"] += 1
            i += 1
        for key, _ in sel.select(timeout=0.01):
            s = key.fileobj
            try:
                gone = s.recv(4096) == b""
            except (BlockingIOError, InterruptedError):
                gone = False
            except OSError:
                gone = True
            if gone:
                counts["dropped_by_listener"] += 1
                sel.unregister(s)
                s.close()
                del half[s]
    for s in list(half) + list(slow):
        s.close()
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main()
