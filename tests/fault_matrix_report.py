"""Renders the fault matrix's rows (build/fault-matrix.json, written by
tests/test_fault_matrix.py) as the table in docs/faults.md, between its markers.

    python tests/fault_matrix_report.py [build/fault-matrix.json] [docs/faults.md]
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- fault-matrix:begin -->", "<!-- fault-matrix:end -->"
KINDS = [("all_reduce", "psum"), ("all_gather", "all_gather"), ("reduce_scatter", "psum_scatter"),
         ("all_to_all", "all_to_all")]
FAULTS = ["fail", "flap", "blackhole", "degrade", "all_but_one", "all_nics_1s", "all_nics_held", "kill", "stop",
          "mismatch"]


def _ms(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s >= 0.0095 else f"{s * 1e3:.1f} ms"


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def cell(row: dict) -> str:
    if row["outcome"] == "bit-exact":
        return f"exact: {_ms(row['worst_s'])} ({_ms(row['healthy_s'])})"
    cause = row["outcome"].split(": ", 1)[1]
    return f"{cause} in {row['fail_s']:.2f} s"


def table(data: dict) -> str:
    rows = data["rows"]
    sizes = sorted({r["nbytes"] for r in rows})
    head = ["fault", "hosts"] + [f"{jax} {_size(n)}" for n in sizes for _, jax in KINDS]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    seen = {(r["fault"], r["hosts"], r["kind"], r["nbytes"]): r for r in rows}
    for fault in FAULTS:
        for hosts in (2, 4):
            if not any(k[0] == fault and k[1] == hosts for k in seen):
                continue
            line = [fault, str(hosts)]
            for n in sizes:
                for kind, _ in KINDS:
                    r = seen.get((fault, hosts, kind, n))
                    line.append(cell(r) if r else "not run")
            out.append("| " + " | ".join(line) + " |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    src = argv[1] if len(argv) > 1 else os.path.join(ROOT, "build", "fault-matrix.json")
    doc = argv[2] if len(argv) > 2 else os.path.join(ROOT, "docs", "faults.md")
    with open(src) as f:
        data = json.load(f)
    with open(doc) as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        print(f"{doc} has no {BEGIN} ... {END} markers", file=sys.stderr)
        return 2
    meta = (f"Test bed: 2 or 4 namespace hosts x 4 NICs at {data['rate']}; R2CCL_TIMEOUT "
            f"{data['timeout_s']:g} s for the faults that end a job ({data['survive_timeout_s']:g} s for the "
            f"others); stated slack {data['slack_s']:g} s. {len(data['rows'])} cells.")
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    with open(doc, "w") as f:
        f.write(before + BEGIN + "\n" + meta + "\n\n" + table(data) + "\n" + END + after)
    print(f"{doc}: {len(data['rows'])} cells")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
