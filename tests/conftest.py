"""Shared pytest setup: the harness lives beside the tests, and the two tiers.

The quick tier (`pytest -q tests`) runs every test not marked `proof`: every layer, on
loopback, as any user, in minutes. The proof tier (`pytest -q tests --proof`) adds the tests
marked `proof`: what needs root (the `testbed` marker implies `proof`), emulated guests,
sanitizers, fuzzing, the fault matrix, the soak, Bazel and the long schedules.

A quick-tier test that skips for want of root fails (it belongs to the proof tier).
`--require-all` (CI) fails every selected test that skips, unless it is marked `gpu` (a
declared missing device) or `variant` (it belongs to the other CUDA build): a check CI meant to
run must not vanish as a skip."""

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PROOF_HELP = "run the proof tier too (root, guests, sanitizers, fuzzing, the matrix, the soak, Bazel, long schedules)"
DECLARED_SKIPS = ("gpu", "variant")


def pytest_addoption(parser):
    group = parser.getgroup("jax_r2ccl")
    group.addoption("--proof", action="store_true", default=False, help=PROOF_HELP)
    group.addoption("--require-all", action="store_true", default=False,
                    help="fail a selected test that skips, unless it is marked gpu or variant (CI)")


def pytest_configure(config):
    config._r2ccl_left_out = 0


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("testbed") is not None and item.get_closest_marker("proof") is None:
            item.add_marker(pytest.mark.proof)
    if config.getoption("--proof"):
        return
    keep = [i for i in items if i.get_closest_marker("proof") is None]
    left = [i for i in items if i.get_closest_marker("proof") is not None]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = keep
        config._r2ccl_left_out = len(left)


ROOT_WORD = re.compile(r"\broot\b")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if item.get_closest_marker("proof") is None and ROOT_WORD.search(reason):
        # the quick tier runs as any user: a test that needs root belongs to the proof tier
        report.outcome = "failed"
        report.longrepr = f"a quick-tier test skipped for want of root ({reason}): mark it proof"
        return
    if not item.config.getoption("--require-all") or any(item.get_closest_marker(m) for m in DECLARED_SKIPS):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped under --require-all ({reason}): a test CI selects must run; mark it gpu or "
                       f"variant only where the skip is a declared missing device or the other build")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if config._r2ccl_left_out:
        terminalreporter.write_line(
            f"quick tier: {config._r2ccl_left_out} proof-tier tests not run (`pytest -q tests --proof` runs "
            f"them; see the README)")
