"""Collectives over numpy buffers, one process's part at a time: the same executor and
algorithms the JAX custom calls use (csrc/coll/), callable without JAX for tests and
benchmarks. A group is given as the process of each rank, in rank order; a process passes
one buffer per rank it holds. Every process must issue the same collectives in the same
order (each call's messages are tagged by its position in that order)."""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from .. import _core
from ..errors import R2cclError
from .endpoint import Endpoint

# What the executor accepts, by the core's own names (csrc/coll), so a new kind, reduction or
# dtype there is one here.
_NAMES = _core.names()
KINDS = tuple(_NAMES["kinds"])
OPS = tuple(_NAMES["reduce_ops"])
DTYPES = tuple(_NAMES["dtypes"])


def output_count(kind: str, count: int, n_ranks: int) -> int:
    if kind == "reduce_scatter":
        return count // n_ranks
    if kind == "all_gather":
        return count * n_ranks
    return count


class HostCollectives:
    """Process-level collectives over an Endpoint (whose rank is this process's id)."""

    def __init__(self, endpoint: Endpoint, name: str = "host"):
        self._ep = endpoint
        self._ex = _core.Collectives(endpoint._ep, endpoint.rank)
        self._name = name
        self._calls = 0

    def _tag(self, key: str | None = None) -> int:
        if key is None:
            self._calls += 1
            key = str(self._calls)
        else:
            key = "key:" + key
        digest = hashlib.blake2b(f"{self._name}/{key}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    def run(self, kind: str, inputs: Sequence[np.ndarray], *, process_of_rank: Sequence[int],
            my_ranks: Sequence[int], op: str = "sum", root: int = 0, timeout: float | None = None,
            outputs: Sequence[np.ndarray] | None = None, plan: str = "", key: str | None = None,
            algo: str = "", perm: Sequence[int] | None = None, ragged: Sequence | None = None) -> list[np.ndarray]:
        """plan: the all-reduce plan for this call (default R2CCL_PLAN); equal on every process.
        perm: "permute" only: each rank's destination rank, or -1 (sends nothing); a rank no
        one sends to gets zeros. Equal on every process.
        ragged: "ragged_all_to_all" only (jax.lax.ragged_all_to_all): per local rank,
        (input_offsets, send_sizes, output_offsets, recv_sizes), each K = n * s integers (s slices
        per peer) counting rows, a row being an input's slice along its first axis. `outputs`
        (required: rows of the same shape) hold the result's initial value; only the received
        slices are written into them, in place.
        algo: the algorithm for this call (default R2CCL_ALGO); equal on every process.
        key: names this call on every process, so threads may issue calls concurrently and in
        any order; no other call of this object may use the same key. Without it, calls are
        matched by their order on this object, which must then be the same on every process."""
        if kind not in KINDS:
            raise R2cclError(f"unknown collective {kind!r}; one of {', '.join(KINDS)}")
        if op not in OPS:
            raise R2cclError(f"unknown reduction {op!r}; one of {', '.join(OPS)}")
        inputs = [np.ascontiguousarray(a) for a in inputs]
        if not inputs:
            raise R2cclError("no input buffers (one per local rank is needed)")
        dtype = inputs[0].dtype
        if dtype.name not in DTYPES:
            raise R2cclError(f"dtype {dtype.name} is not supported; supported: {', '.join(DTYPES)}")
        if any(a.dtype != dtype or a.size != inputs[0].size for a in inputs):
            raise R2cclError("every local input must have the same dtype and size")
        count = int(inputs[0].size)
        n = len(process_of_rank)
        want = output_count(kind, count, n)
        row_elems, slices = 1, []
        if kind == "ragged_all_to_all":
            if outputs is None or ragged is None:
                raise R2cclError("ragged_all_to_all needs outputs= (the result's initial values) and ragged= "
                                 "(input_offsets, send_sizes, output_offsets, recv_sizes per local rank)")
            row_elems = int(np.prod(inputs[0].shape[1:], dtype=np.int64)) if inputs[0].ndim else 1
            want = int(np.asarray(outputs[0]).size)
            if any(np.asarray(o).shape[1:] != inputs[0].shape[1:] for o in outputs):
                raise R2cclError("ragged_all_to_all's outputs must have the inputs' row shape "
                                 f"{tuple(inputs[0].shape[1:])}")
            if len(ragged) != len(inputs):
                raise R2cclError(f"{len(ragged)} sets of ragged slices for {len(inputs)} local ranks")
            slices = [[[int(v) for v in np.asarray(a).reshape(-1)] for a in r] for r in ragged]
            if any(len(r) != 4 for r in slices):
                raise R2cclError("each local rank's ragged slices are (input_offsets, send_sizes, output_offsets, "
                                 "recv_sizes)")
        elif ragged is not None:
            raise R2cclError(f"{kind} takes no ragged slices")
        if outputs is None:
            outputs = [np.empty(want, dtype) for _ in inputs]
        else:
            outputs = list(outputs)
            if len(outputs) != len(inputs):
                raise R2cclError(f"{len(outputs)} output buffers for {len(inputs)} local ranks")
            for i, o in enumerate(outputs):
                # The core writes the buffer itself: a strided or read-only view would have the
                # result land in a temporary copy and the caller's array stay unchanged.
                if not isinstance(o, np.ndarray) or not o.flags.c_contiguous or not o.flags.writeable:
                    raise R2cclError(f"output {i} must be a writable C-contiguous numpy array (got "
                                     f"{type(o).__name__}{'' if not isinstance(o, np.ndarray) else ', strides ' + str(o.strides) + (', read-only' if not o.flags.writeable else '')}); "
                                     "pass np.ascontiguousarray(...) or let run() allocate the outputs")
                if o.dtype != dtype or o.size != want:
                    raise R2cclError(f"output {i} is {o.size} x {o.dtype.name}; this {kind} of {count} "
                                     f"x {dtype.name} on {n} ranks writes {want} x {dtype.name}")
        flat_in = [a.reshape(-1).view(np.uint8) for a in inputs]
        flat_out = [o.reshape(-1).view(np.uint8) for o in outputs]
        self._ex.run(kind, dtype.name, op, int(root), self._tag(key), list(map(int, process_of_rank)),
                     list(map(int, my_ranks)), flat_in, flat_out, count,
                     float(self._ep.config.timeout_s if timeout is None else timeout), kind, str(plan), str(algo),
                     [int(d) for d in (perm or ())], slices, row_elems, want if kind == "ragged_all_to_all" else 0)
        return list(outputs)

    def set_capacity(self, source) -> None:
        """This process's capacity for the all-reduce planner: a HealthMonitor, a number
        (bandwidth in healthy-NIC units) or None (every process equal)."""
        self._ex.set_capacity_source(getattr(source, "_mon", source))

    def last_plan(self) -> dict:
        """The plan the last large all-reduce ran with: plan, algo, shares (none under the ring),
        capacities, processes."""
        return self._ex.last_plan()

    def close(self, timeout: float | None = None) -> None:
        """Waits, at most `timeout` s (default R2CCL_TIMEOUT), for collectives other threads
        still run here, then stops the executor: what still runs fails with cause `closed`."""
        self._ex.drain(self._ep.config.timeout_s if timeout is None else timeout)
        self._ex.close()
