"""CI helper: the supported jax range as pyproject.toml declares it, and where its ends run.

    python .ci/jax_range.py bounds            -> "LOWER UPPER" (jax>=LOWER,<UPPER)
    python .ci/jax_range.py newest            -> "VERSION PYTHON": the newest jax release in the
                                                 range that an interpreter here can install, with
                                                 that interpreter (a release whose pinned jaxlib is
                                                 not on the index yet is passed over, and said so)
    python .ci/jax_range.py python-for V      -> an interpreter that installs jax==V
Interpreters: this one, then pyenv's and PATH's python3.1x, newest first."""

import glob
import os
import re
import shutil
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bounds() -> tuple[str, str]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    spec = next(d for d in deps if re.match(r"jax\s*[<>=]", d))
    lo = re.search(r">=\s*([0-9.]+)", spec)
    hi = re.search(r"<\s*([0-9.]+)", spec)
    if not lo or not hi:
        sys.exit(f"jax_range: pyproject.toml must bound jax on both sides (jax>=A,<B), not {spec!r}")
    return lo.group(1), hi.group(1)


def key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def interpreters() -> list[str]:
    found = [sys.executable]
    for pattern in (os.path.expanduser("~/.pyenv/versions/3.1[1-9]*/bin/python3"),):
        found += glob.glob(pattern)
    for minor in range(19, 10, -1):
        p = shutil.which(f"python3.{minor}")
        if p:
            found.append(p)
    out, seen = [], set()
    for p in found:
        try:
            v = subprocess.run([p, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True,
                               text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if v and v not in seen:
            seen.add(v)
            out.append((key(v), p))
    return [p for _, p in sorted(out, reverse=True)]


def versions(python: str) -> list[str]:
    """jax releases on the index that `python` can install (pip filters by Requires-Python)."""
    r = subprocess.run([python, "-m", "pip", "index", "versions", "jax"], capture_output=True, text=True, timeout=120)
    m = re.search(r"Available versions:\s*(.*)", r.stdout)
    return [v.strip() for v in m.group(1).split(",")] if m else []


def installs(python: str, version: str) -> bool:
    """Whether pip resolves jax==version with its dependencies for `python` (jax pins its jaxlib
    exactly; the index can list a jax whose jaxlib is not there yet)."""
    r = subprocess.run([python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q", f"jax=={version}"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        why = [ln for ln in r.stderr.splitlines() if ln.startswith("ERROR: No matching")] or r.stderr.splitlines()[-1:]
        print(f"jax_range: passing over jax {version} for {python}: {' '.join(why)}", file=sys.stderr)
    return r.returncode == 0


def main() -> None:
    lo, hi = bounds()
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "bounds":
        print(lo, hi)
    elif cmd == "newest":
        best = None
        for py in interpreters():
            ok = [v for v in versions(py) if key(lo) <= key(v) < key(hi) and re.fullmatch(r"[0-9.]+", v)]
            for v in sorted(ok, key=key, reverse=True)[:5]:
                if best is not None and key(v) <= key(best[0]):
                    break
                if installs(py, v):
                    best = (v, py)
                    break
        if best is None:
            sys.exit("jax_range: no interpreter here can install a jax release in the supported range")
        print(*best)
    elif cmd == "python-for" and len(sys.argv) == 3:
        for py in interpreters():
            if sys.argv[2] in versions(py) and installs(py, sys.argv[2]):
                print(py)
                return
        sys.exit(f"jax_range: no interpreter here can install jax=={sys.argv[2]}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
