"""Captures the seed corpus of the fuzz harnesses from real jobs (needs root: a packet socket).

    sudo python tests/fuzz/capture_corpus.py [--out tests/fuzz/corpus]

Runs small jobs of real ranks over loopback (an exchange of messages, host collectives on
three processes, a NIC declared down and up mid-transfer) with a fixed job secret, records
every TCP segment on `lo` with a packet socket, rebuilds each connection's byte streams and
cuts them into frames. What the harnesses get (tests/fuzz/README.md says how each reads it):

  wire/        headers as they crossed the wire, 64 bytes each, one stream per file
  channel/     mode byte 1, then the bytes one rail received after its handshake
  rail_state/  the same, from a few frames before each rail-state notice a rail received
  handshake/   acceptor: mode 0x81, job id, rank, world, the acceptor's nonce (from its
               challenge), the bytes it received (hello, auth); connector: mode 0x80, its hello, the bytes it
               received (challenge, welcome). With the job's secret (SECRET below) the proofs
               in them are valid, so the fuzzer starts past the MAC checks.
  signature/   mode byte 1, then a signature message (signature and capacity) as sent
  verbs_boot/  setup records written here in the codec's layout (a socket capture has none)

Files are named by the SHA-1 of their content; rerunning adds what is new.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import struct
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # tests/: harness, workers

SECRET = "7365637265742d6f662d7468652d6675" * 2   # 32 bytes; tests/fuzz/fuzz_handshake.cc has the same
MAGIC = 0x43433252
SIG_MAGIC = 0x5347495343435232
HELLO, CHALLENGE, AUTH, WELCOME, DATA, RAIL_STATE = 1, 2, 3, 4, 5, 10


class Capture:
    """TCP payloads seen on lo, by (src, sport, dst, dport), in sequence order."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        self.sock.setsockopt(socket.SOL_SOCKET, 33, 256 << 20)   # SO_RCVBUFFORCE: drop nothing
        self.sock.bind(("lo", 0))
        self.sock.settimeout(0.2)
        self.segs: dict[tuple, dict[int, bytes]] = {}
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            try:
                pkt, addr = self.sock.recvfrom(1 << 17)
            except socket.timeout:
                continue
            if addr[2] == socket.PACKET_OUTGOING:   # lo shows each packet twice
                continue
            ip = pkt[14:]
            if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
                continue
            ihl = (ip[0] & 15) * 4
            total = struct.unpack("!H", ip[2:4])[0]
            tcp = ip[ihl:total]
            sport, dport, seq = struct.unpack("!HHI", tcp[:8])
            data = tcp[(tcp[12] >> 4) * 4:]
            if data:
                key = (socket.inet_ntoa(ip[12:16]), sport, socket.inet_ntoa(ip[16:20]), dport)
                self.segs.setdefault(key, {})[seq] = data

    def streams(self) -> dict[tuple, bytes]:
        self.stop.set()
        self.t.join()
        out = {}
        for key, segs in self.segs.items():
            buf, nxt = bytearray(), None
            for seq in sorted(segs):   # (no wrap: short jobs from a random start are rare to wrap)
                d = segs[seq]
                if nxt is not None and seq != nxt:
                    if seq < nxt:
                        d = d[nxt - seq:]
                    else:
                        break   # a hole: keep what is contiguous
                buf += d
                nxt = seq + len(d) if nxt is None or seq >= nxt else nxt + len(d)
            out[key] = bytes(buf)
        return out


def frames(stream: bytes):
    """(type, header, payload) of each whole frame at the start of a stream."""
    at = 0
    while at + 64 <= len(stream):
        magic, _ver, ftype, _flags, plen = struct.unpack("<IHBBI", stream[at:at + 12])
        if magic != MAGIC or at + 64 + plen > len(stream):
            return
        yield ftype, stream[at:at + 64], stream[at + 64:at + 64 + plen]
        at += 64 + plen


