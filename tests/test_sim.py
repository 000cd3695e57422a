"""The simulator's model of the test bed against what the test bed measured (issue 6,
calibration): bench JSON recorded on the 2-host (500mbit) and 4-host (100mbit) beds, healthy,
one NIC down, one NIC at a tenth, and the degraded-mode plans. The files in tests/data/sim are
the benchmark's JSON output with the per-iteration records left out (BENCHMARKS.md has the
commands that made them)."""

import glob
import os
import subprocess
import sys

import pytest

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "sim")


def test_the_model_predicts_the_test_bed_within_10_percent():
    from jax_r2ccl.tools.sim.calibrate import calibrate
    rows = calibrate(sorted(glob.glob(os.path.join(DATA, "*-2h.json"))), "500mbit", 150e-6)
    rows += calibrate(sorted(glob.glob(os.path.join(DATA, "*-4h.json"))), "100mbit", 150e-6)
    assert len(rows) == 10, rows   # 3 two-host files x 2 sizes, 4 four-host files x 64 MiB
    scenarios = {tuple(r["capacities"]) for r in rows}
    assert {(4.0, 4.0), (3.0, 3.0), (4.0, 4.0, 4.0, 3.0), (4.0, 4.0, 4.0, 2.0)} <= scenarios, scenarios
    assert any(2.9 < r["capacities"][0] < 3.3 for r in rows), rows          # the NIC at a tenth
    for r in rows:
        assert abs(r["error"]) <= 0.10, r


def test_the_engine_replays_the_test_beds_fault_runs_within_10_percent():
    """The loops with a NIC failing (and healing), flapping 20 times, and failing under the
    4-host planner: the simulator replays the same faults at the same moments under
    jax_r2ccl's policy and predicts the loop's wall time."""
    from jax_r2ccl.tools.sim.calibrate import fault_trace, replay
    rows = replay(sorted(glob.glob(os.path.join(DATA, "fault-*-2h.json"))), "500mbit", 150e-6)
    rows += replay(sorted(glob.glob(os.path.join(DATA, "fault-*-4h.json"))), "100mbit", 150e-6)
    assert len(rows) == 3, rows
    for r in rows:
        assert abs(r["error"]) <= 0.10, r
        assert r["model_s"] > 1.05 * r["model_healthy_s"], r     # the fault costs something in the model
        assert r["measured_s"] > 1.05 * r["model_healthy_s"], r  # and on the bed
    tr = fault_trace("bash x/netns.sh fail 1 2; sleep 1.5; bash x/netns.sh heal 1 2", 0.3, 500e6)
    assert [(f.t, f.server, f.nic, f.kind, round(f.duration, 9)) for f in tr] == [(0.3, 1, 2, "down", 1.5)]
    tr = fault_trace("bash x/netns.sh flap 0 3 50 20; bash x/netns.sh degrade 1 0 50mbit", 1.0, 500e6)
    assert [(f.kind, f.t, f.period, f.factor) for f in tr] == [("flap", 1.0, 0.1, 0.0), ("degrade", 3.0, 0.1, 0.1)]
    tr = fault_trace("python -m jax_r2ccl testbed fail 1 2; sleep 1.5; jax-r2ccl testbed heal 1 2", 0.3, 500e6)
    assert [(f.t, f.server, f.nic, f.kind, round(f.duration, 9)) for f in tr] == [(0.3, 1, 2, "down", 1.5)]
    tr = fault_trace("/usr/bin/python3 -I /x/jax_r2ccl/tools/testbed.py blackhole 0 1; sleep 1; "
                     "/usr/bin/python3 -I /x/jax_r2ccl/tools/testbed.py degrade 0 1 base", 0.0, 500e6)
    assert [(f.kind, f.server, f.nic, f.duration) for f in tr] == [("blackhole", 0, 1, 1.0)]
    with pytest.raises(ValueError):
        fault_trace("rm -rf /", 0.0, 1.0)


