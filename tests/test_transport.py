"""The multi-rail transport on loopback: several processes, several "NICs" (127.0.0.x),
faults injected in software mid-transfer. Every transfer is checked byte for byte."""

import time

import numpy as np
import pytest

from harness import LOOPBACK4, SANITIZED, run_ranks


def results(rs):
    return [r["result"] for r in rs]


@pytest.mark.parametrize("world", [2, 3])
def test_every_pair_exchanges_bit_exact_over_four_rails(world):
    # Two rounds. CI once saw one rail carry under 1 MiB of a single round, all rails up, no
    # failure, bytes exact; 85 runs here (idle and under 3-4 busy loops) never did. The likely
    # cause: that rail's first rate samples fell in a moment the loaded 2-core machine
    # descheduled the process, so it began the 24 MiB burst (about 30 ms on loopback) with a
    # small window. The check is that the large messages are striped, not one burst's start.
    sizes = [0, 1, 4096 + 3, 1 << 20, 24 << 20]
    res = results(run_ranks("exchange", world, args={"sizes": sizes, "rounds": 2}))
    for r in res:
        assert r["wrong"] == 0
        for peer, rails in r["stats"].items():
            brief = [(s["rail"], s["state"], s["tx_bytes"] >> 10, s["failures"], s["recoveries"],
                      s["retransmitted_chunks"], round(s["last_change_unix_s"] % 100, 4)) for s in rails]
            assert len(rails) == 4 and all(s["state"] == "up" for s in rails), brief
            # striping: every rail carried part of the large messages (each rail's fair share
            # is 12 MiB of the 48 MiB sent to each peer)
            assert all(s["tx_bytes"] > 1 << 20 for s in rails), ("rail, state, tx KiB, failures, recoveries, "
                                                                  "resent, last change s", brief)


def test_unequal_nic_counts_pair_up_and_stay_exact():
    res = results(run_ranks("exchange", 2, per_rank_nics=[LOOPBACK4, LOOPBACK4[:2]],
                            args={"sizes": [5 << 20]}))
    assert all(r["wrong"] == 0 for r in res)
    assert all(len(r["stats"]["1" if i == 0 else "0"]) == 4 for i, r in enumerate(res))


def test_two_connections_per_nic_pair():
    res = results(run_ranks("exchange", 2, config={"conns_per_nic": 2}, args={"sizes": [9 << 20]}))
    assert all(r["wrong"] == 0 for r in res)
    assert len(res[0]["stats"]["1"]) == 8


def test_messages_match_by_tag_and_order_even_when_received_late():
    res = results(run_ranks("tags_out_of_order", 2))
    assert res[1] and all(res[1].values()), res[1]


@pytest.mark.parametrize("io_threads", [0, 2])
@pytest.mark.parametrize("fault", ["close", "stall"])
@pytest.mark.parametrize("side", [0, 1])
def test_rail_fault_mid_transfer_is_bit_exact(fault, side, io_threads):
    # 4 rails capped at 40 MB/s each: 48 MiB takes ~0.3 s; the fault lands at 0.1 s. With
    # io_threads 2 the rails' socket calls run on two I/O threads per process.
    n = 48 << 20
    res = results(run_ranks("transfer_with_fault", 2, config={"io_threads": io_threads}, args=dict(
        nbytes=n, fault=fault, fault_rail=1, fault_side=side, fault_after_s=0.1, rate=40e6)))
    r0, r1 = res
    assert r1["wrong"] == 0
    # the side that holds the fault keeps rail 1 down; the sender always saw it fail (for a
    # stall on the receiver's side, the receiver's own silence timer may not have fired yet).
    # Under a sanitizer the stall timer's drain allowance (bytes in flight over the measured
    # rate) grows with the slowdown, and the transfer may end before it runs out.
    if not SANITIZED or fault == "close":
        assert r0["stats"][1]["failures"] >= 1, r0["stats"]
    if fault == "close":
        assert (r0 if side == 0 else r1)["stats"][1]["state"] != "up", (r0["stats"], r1["stats"])
    tx = [s["tx_bytes"] for s in r0["stats"]]
    assert sum(tx) >= n, tx
    if not SANITIZED:   # rates: under a sanitizer the cores, not the 40 MB/s caps, set them
        # the healthy rails took over what rail 1 left: > 1/4 of the bytes each
        assert min(tx[0], tx[2], tx[3]) > n / 4, tx
        # bounded: at 3 × 40 MB/s the whole transfer needs 0.42 s; detection adds <= stall_ms
        assert r1["times"][0] < 3.0


