"""The tools tier: the `jax-r2ccl` command line (cli.py), doctor, the demos, the benchmarks
(bench/), the simulator (sim/) and the network-namespace test bed (testbed.py). Tools may use
every tier below; nothing below imports a tool."""