def test_the_simulator_costs_are_the_planners():
    from jax_r2ccl import _core
    from jax_r2ccl.tools.sim import Cluster, allreduce_seconds, parse_rate
    assert parse_rate("500mbit") == 500e6 and parse_rate("12.5MB/s") == 100e6 and parse_rate("400gbit") == 400e9
    with pytest.raises(ValueError):
        parse_rate("fast")
    c = Cluster.testbed(4, 4, "100mbit")
    for plan in ("balance", "r2cc", "weighted", "optimal", "auto"):
        got = allreduce_seconds(c, 64 << 20, [4, 4, 4, 2], plan)
        want = _core.plan_predict(plan, [4, 4, 4, 2], float(64 << 20), c.nic_Bps, c.alpha_s)
        assert got["seconds"] == want["predicted_s"] and got["shares"] == list(want["shares"])
    big = Cluster(servers=128)   # the paper's shape: 8 GPUs and 8 NICs of 400 Gbit/s per server
    healthy = allreduce_seconds(big, 1 << 30, algo="direct")["seconds"]
    half = allreduce_seconds(big, 1 << 30, [8.0] * 127 + [4.0], algo="direct")["seconds"]
    assert 1.0 < half / healthy < 1.02   # 128 servers, owner exchange: one at half its NICs costs ~0
    # Past R2CCL_MAX_PEERS (16) auto runs two_level: 8 groups of 16 servers, 17 peers each. The
    # sim costs it with its own model: healthy within 1.05x of the owner exchange (the middle
    # groups move 2D, as the ring does, and its pipeline fills in 14 hops, not the ring's 127);
    # a server at half its NICs in a middle group owns less inside its group: +3.2% of the
    # inter-server time (15 x (1 + 16 s_h) / 8 = (1 + 16 s_l) / 4 with 15 s_h + s_l = 1).
    mid_caps = [8.0] * 60 + [4.0] + [8.0] * 67
    tl = allreduce_seconds(big, 1 << 30)
    assert tl["algo"] == "two_level" and tl["peers"] == 17, tl
    assert 1.0 < tl["seconds"] / healthy < 1.05, (tl, healthy)
    tl_mid = allreduce_seconds(big, 1 << 30, mid_caps)
    assert 1.02 < tl_mid["inter_s"] / tl["inter_s"] < 1.045 and tl_mid["plan"] == "optimal", (tl_mid, tl)
    # The ring (R2CCL_ALGO=ring), with the ring's own model: healthy within 1.2x of the owner
    # exchange (2D against 2D(P-1)/P per server, plus its fill: 127 hops of a 1 MiB piece); a
    # server at half its NICs in the middle of the ring doubles the bandwidth part of the
    # inter-server time (the ring has no degraded plan), at its end (it moves half as much
    # there) costs little.
    ring = allreduce_seconds(big, 1 << 30, algo="ring")
    assert ring["algo"] == "ring" and ring["peers"] == 2, ring
    assert 1.0 < ring["seconds"] / healthy < 1.2, (ring, healthy)
    mid = allreduce_seconds(big, 1 << 30, mid_caps, algo="ring")
    assert 1.7 < mid["inter_s"] / ring["inter_s"] < 2.01, (mid, ring)
    end = allreduce_seconds(big, 1 << 30, [8.0] * 127 + [4.0], algo="ring")
    assert end["inter_s"] / ring["inter_s"] < 1.1, (end, ring)   # (the fill's hops through it are slower)
    small = allreduce_seconds(big, 16 << 10)
    assert small["algo"] == "doubling" and small["peers"] == 13, small   # +-1, +-2, ... +-32, and 64
    with pytest.raises(ValueError):
        allreduce_seconds(big, 1 << 30, [8.0] * 3)


def test_calibrate_command_line(tmp_path):
    # run outside the checkout: `-m jax_r2ccl` must find the built package, not the source tree
    files = sorted(glob.glob(os.path.join(DATA, "*-2h.json")))
    r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "sim", "calibrate", *files, "--rate", "500mbit"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "worst error" in r.stdout and "degrade-2h.json" in r.stdout
    r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "sim", "calibrate", *files, "--rate", "250mbit"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 1, r.stdout   # a wrong rate is caught


def test_calibration_of_both_algorithms_on_the_4_and_8_host_beds():
    """bench/testbed_algos.sh on 4 and 8 hosts x 2 NICs at 50mbit (direct, ring, and on 8 hosts
    the ring with host 3 losing a NIC mid-loop, and two_level in two groups of four with
    R2CCL_MAX_PEERS=4): the model within 10% of every run, the ring's rows costed as the ring
    (its loop ends when the last process has the result), two_level's as two_level with the
    run's R2CCL_MAX_PEERS, and two_level's run with host 3 at half its NICs. (The direct
    exchange's degraded run and two_level's fault replay are off by more: BENCHMARKS.md,
    "two_level past a rack".)"""
    files = sorted(glob.glob(os.path.join(DATA, "algos-*.json")))
    assert len(files) == 6
    files.append(os.path.join(DATA, "degraded-8h-two_level-x50.json"))   # host 3 at one NIC of two
    r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "sim", "calibrate", *files, "--rate", "50mbit"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("  ")]
    assert sum(1 for x in rows if "ring" in x) == 2 and sum(1 for x in rows if "balance" in x) == 2, r.stdout
    assert sum(1 for x in rows if "two_level" in x) == 2, r.stdout
    assert any("algos-8h-ring-fault.json" in line and "fail 3 1" in line for line in r.stdout.splitlines()), r.stdout