def test_exchanges_are_bit_exact_with_io_threads():
    # R2CCL_IO_THREADS=2: four loopback NICs dealt over two I/O threads in each of three
    # processes. No striping claim: on 2 CPUs the threads compete for the cores.
    sizes = [0, 1, 4096 + 3, 40000, 1 << 20, 24 << 20]
    res = results(run_ranks("exchange", 3, config={"io_threads": 2}, args={"sizes": sizes, "rounds": 2}))
    for r in res:
        assert r["wrong"] == 0, r
        for peer, rails in r["stats"].items():
            assert len(rails) == 4, rails
            # No spurious failure on a healthy network. Under ThreadSanitizer a peer's 4 rails were
            # read down once here (2026-12-06; bytes exact, no TSan report), most likely three
            # processes of ~10 threads on 2 cores starved past the silence timer (3 x 100 ms; the
            # reason was not kept). A timing claim, so the plain run's (harness.SANITIZED).
            if not SANITIZED:
                assert all(s["state"] == "up" for s in rails), rails


def test_rate_capped_rail_does_not_corrupt():
    res = results(run_ranks("transfer_with_fault", 2, args=dict(nbytes=16 << 20, fault="rate", rate=None)))
    assert res[1]["wrong"] == 0


def test_failed_rail_is_readmitted_and_carries_traffic():
    res = results(run_ranks("failback", 2))
    r0 = res[0]
    assert res[1]["ok"]
    assert r0["up_after_s"] < 1.0, r0
    assert r0["carried"] > 0, r0
    assert r0["stats"][2]["recoveries"] >= 1


def test_all_rails_down_is_a_clear_error_naming_the_peer_within_timeout():
    rs = run_ranks("all_rails_down", 2, config={"timeout_s": 1.5})
    for rank, r in enumerate(results(rs)):
        assert r["error"], r
        assert r["cause"] == "all_rails_down" and r["peer"] == 1 - rank, r
        assert f"rank {1 - rank}" in r["error"]
        assert r["after_s"] < 1.5 + 1.0, r


def test_killed_peer_is_reported_quickly_without_hang():
    rs = run_ranks("killed_peer", 2, may_die={1}, timeout=60)
    assert rs[1].get("died")
    r = rs[0]["result"]
    assert r["error"] and r["cause"] == "peer_gone" and r["peer"] == 1, r
    assert "rank 1" in r["error"]
    assert r["after_s"] < 5.0, r


def test_strangers_on_the_listen_port_are_rejected_and_the_transfer_is_exact():
    rs = run_ranks("strangers", 2)
    r = rs[1]["result"]
    assert r["exact"]
    # nobody but the job got a challenge: garbage and foreign jobs get nothing back
    assert r["answers"]["garbage"] == 0 and r["answers"]["http"] == 0 and r["answers"]["other_job"] == 0, r
    assert r["answers"]["short_hello"] == 0, r
    import cluster
    if not cluster.active():   # multi-host mode runs ranks in-process: their log is the host's stderr
        assert "rejected connection" in rs[1]["output"]
        assert "hello of wrong length" in rs[1]["output"], rs[1]["output"][-2000:]
    assert all(s["failures"] == 0 for s in r["stats"]), r["stats"]


@pytest.mark.parametrize("poll_us", [250, 0])
def test_small_sends_on_the_callers_path_keep_their_order_behind_large_ones(poll_us):
    r0, r1 = results(run_ranks("caller_path_order", 2, config={"poll_us": poll_us}))
    assert r1["wrong"] == [] and r1["n"] == 200, r1


def test_threads_sharing_the_callers_path_each_get_every_message_exactly():
    r0, r1 = results(run_ranks("caller_path_threads", 2))
    for r in (r0, r1):
        assert r["errors"] == [] and r["alive"] == 0 and r["counts"] == [300] * 4, r


def test_bad_input_is_a_clear_error_and_the_channel_survives():
    rs = results(run_ranks("bad_input", 2))
    for r in rs:
        for name in ("non_contiguous", "read_only", "not_array", "bad_peer", "self_peer", "bad_rail",
                     "bad_fault", "bad_weight"):
            assert r[name] is not None and r[name][0] == "invalid_argument", (name, r[name])
    assert rs[1]["size_mismatch"][0] == "mismatch" and "999" in rs[1]["size_mismatch"][1]
    assert rs[1]["recv_timeout"][0] == "timeout" and rs[1]["recv_timeout_s"] < 2.0
    assert rs[1]["after_ok"]


def test_idle_endpoint_does_not_burn_a_core():
    rs = results(run_ranks("idle_cpu", 2, config={"heartbeat_ms": 100}))
    for r in rs:
        assert r["cpu_s"] < 0.1 * r["wall_s"], r


def test_timed_out_send_is_abandoned_cleanly_on_both_sides():
    r0, r1 = results(run_ranks("cancelled_send", 2))
    assert r0["send"][0] == "timeout", r0
    assert r1["recv"] is not None and "abandoned" in r1["recv"][1], r1
    assert r1["after_ok"]


