"""Prometheus metrics of the health monitor: `jax_r2ccl.monitoring.metrics.serve(port)` serves
jax_r2ccl.health() on http://ADDR:PORT/metrics (prometheus-client: pip install
"jax_r2ccl[metrics]"). Every scrape reads a fresh snapshot; nothing is cached.

Metrics (labels: rank, peer, rail, nic; NIC metrics: rank, nic):
  r2ccl_rail_up, r2ccl_rail_weight, r2ccl_rail_bandwidth_bytes_per_second,
  r2ccl_rail_rtt_seconds, r2ccl_rail_inflight_bytes, r2ccl_rail_{tx,rx,acked}_bytes_total,
  r2ccl_rail_{failures,recoveries,retransmitted_chunks}_total,
  r2ccl_nic_link_up, r2ccl_nic_admitted, r2ccl_nic_link_downs_total, r2ccl_events_total{kind}.
The NCCL net plugin's rails, when NCCL loaded it into this process, are in the same rail
metrics, their peer label naming the NCCL connection ("NCCL send connection 7")."""

from __future__ import annotations

from collections import Counter

from ..errors import R2cclError


class HealthCollector:
    """A prometheus_client collector over a HealthMonitor (default: the runtime's)."""

    def __init__(self, monitor=None):
        self._monitor = monitor
        self._events = Counter()
        self._after = 0

    def _mon(self):
        if self._monitor is not None:
            return self._monitor
        from . import runtime_monitor
        return runtime_monitor()

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        mon = self._mon()
        snap = mon.snapshot()
        for e in mon.events(self._after):
            self._after = e["seq"]
            self._events[e["kind"]] += 1
        rank = str(snap["rank"])
        labels = ["rank", "peer", "rail", "nic"]
        g = {name: GaugeMetricFamily(f"r2ccl_rail_{name}", doc, labels=labels) for name, doc in (
            ("up", "1 when the rail is up"),
            ("weight", "share of new chunks (1: full share)"),
            ("bandwidth_bytes_per_second", "measured delivered rate while the rail had bytes in flight"),
            ("rtt_seconds", "last heartbeat round trip"),
            ("inflight_bytes", "bytes dealt to the rail and not yet acknowledged"))}
        c = {name: CounterMetricFamily(f"r2ccl_rail_{name}", doc, labels=labels) for name, doc in (
            ("tx_bytes", "payload bytes written"), ("rx_bytes", "payload bytes received and applied"),
            ("acked_bytes", "bytes the peer confirmed"), ("failures", "times the rail failed"),
            ("recoveries", "times the rail came back"),
            ("retransmitted_chunks", "chunks carried for a failed sibling"))}
        from ..transport import nccl
        plugin = nccl.plugin_health() or {}
        rails_by_peer = [(str(peer), rails) for peer, rails in snap["peers"].items()]
        for r in plugin.get("rails", []):
            rails_by_peer.append((r["peer_name"], [r]))
        for peer, rails in rails_by_peer:
            for r in rails:
                lv = [rank, peer, str(r["rail"]), r["nic"]]
                g["up"].add_metric(lv, 1.0 if r["state"] == "up" else 0.0)
                g["weight"].add_metric(lv, r["weight"])
                g["bandwidth_bytes_per_second"].add_metric(lv, r["bandwidth_Bps"])
                g["rtt_seconds"].add_metric(lv, r["rtt_us"] / 1e6)
                g["inflight_bytes"].add_metric(lv, r["inflight_bytes"])
                c["tx_bytes"].add_metric(lv, r["tx_bytes"])
                c["rx_bytes"].add_metric(lv, r["rx_bytes"])
                c["acked_bytes"].add_metric(lv, r["acked_bytes"])
                c["failures"].add_metric(lv, r["failures"])
                c["recoveries"].add_metric(lv, r["recoveries"])
                c["retransmitted_chunks"].add_metric(lv, r["retransmitted_chunks"])
        link = GaugeMetricFamily("r2ccl_nic_link_up", "link state as the kernel reports it", labels=["rank", "nic"])
        adm = GaugeMetricFamily("r2ccl_nic_admitted", "1 when the NIC carries traffic (0: down or held down)",
                                labels=["rank", "nic"])
        downs = CounterMetricFamily("r2ccl_nic_link_downs", "link-down events seen", labels=["rank", "nic"])
        for n in snap["nics"]:
            lv = [rank, n["name"] or n["addr"]]
            link.add_metric(lv, 1.0 if n["link_up"] else 0.0)
            adm.add_metric(lv, 1.0 if n["admitted"] else 0.0)
            downs.add_metric(lv, n["link_downs"])
        ev = CounterMetricFamily("r2ccl_events", "health events by kind", labels=["rank", "kind"])
        for kind, count in sorted(self._events.items()):
            ev.add_metric([rank, kind], count)
        yield from (*g.values(), *c.values(), link, adm, downs, ev)


def serve(port: int, addr: str = "127.0.0.1", monitor=None):
    """Serves the metrics on http://addr:port/metrics from a daemon thread (addr="0.0.0.0"
    for a scraper on another host). Returns (server, thread); server.shutdown() stops it."""
    try:
        import prometheus_client
    except ImportError:
        raise R2cclError("jax_r2ccl.metrics needs prometheus-client (pip install 'jax_r2ccl[metrics]')") from None
    registry = prometheus_client.CollectorRegistry()
    registry.register(HealthCollector(monitor))
    return prometheus_client.start_http_server(int(port), addr=addr, registry=registry)