def test_plans_at_1024_gpus_match_the_paper_model_and_the_planner_nearly_hides_the_loss():
    from jax_r2ccl.tools.sim import Cluster
    from jax_r2ccl.tools.sim.plans import table
    c = Cluster(servers=128)
    rows = {(r["x"], r["plan"]): r for r in table(c, float(1 << 30), [0.25, 0.5])}
    n = 128
    for x in (0.25, 0.5):
        # the paper's models, on the network part: Balance 1/(1-X); R2CC 1 + nX/(2(n-1)(1-X)) (to ~1%)
        assert abs(rows[(x, "balance")]["net_vs_healthy"] - 1 / (1 - x)) < 0.01
        assert abs(rows[(x, "r2cc")]["net_vs_healthy"] - (1 + n * x / (2 * (n - 1) * (1 - x)))) < 0.02
        assert rows[(x, "auto")]["ran"] == "optimal" and rows[(x, "optimal")]["net_vs_healthy"] < 1.01


def test_policy_capacities():
    from jax_r2ccl.tools.sim.policies import POLICIES, alive_gpus, capacity, job_capacities
    one_down = (1.0,) * 7 + (0.0,)
    slow = (1.0,) * 7 + (0.1,)
    cap = lambda name, f, fused=1: capacity(POLICIES[name], f, fused)
    assert cap("crash-restart", one_down) is None and cap("crash-restart", slow) == 8 * 0.1
    assert cap("nccl-failover", one_down) is None                   # not fused: no failover
    assert cap("nccl-failover", one_down, fused=2) == 4.0           # its fused sibling carries the rail
    assert cap("nccl-failover", (1.0,) * 6 + (0.0, 0.0), fused=2) is None
    assert cap("hot-repair", one_down) == 4.0                       # the backup NIC carries two rails
    assert cap("hot-repair", (0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0)) == 4.0
    assert cap("r2ccl-balance", one_down) == 7.0 and abs(cap("r2ccl-balance", slow) - 0.8) < 1e-12
    assert cap("jax_r2ccl", one_down) == 7.0 and abs(cap("jax_r2ccl", slow) - 7.1) < 1e-12
    assert cap("adapcc", one_down) == 7.0 and alive_gpus(one_down, 8) == 7
    assert all(cap(p, (0.0,) * 8) is None for p in POLICIES)        # no NIC left: nobody goes on
    # NCCL's port failover survives one failed device per communicator, not two
    nf = POLICIES["nccl-failover"]
    assert job_capacities(nf, {3: one_down}, 8, fused_ports=2) == ({3: 4.0}, 0)
    assert job_capacities(nf, {3: one_down, 9: one_down}, 8, fused_ports=2) is None
    assert job_capacities(POLICIES["r2ccl-balance"], {3: one_down, 9: one_down}, 8) == ({3: 7.0, 9: 7.0}, 0)
    assert job_capacities(POLICIES["adapcc"], {3: one_down, 9: one_down}, 8) == ({3: 7.0, 9: 7.0}, 2)


