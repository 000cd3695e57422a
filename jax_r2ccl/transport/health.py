"""The health monitor of one transport endpoint: a snapshot of every NIC and rail, and the
link, failure, recovery and degradation events as they happen. The monitor itself is a C++
thread (csrc/monitor/). Transport tier: importable without JAX; knows nothing of the runtime
(jax_r2ccl.monitoring reaches the runtime's monitor)."""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterator



class HealthMonitor:
    """The monitor of one transport Endpoint (jax_r2ccl.transport.Endpoint)."""

    def __init__(self, endpoint, core=None):
        """Starts a monitor of `endpoint`, or (core) wraps one a communicator started."""
        from .. import _core
        self.endpoint = endpoint
        self._mon = core if core is not None else _core.Monitor(endpoint._ep, endpoint.config.to_core())
        self._closed = False

    def snapshot(self) -> dict:
        """Per NIC: link state as the kernel reports it, whether it carries traffic, where the
        state comes from. Per peer, per rail: state, weight, measured bandwidth (bytes/s,
        while the rail had bytes in flight), heartbeat RTT, bytes, errors, last event."""
        peers: dict[int, list[dict]] = {}
        for r in self._mon.rails():
            peers.setdefault(int(r.pop("peer")), []).append(r)
        return {"rank": self.endpoint.rank, "time": time.time(), "nics": self._mon.nics(),
                "peers": {p: sorted(rs, key=lambda r: r["rail"]) for p, rs in sorted(peers.items())}}

    def events(self, after: int = 0, timeout: float = 0.0) -> list[dict]:
        """Events with seq > after (oldest first), waiting up to `timeout` s for one."""
        return self._mon.events(int(after), float(timeout))

    def iter_events(self, after: int = 0, poll_s: float = 0.5) -> Iterator[dict]:
        """Every event from seq > after on, as it happens, until the monitor closes."""
        while not self._closed:
            for e in self.events(after, poll_s):
                after = e["seq"]
                yield e

    def on_event(self, fn: Callable[[dict], None]) -> "Subscription":
        """Calls fn(event) on a daemon thread for every event from now on."""
        return Subscription(self, fn)

    def mark_closed(self) -> None:
        """Ends iter_events() loops; the owner (a communicator) closes the monitor itself."""
        self._closed = True

    def close(self) -> None:
        self._closed = True
        self._mon.close()


class Subscription:
    """A running on_event callback; cancel() stops it."""

    def __init__(self, monitor: HealthMonitor, fn: Callable[[dict], None]):
        self._stop = threading.Event()
        existing = monitor.events()
        after = existing[-1]["seq"] if existing else 0

        def loop():
            nonlocal after
            while not self._stop.is_set() and not monitor._closed:
                for e in monitor.events(after, 0.2):
                    after = e["seq"]
                    if self._stop.is_set():
                        return
                    try:
                        fn(e)
                    except Exception as ex:  # noqa: BLE001 - a bad callback must not kill the stream
                        import logging
                        logging.getLogger("jax_r2ccl").warning("on_event callback raised: %r", ex)

        self._thread = threading.Thread(target=loop, name="r2ccl-on-event", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