def run_jobs():
    from harness import LOOPBACK4, run_ranks
    cfg = {"secret": SECRET, "crc": True}
    run_ranks("exchange", 2, config=cfg, args={"sizes": [0, 1, 100, 4096, 70_000], "rounds": 1})
    cases = [("all_reduce", "float32", "sum", 64, 0), ("all_reduce", "float32", "sum", 40_000, 0),
             ("all_gather", "int32", "sum", 100, 0), ("reduce_scatter", "float32", "max", 3000, 0),
             ("all_to_all", "uint8", "sum", 300, 0)]
    run_ranks("host_collective", 3, config=cfg, args={"cases": cases}, timeout=120)
    run_ranks("monitored_transfer", 2, nics=LOOPBACK4, config=cfg, timeout=90,
              args={"nbytes": 256 << 10, "iters": 40, "rate": 2e6, "steps": [(0.3, 0, "nic", [1, 0]), (0.8, 0, "nic", [1, 1])]})


def save(root: str, name: str, blob: bytes, counts: dict):
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, hashlib.sha1(blob).hexdigest())
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(blob)
        counts[name] = counts.get(name, 0) + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "corpus"))
    a = ap.parse_args()
    cap = Capture()
    time.sleep(0.3)
    run_jobs()
    streams = cap.streams()
    counts: dict[str, int] = {}
    for key, s in streams.items():
        fr = list(frames(s))
        if not fr:
            continue
        reverse = streams.get((key[2], key[3], key[0], key[1]), b"")
        rfr = list(frames(reverse))
        save(a.out, "wire", b"".join(h for _, h, _ in fr[:48]), counts)
        types = [t for t, _, _ in fr]
        if types[:2] == [HELLO, AUTH] and rfr and rfr[0][0] == CHALLENGE:
            nonce = rfr[0][2][:32]
            hello = fr[0][2]   # job id (8), from rank (4), to rank (4): who the acceptor is
            job, from_rank, to_rank = hello[:8], *struct.unpack("<II", hello[8:16])
            save(a.out, "handshake", b"\x81" + job + bytes([to_rank, from_rank + 1]) + nonce +
                 b"".join(h + p for _, h, p in fr[:2]), counts)
            after = fr[2:]
        elif types[:2] == [CHALLENGE, WELCOME] and rfr and rfr[0][0] == HELLO:
            save(a.out, "handshake", b"\x80" + rfr[0][2] + b"".join(h + p for _, h, p in fr[:2]), counts)
            after = fr[2:]
        else:
            continue
        # The rail's traffic after its handshake (at most 64 frames and 64 KiB), and the same
        # from a few frames before each rail-state notice.
        def window(start):
            body, n = b"", 0
            for t, h, p in after[start:start + 64]:
                if len(body) + len(h) + len(p) > 64 << 10:
                    break
                body += h + p
                n += 1
            return body
        if after:
            save(a.out, "channel", b"\x01" + window(0), counts)
        for i, (t, _, _) in enumerate(after):
            if t == RAIL_STATE:
                save(a.out, "rail_state", b"\x01" + window(max(0, i - 3)), counts)
        for t, h, p in after:
            if t == DATA and len(p) >= 48 and struct.unpack("<Q", p[32:40])[0] == SIG_MAGIC:
                save(a.out, "signature", b"\x01" + p[:56], counts)
    # Setup records of the verbs link (the codec's layout: boot_record.h), one per MTU.
    for mtu in range(1, 6):
        rec = struct.pack("<IHxxIIHxx16sIIIII", 0x42563252, 1, 0x11 + mtu, 0x5A5A5A, 0, bytes(10) + b"\xff\xff" +
                          bytes([198, 18, 0, mtu]), mtu, 32, 65536 - 8, 64, 0)
        save(a.out, "verbs_boot", rec + bytes(64 - len(rec)), counts)
    print("captured:", {k: v for k, v in sorted(counts.items())}, "from", len(streams), "streams")


if __name__ == "__main__":
    main()