def test_training_engine_against_hand_arithmetic():
    from jax_r2ccl.tools.sim import Cluster
    from jax_r2ccl.tools.sim.engine import Restart, run_training, steady_overhead
    from jax_r2ccl.tools.sim.failures import Failure
    from jax_r2ccl.tools.sim.policies import POLICIES
    from jax_r2ccl.tools.sim.workloads import WORKLOADS
    c, wl = Cluster(servers=16), WORKLOADS["gpt-13b-dp"]
    for p in POLICIES.values():
        if not p.serving_only:
            r = run_training(c, wl, [], 3600.0, p, Restart())
            assert abs(r["overhead"]) < 1e-12 and r["crashes"] == 0, r
    T, a, d = 3600.0, 1000.0, 500.0
    trace = [Failure(a, 3, 5, "down", d)]
    # a survivable outage: the failover stall, then the degraded rate for the rest of it
    for name in ("r2ccl-balance", "r2ccl-r2cc", "jax_r2ccl", "hot-repair"):
        p = POLICIES[name]
        loss = steady_overhead(c, wl, p, {3: (1.0,) * 5 + (0.0,) + (1.0,) * 2})
        want = (p.failover_s + (d - p.failover_s) * loss) / T
        got = run_training(c, wl, trace, T, p, Restart())
        assert abs(got["overhead"] - want) < 1e-9, (name, got, want)
    # a crash: the work since the last checkpoint is lost, then nothing for the restart
    rs = Restart(restart_s=300.0, checkpoint_s=600.0)
    got = run_training(c, wl, trace, T, POLICIES["crash-restart"], rs)
    lost = (a - 600.0) + rs.restart_s            # checkpoint at 600 s; the crash at 1000 s
    assert got["crashes"] == 1 and abs(got["overhead"] - lost / T) < 1e-9, got
    # a second outage during the restart hits hardware the job has left
    got2 = run_training(c, wl, trace + [Failure(a + 100, 7, 0, "down", 50)], T, POLICIES["crash-restart"], rs)
    assert got2["crashes"] == 1 and abs(got2["overhead"] - got["overhead"]) < 1e-12
    # adapcc drops the GPU behind the NIC; on tensor/pipeline parallel it cannot, and the job stops
    ad = run_training(c, wl, trace, T, POLICIES["adapcc"], rs)
    assert ad["crashes"] == 0 and ad["overhead"] > d / T / 128
    tp = run_training(Cluster(servers=16), WORKLOADS["gpt-13b-tp-pp"], trace, T, POLICIES["adapcc"], rs)
    assert tp["crashes"] == 1


def test_flaps_and_slow_nics_are_where_the_monitor_counts():
    from jax_r2ccl.tools.sim import Cluster
    from jax_r2ccl.tools.sim.engine import Restart, run_training
    from jax_r2ccl.tools.sim.failures import Failure, expand
    from jax_r2ccl.tools.sim.policies import POLICIES
    from jax_r2ccl.tools.sim.workloads import WORKLOADS
    flap = Failure(10.0, 0, 1, "flap", 30.0, period=0.1)
    assert [(o.start, o.end) for o in expand([flap], 100.0)] == [(10.0, 40.0)]
    assert expand([flap], 100.0, holddown_s=0.1)[0].end == 40.0 + 1.6    # 16x the hold-down after many flaps
    c, wl = Cluster(servers=16), WORKLOADS["gpt-2.7b-dp"]
    slow = [Failure(100.0, 2, 0, "degrade", 1000.0, 0.1)]
    by = {n: run_training(c, wl, slow, 3600.0, POLICIES[n], Restart())["overhead"]
          for n in ("crash-restart", "r2ccl-balance", "jax_r2ccl")}
    # a NIC at a tenth: even stripes (and NCCL's rails) are paced by it, weighted stripes are not
    assert by["jax_r2ccl"] < 0.01 * by["r2ccl-balance"] and by["r2ccl-balance"] == by["crash-restart"] > 0.1
    # until the monitor re-weighs (0.6 s), the slow NIC keeps an even share
    from jax_r2ccl.tools.sim.engine import steady_overhead
    state = {2: (0.1,) + (1.0,) * 7}
    lw = steady_overhead(c, wl, POLICIES["jax_r2ccl"], state)
    le = steady_overhead(c, wl, POLICIES["r2ccl-balance"], state)
    x = 0.6 * (1 - (1 - le) / (1 - lw))          # seconds of weighted-rate work the even share costs
    want = (1000.0 * lw + x * (1 - lw)) / 3600.0
    assert abs(by["jax_r2ccl"] - want) < 1e-9, (by["jax_r2ccl"], want)


