"""`python -m jax_r2ccl ...`: the same command line as the `jax-r2ccl` console script
(jax_r2ccl.tools.cli). Run from inside a source checkout, `python -m` puts the checkout
first on sys.path, so the source tree (which has no compiled _core) shadows the installed
package; then this re-runs itself with PYTHONSAFEPATH=1 (the current directory left off
sys.path) when an installed jax_r2ccl exists, and otherwise exits 2 with one line saying
what to run instead. Never a traceback."""

import importlib.machinery
import importlib.util
import os
import sys

_PROG = "python -m jax_r2ccl"


def _shadowed_by_source_tree() -> str | None:
    """The folder of the jax_r2ccl that was imported when it has no compiled core, else None."""
    here = os.path.dirname(os.path.abspath(__file__))
    if importlib.util.find_spec("jax_r2ccl._core") is not None:
        return None
    return here


def _installed_elsewhere(source_pkg: str) -> bool:
    parent = os.path.dirname(source_pkg)
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != parent]
    spec = importlib.machinery.PathFinder.find_spec("jax_r2ccl", path)
    if spec is None or not spec.submodule_search_locations:
        return False
    pkg = list(spec.submodule_search_locations)[0]
    return importlib.machinery.PathFinder.find_spec("_core", [pkg]) is not None


def main() -> int:
    src = _shadowed_by_source_tree()
    if src is not None:
        if _installed_elsewhere(src) and os.environ.get("PYTHONSAFEPATH") != "1":
            env = dict(os.environ, PYTHONSAFEPATH="1")
            os.execve(sys.executable, [sys.executable, "-m", "jax_r2ccl", *sys.argv[1:]], env)
        checkout = os.path.isfile(os.path.join(os.path.dirname(src), "pyproject.toml"))
        where = "the source tree" if checkout else "a copy"
        print(f"{_PROG}: the jax_r2ccl found first on sys.path is {where} at {src}, which has no compiled "
              f"_core{' (python -m puts the current folder first)' if checkout else ''}; install it "
              "(pip install .) and run `jax-r2ccl " + " ".join(sys.argv[1:] or ["--help"]) + "`, or run from "
              "outside the checkout", file=sys.stderr)
        return 2
    from jax_r2ccl.tools.cli import main as cli_main
    return cli_main(sys.argv[1:], prog=_PROG)


if __name__ == "__main__":
    sys.exit(main())
