"""The `jax-r2ccl` command line (also `python -m jax_r2ccl`): `demo` (jax_r2ccl.tools.demo),
`bench p2p|allreduce|...|timeline` (tools/bench/), `doctor` (what this host has), `sim`
(tools/sim/), `soak` (a random-fault soak, tools/soak.py), `testbed` (the network-namespace test bed, tools/testbed.py) and `settings`.
Each subcommand imports its module only when it runs."""

from __future__ import annotations

import argparse
import os
import sys


def _runs(module: str, jax_cpu: bool = False):
    """The handler of a subcommand: imports jax_r2ccl.<module> only when it runs and calls its
    main(args). jax_cpu: JAX_PLATFORMS=cpu before anything imports jax."""
    def handler(args: argparse.Namespace) -> int:
        if jax_cpu:
            os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import importlib
        return importlib.import_module(f"{__package__}.{module}").main(args)
    return handler


def _settings(args: argparse.Namespace) -> int:
    from ..config import settings_table
    print(settings_table(), end="")
    return 0


def build_parser(prog: str = "jax-r2ccl") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog,
                                     description="jax_r2ccl: fault-tolerant multi-NIC communication for JAX")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    bench = sub.add_parser("bench", help="benchmarks (run one process per host)")
    bench_sub = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
    from .bench import p2p   # argument definitions only: imports numpy, not jax
    p = bench_sub.add_parser("p2p", help="point-to-point bandwidth, rank 2k -> 2k+1, every byte checked",
                             description=p2p.__doc__)
    p2p.add_args(p)
    p.set_defaults(handler=_runs("bench.p2p", jax_cpu=True))

    from .bench import collective
    for name in collective.OPS:
        c = bench_sub.add_parser(name, help=f"{name} bandwidth through the JAX custom calls (nccl-tests table)",
                                 description=collective.__doc__)
        collective.add_args(c)
        c.set_defaults(handler=_runs("bench.collective", jax_cpu=True))

    from .bench import gpu
    g = bench_sub.add_parser("gpu", help="the GPU check's table: staging, kernels, FFI overhead, busbw on GPU vs CPU",
                             description=gpu.__doc__)
    gpu.add_args(g)
    g.set_defaults(handler=_runs("bench.gpu"))

    from .bench import timeline
    t = bench_sub.add_parser("timeline", help="per-rail throughput over time through a fault sequence (JSON + PNG)",
                             description=timeline.__doc__)
    timeline.add_args(t)
    t.set_defaults(handler=_runs("bench.timeline", jax_cpu=True))

    from . import doctor
    d = sub.add_parser("doctor", help="NICs, GPUs, RDMA devices, topology and the configuration in force",
                       description=doctor.__doc__)
    doctor.add_args(d)
    d.set_defaults(handler=_runs("doctor"))

    sim = sub.add_parser("sim", help="the large-scale simulator: `sim [run] --gpus 1024 ...`, sim paper|plans|calibrate",
                         description="The large-scale simulator (docs/sim.md). `sim --gpus 1024 ...` is `sim run`.")
    sim_sub = sim.add_subparsers(dest="sim", metavar="SIM", required=True)
    from .sim import calibrate
    cal = sim_sub.add_parser("calibrate", help="the model of the test bed against measured bench JSON",
                             description=calibrate.__doc__)
    calibrate.add_args(cal)
    cal.set_defaults(handler=_runs("sim.calibrate"))
    from .sim import plans as sim_plans
    sp = sim_sub.add_parser("plans", help="every all-reduce plan at scale, one server degraded",
                            description=sim_plans.__doc__)
    sim_plans.add_args(sp)
    sp.set_defaults(handler=_runs("sim.plans"))
    from .sim import run as sim_run
    sr = sim_sub.add_parser("run", help="a training or serving job through a NIC failure trace, per policy (default)",
                            description=sim_run.__doc__)
    sim_run.add_args(sr)
    sr.set_defaults(handler=_runs("sim.run"))
    from .sim import paper as sim_paper
    spp = sim_paper.add_args
    pp = sim_sub.add_parser("paper", help="the R2CCL paper's evaluation, row by row, model beside paper",
                            description=sim_paper.__doc__)
    spp(pp)
    pp.set_defaults(handler=_runs("sim.paper"))

    sub.add_parser("demo", help="the fault-tolerance demo: `demo --help` for its options",
                   add_help=False)
    sub.add_parser("soak", help="a random-fault soak on the test bed (root): `soak --help` for its options",
                   add_help=False)
    from . import testbed
    tb = sub.add_parser("testbed", help="the network-namespace test bed: hosts x NICs, rate limits, faults (root)",
                        description=testbed.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    testbed.add_args(tb)
    tb.set_defaults(handler=_runs("testbed"))
    st = sub.add_parser("settings", help="print every R2CCL_* setting as a markdown table")
    st.set_defaults(handler=_settings)
    return parser


SIM_COMMANDS = ("run", "paper", "plans", "calibrate", "-h", "--help")


def main(argv: list[str] | None = None, prog: str = "jax-r2ccl") -> int:
    """The console script `jax-r2ccl` (and `python -m jax_r2ccl`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "demo":   # the demo parses its own arguments (and re-runs itself per process)
        from . import demo
        return int(demo.main(argv[1:]) or 0)
    if argv and argv[0] == "soak":   # so does the soak
        from . import soak
        return int(soak.main(argv[1:]) or 0)
    if argv and argv[0] == "sim" and (len(argv) == 1 or argv[1] not in SIM_COMMANDS):
        argv.insert(1, "run")   # `sim --gpus 1024 ...` runs the simulation
    args = build_parser(prog).parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