def test_serving_engine():
    from jax_r2ccl.tools.sim import Cluster
    from jax_r2ccl.tools.sim.engine import Restart, run_serving
    from jax_r2ccl.tools.sim.failures import Failure
    from jax_r2ccl.tools.sim.policies import POLICIES
    from jax_r2ccl.tools.sim.workloads import WORKLOADS
    c, wl = Cluster(servers=8), WORKLOADS["llama-70b-serve"]
    rs = Restart()
    for n in ("crash-restart", "dejavu", "jax_r2ccl"):
        r = run_serving(c, wl, [], 600.0, POLICIES[n], rs)
        assert r["overhead"] == 0 and r["requests_hit"] == 0 and r["requests"] > 0
    trace = [Failure(300.0, 5, 2, "down", 60.0)]
    by = {n: run_serving(c, wl, trace, 600.0, POLICIES[n], rs, seed=1) for n in
          ("crash-restart", "dejavu", "r2ccl-balance", "jax_r2ccl")}
    assert by["crash-restart"]["crashes"] == by["dejavu"]["crashes"] == 1
    # the same requests: the ones in flight at the crash wait at least the detection
    assert by["crash-restart"]["worst_extra_s"] >= rs.detect_s
    dv = by["dejavu"]["worst_extra_s"]
    assert rs.dejavu_detect_s + rs.dejavu_restart_s <= dv < rs.dejavu_detect_s + rs.dejavu_restart_s + 1.0
    assert 0 < by["jax_r2ccl"]["overhead"] < by["r2ccl-balance"]["overhead"] < by["dejavu"]["overhead"] \
        < by["crash-restart"]["overhead"], by
    for r in by.values():   # the latency overhead is the TTFT and decode overheads, weighted
        lo, hi = sorted((r["ttft_overhead_active"], r["tpot_overhead_active"]))
        assert 0 < lo <= r["overhead_active"] <= hi, r


def test_the_papers_rows():
    from jax_r2ccl.tools.sim import paper
    rows = {(r["servers"], r["workload"], r["policy"]): r for r in paper.megatron(2) + paper.megatron(4)}
    dp = lambda p: rows[(2, "gpt-2.7b-dp", p)]
    # the workload's compute rate reproduces the figure's fault-free throughput
    assert abs(dp("r2ccl-balance")["tokens_per_s"] / 314618 - 1) < 0.01
    # DP 2.7B, one NIC down: every bar within a factor of 1.5 of the figure
    for p in ("adapcc", "hot-repair", "r2ccl-balance", "r2ccl-r2cc"):
        assert 1 / 1.5 <= dp(p)["ratio"] <= 1.5, dp(p)
    assert dp("crash-restart")["model"] is None and rows[(2, "gpt-13b-tp-pp", "adapcc")]["model"] is None
    assert dp("r2ccl-r2cc")["model"] < dp("hot-repair")["model"] < dp("adapcc")["model"]
    # four servers: R2CC-AllReduce beats Balance, the planner beats both
    four = lambda p: rows[(4, "gpt-2.7b-dp", p)]["model"]
    assert four("jax_r2ccl") < four("r2ccl-r2cc") < four("r2ccl-balance")
    # at scale, NICs going down: R2CCL under 1% (data-parallel training, while a failure is in
    # force) and under 3% (serving), as the paper says
    hl = paper.headline(paper.at_scale(2, 0.002))
    assert hl["gpt-2.7b-dp"]["r2ccl_overhead_active"] < 0.01, hl
    assert hl["llama-70b-serve"]["r2ccl_overhead_active"] < 0.03, hl
    # jax_r2ccl's owner exchange and planner beat R2CCL's plans, and so does the default past
    # R2CCL_MAX_PEERS (16), two_level, whose groups plan inside themselves; the chain has no
    # degraded plan: it loses what R2CCL's Balance loses (the ring of a server at 1 - X takes
    # 1/(1 - X) as long), not more.
    assert all(h["jax_r2ccl_direct_overhead"] < h["r2ccl_overhead"] for h in hl.values()), hl
    assert all(h["jax_r2ccl_overhead"] < h["r2ccl_overhead"] for h in hl.values()), hl
    assert all(h["jax_r2ccl_chain_overhead"] <= 1.05 * h["r2ccl_balance_overhead"] + 1e-5 for h in hl.values()), hl


