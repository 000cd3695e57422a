"""A newcomer's first command: the README's main command, read from the README (not copied),
run literally in a fresh clone of this repository, from the clone's root, in a fresh venv.
It must exit 0, and the demo must report what it checked (the fault landed inside an
all-reduce, the loss curves are bit-identical). Then `python -m jax_r2ccl` from inside the
clone runs (the installed package, not the source tree that shadows it), and without an
installed package it exits 2 with one line saying why: never a traceback."""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_commands() -> list[str]:
    """The bash blocks of the README's "Set up on a fresh machine" section, in order."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## Set up on a fresh machine", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_readme_names_a_main_and_a_test_command():
    main, test = readme_commands()[:2]
    assert "pip install" in main and "jax-r2ccl demo" in main, main
    assert "pip install" in test and "pytest" in test, test
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert test in ci, ".ci/run must run the README's test command"


def _fresh_clone(dest: str) -> None:
    if os.path.isdir(os.path.join(ROOT, ".git")) and shutil.which("git"):
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", ROOT, dest], check=True, timeout=120)
    else:   # a checkout without its history: the tracked tree, less build outputs
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(".git", "build", "__pycache__", "*.egg-info",
                                                                  "bench-results"))


def _venv_env(venv: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "R2CCL_", "VIRTUAL_ENV"))}
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = venv
    return env


@pytest.mark.timeout(1500)
def test_readme_main_command_runs_literally_in_a_fresh_clone_and_venv(tmp_path):
    main = readme_commands()[0]
    clone, venv = str(tmp_path / "clone"), str(tmp_path / "venv")
    _fresh_clone(clone)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    env = _venv_env(venv)
    r = subprocess.run(["bash", "-c", main], cwd=clone, env=env, capture_output=True, text=True, timeout=1400)
    out = r.stdout + r.stderr
    print(f"README main command: {main!r}: exit {r.returncode}")
    assert r.returncode == 0, out[-6000:]
    assert re.search(r"fault inside an all-reduce: YES \((\d+) bytes unacknowledged on rail (\d) when it went down, "
                     r"(\d+) chunks re-sent\)", out), out[-6000:]
    assert "loss curves BIT-IDENTICAL" in out and "demo: PASS" in out, out[-6000:]

    # python -m from the clone's root: the source tree comes first on sys.path; it must still run
    r = subprocess.run(["python", "-m", "jax_r2ccl", "settings"], cwd=clone, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "R2CCL_CHUNK_BYTES" in r.stdout and "Traceback" not in r.stderr, \
        (r.stdout + r.stderr)[-3000:]

    # ... and with no installed jax_r2ccl at all: exit 2, one line, no traceback
    bare = str(tmp_path / "bare")
    subprocess.run([sys.executable, "-m", "venv", bare], check=True, timeout=120)
    r = subprocess.run(["python", "-m", "jax_r2ccl", "demo"], cwd=clone, env=_venv_env(bare),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout + r.stderr)[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no compiled _core" in lines[0] and "jax-r2ccl demo" in lines[0], r.stderr