@pytest.mark.parametrize("eager", [True, False])
def test_small_sends_complete_when_copied_and_arrive_exactly(eager):
    # R2CCL_EAGER_BYTES: a small send finishes as soon as its bytes are copied, even with
    # every rail stalled, and the caller may reuse the buffer at once; a large one (and with
    # R2CCL_EAGER_BYTES=0 every one) waits for its acks. Small sends followed at once by
    # close() still arrive, bit for bit.
    # (Small windows, 4 x 32 KiB: the 192 KiB sent before the close cannot all leave without
    # acks, so the close must wait for them.)
    small = {"chunk_bytes": 16 << 10, "rail_window_bytes": 32 << 10}
    r0, r1 = results(run_ranks("eager_sends", 2, args={"eager": eager},
                               config=small if eager else {**small, "eager_bytes": 0}))
    n = 48 if eager else 4
    assert r0["small_finished_while_stalled"] == (n if eager else 0), r0
    assert r0["large_done_while_stalled"] is False, r0
    assert r1["large_exact"] and r1["wrong"] == [], r1


def test_an_undeliverable_eager_send_fails_the_next_operation_with_that_peer():
    # Every rail down past R2CCL_TIMEOUT after an eager send had finished: the sender's next
    # operation with that peer fails naming it; the receiver learns it was abandoned; then
    # the channel carries traffic again.
    r0, r1 = results(run_ranks("eager_undeliverable", 2, config={"timeout_s": 1.0}, timeout=60))
    cause, peer, msg = r0["next"]
    assert cause == "all_rails_down" and peer == 1, r0
    assert "eager send" in msg and "never delivered" in msg and "4096 bytes, tag 1" in msg, msg
    assert r1["recv"] is not None and "abandoned" in r1["recv"][1], r1
    assert r1["after_ok"], r1


@pytest.mark.parametrize("weights", [[3, 1, 1, 1], [1, 0, 1, 1]])
def test_rail_weights_steer_the_split(weights):
    r0, r1 = results(run_ranks("weighted_split", 2, args={"weights": weights}))
    assert r1["exact"]
    total = sum(r0["bytes"])
    shares = [b / total for b in r0["bytes"]]
    # Weights scale each rail's share of the in-flight window and order the dealing; the
    # split that results depends on what bounds each rail (its link, or on loopback the
    # CPU), so this checks what must hold everywhere: weight 0 carries nothing new, every
    # weighted rail carries some. (The health monitor of the next issue sets the weights.)
    for share, w in zip(shares, weights):
        assert (share == 0) if w == 0 else (share > 0), (shares, weights)


def test_transport_choice_without_rdma_is_sockets_and_ibverbs_is_a_clear_error():
    # This host has no RDMA port on 127.0.0.x (tests/test_verbs.py runs verbs in guests).
    from jax_r2ccl import _core
    from jax_r2ccl.config import Config
    from jax_r2ccl.errors import R2cclError
    from jax_r2ccl.transport import Endpoint
    if _core.verbs_status(["127.0.0.1"])["nics"]["127.0.0.1"] == "ibverbs":
        pytest.skip("127.0.0.1 maps to an RDMA port here")
    ep = Endpoint(0, 2, nics=["127.0.0.1", "127.0.0.2"], config=Config.from_env(env={}), secret=b"s" * 32)
    try:
        assert ep.config.transport == "auto" and ep.transports == ["socket", "socket"]
        assert all(":" in a and not a.startswith("ibverbs:") for a in ep.addresses)
        # A peer whose NIC speaks verbs where ours speaks sockets: refused at once, both named.
        with pytest.raises(R2cclError, match=r"uses socket, the peer's NIC 127\.0\.0\.9:4000 uses ibverbs") as e:
            ep.add_peer(1, ["ibverbs:127.0.0.9:4000", "127.0.0.9:4001"])
        assert e.value.cause == "invalid_argument" and e.value.peer == 1
        # An address naming a transport this build lacks (net/registry.cc): refused, named.
        with pytest.raises(R2cclError, match=r"address 'rdma9:127\.0\.0\.9:4000' names transport 'rdma9', "
                                             r"which this build does not have"):
            ep.add_peer(1, ["rdma9:127.0.0.9:4000"])
    finally:
        ep.close()
    with pytest.raises(R2cclError, match=r"R2CCL_TRANSPORT=ibverbs: NIC 127\.0\.0\.1: .+") as e:
        Endpoint(0, 1, nics=["127.0.0.1"], config=Config.from_env(env={"R2CCL_TRANSPORT": "ibverbs"}),
                 secret=b"s" * 32)
    assert e.value.cause == "system"
    assert _core.verbs_status([])["unavailable"] in str(e.value)


def test_a_dma_buf_registration_over_sockets_is_refused_with_the_reason_and_nothing_breaks():
    # GPUDirect's registration (Endpoint.register_dmabuf, the plugin's regMrDmaBuf): sockets
    # move bytes with the CPU, so they take no dma-buf; the refusal names the transport, and a
    # plain registration and a registered exchange work after it.
    for r in results(run_ranks("dmabuf_register", 2)):
        why = "the CPU copies every byte (only an RDMA NIC reads memory itself)"
        assert r["support"] == "socket: " + why, r
        assert r["registered"] is False and r["cause"] == "invalid_argument", r
        assert "registering a dma-buf (GPUDirect) over socket: " + why in r["error"], r
        assert r["bad_fd"][0] == "invalid_argument" and "fd -1" in r["bad_fd"][1], r
        assert r["after"] == 0