def test_sim_command_line(tmp_path):
    import json
    out, png = tmp_path / "sim.json", tmp_path / "sim.png"
    r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "sim", "--gpus", "1024", "--workload", "gpt-13b-tp-pp",
                        "--failures", "poisson:0.01", "--policies", "all", "--seed", "2", "--json", str(out),
                        "--plot", str(png)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())["results"]
    assert {x["policy"] for x in res} == {"crash-restart", "nccl-failover", "adapcc", "hot-repair",
                                         "r2ccl-balance", "r2ccl-r2cc", "jax_r2ccl", "jax_r2ccl-direct",
                                         "jax_r2ccl-chain"}
    # 64 replicas of 2 stages: four groups of 16 (15 peers in the group, a column neighbour each side)
    assert "algorithm two_level, 17 peers and 136 connections per host" in r.stdout, r.stdout
    assert all({"policy", "workload", "gpus", "overhead", "failures"} <= set(x) and x["gpus"] == 1024
               and x["workload"] == "gpt-13b-tp-pp" for x in res)
    assert png.stat().st_size > 1000
    r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "sim", "--list"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and "llama-70b-serve" in r.stdout and "dejavu" in r.stdout, r.stdout + r.stderr
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps([{"t": 60, "server": 1, "nic": 3}, {"t": 90, "server": 2, "nic": 0, "kind": "flap",
                                                                     "duration": 20}]))
    r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "sim", "run", "--gpus", "32", "--workload",
                        "llama-70b-serve", "--failures", str(trace), "--hours", "0.1", "--policies",
                        "dejavu,jax_r2ccl"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and "dejavu" in r.stdout, r.stdout + r.stderr
    for bad, why in ((["--gpus", "1000", "--workload", "gpt-13b-tp-pp"], "do not split"),
                     (["--policies", "dejavu"], "serving workloads only"),
                     (["--policies", "nope"], "unknown policies"),
                     (["--failures", "poisson:fast"], "poisson:RATE"),
                     (["--failures", str(tmp_path / "missing.json")], "trace file")):
        r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "sim", *bad], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
        assert r.returncode == 2 and why in r.stderr, (bad, r.stdout, r.stderr)
    trace.write_text(json.dumps([{"t": 60, "server": 99, "nic": 3}]))
    r = subprocess.run([sys.executable, "-m", "jax_r2ccl", "sim", "--gpus", "32", "--failures", str(trace)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and "outside the cluster" in r.stderr, r.stderr


def test_textbook_collectives_agree_with_the_planner():
    from jax_r2ccl.tools.sim import Cluster
    from jax_r2ccl.tools.sim.costs import alltoall_seconds, exchange, p2p_seconds, ring_allreduce_seconds, \
        tree_allreduce_seconds
    c = Cluster(servers=16)
    caps, D = [8.0] * 15 + [6.0], float(1 << 30)
    # the ring and the planner's Balance move the same bytes through the slowest server
    ring = ring_allreduce_seconds(caps, D, c.nic_Bps, 0.0)
    bal = exchange(caps, D, c.nic_Bps, 0.0, "balance")["predicted_s"]
    assert abs(ring / bal - 1) < 1e-9, (ring, bal)
    assert abs(ring - 2 * 15 / 16 * D / (6 * c.nic_Bps)) < 1e-12
    # the double binary tree: the ring's bandwidth for large messages, far less latency for small
    assert 0.99 < tree_allreduce_seconds(caps, D, c.nic_Bps, 0.0, chunks=256) / ring < 1.1   # 2D vs 2(P-1)/P D
    small = lambda f: f(caps, 4096.0, c.nic_Bps, 1e-5)
    assert small(lambda *a: tree_allreduce_seconds(*a, chunks=1)) < small(ring_allreduce_seconds) / 3
    assert abs(alltoall_seconds(caps, D, c.nic_Bps, 0.0) - 15 / 16 * D / (6 * c.nic_Bps)) < 1e-12
    assert p2p_seconds(8, 3, D, c.nic_Bps, 1e-5) == 1e-5 + D / (3 * c.nic_Bps)


def test_a_black_hole_costs_the_stall_timer_where_a_link_event_costs_milliseconds():
    from jax_r2ccl.tools.sim import Cluster
    from jax_r2ccl.tools.sim.engine import Restart, run_training, steady_overhead
    from jax_r2ccl.tools.sim.failures import Failure, poisson
    from jax_r2ccl.tools.sim.policies import POLICIES
    from jax_r2ccl.tools.sim.workloads import WORKLOADS
    c, wl, p = Cluster(servers=16), WORKLOADS["gpt-13b-dp"], POLICIES["jax_r2ccl"]
    loss = steady_overhead(c, wl, p, {3: (1.0,) * 5 + (0.0,) + (1.0,) * 2})
    for kind, stall in (("down", 0.005), ("blackhole", 0.25)):
        got = run_training(c, wl, [Failure(100.0, 3, 5, kind, 50.0)], 3600.0, p, Restart())
        assert abs(got["overhead"] - (stall + (50.0 - stall) * loss) / 3600.0) < 1e-9, (kind, got)
    kinds = {f.kind for f in poisson(c, 5.0, 3600.0, 0, blackhole_fraction=0.5, degrade_fraction=0.2)}
    assert kinds == {"down", "blackhole", "degrade"}
    with pytest.raises(ValueError):
        poisson(c, 1.0, 3600.0, 0, blackhole_fraction=0.7, degrade_fraction=0.5)
