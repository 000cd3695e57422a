"""Workloads for the simulator: Megatron-style GPT training (data, tensor and pipeline parallel)
and LLM serving (prefill and decode, KV cache). Each turns the servers' effective capacities
(healthy-NIC units, see policies.capacity) into a step time with the cost functions of costs.py.

Layouts (rail-optimized servers of `gpus_per_server` GPUs):
- data parallel (tp = pp = 1): every GPU is a replica; the gradient all-reduce spans the
  cluster (NVLink inside a server, the planner's exchange between servers).
- tensor + pipeline parallel (tp = GPUs per server, pp stages on consecutive servers): tensor
  parallelism stays on NVLink; pipeline stages send activations to the next server (each GPU its
  1/tp slice on its own rail, so a boundary is paced by the weaker of its two servers); the
  gradient all-reduce of each stage spans that stage's servers in every replica.
- serving: an instance is tp GPUs per server x pp servers; each token crosses every stage
  boundary."""

from __future__ import annotations

import dataclasses
from typing import Mapping

from .cluster import Cluster
from .costs import allreduce_seconds, exchange, p2p_seconds

H100_BF16_FLOPS = 989e12     # dense, per GPU
H100_HBM_Bps = 3.35e12


@dataclasses.dataclass(frozen=True)
class Training:
    name: str
    params: float
    layers: int
    hidden: int
    seq: int = 2048
    tp: int = 1
    pp: int = 1
    micro_batch: int = 4          # sequences per replica per micro-batch
    micro_batches: int = 1        # per replica per step
    grad_bytes: float = 4.0       # fp32 gradient all-reduce (Megatron's default main grads)
    mfu: float = 0.4              # of H100_BF16_FLOPS, the model's 6 x params x tokens FLOPs
    overlap: float = 0.0          # fraction of the backward pass the gradient all-reduce hides behind
    doc: str = ""

    kind = "training"

    def check(self, cluster: Cluster) -> None:
        g = cluster.gpus_per_server
        if self.tp == 1 and self.pp == 1:
            return
        if self.tp != g:
            raise ValueError(f"{self.name}: tensor parallel {self.tp} must equal the GPUs per server ({g})")
        if cluster.servers % self.pp:
            raise ValueError(f"{self.name}: {cluster.servers} servers do not split into pipelines of {self.pp}")

    def replicas(self, cluster: Cluster) -> int:
        return cluster.servers * cluster.gpus_per_server // (self.tp * self.pp)

    def tokens_per_step(self, cluster: Cluster) -> float:
        return self.replicas(cluster) * self.micro_batches * self.micro_batch * self.seq

    def fb_seconds(self) -> float:
        """Forward + backward of one micro-batch on one stage's GPUs."""
        return 6 * self.params * self.micro_batch * self.seq / (self.tp * self.pp) / (H100_BF16_FLOPS * self.mfu)

    def step(self, cluster: Cluster, caps: Mapping[int, float], plan: str,
             lost_gpus: int = 0, algo: str = "direct") -> tuple[float, float]:
        """(seconds, fraction of the fault-free work a step does) with the servers in `caps`
        (server -> effective capacity) degraded and the others healthy; lost_gpus: GPUs an
        adapcc-like subset has dropped (data parallel only)."""
        n, full = cluster.servers, float(cluster.nics_per_server)
        fb = self.fb_seconds()
        if self.tp == 1 and self.pp == 1:
            compute = self.micro_batches * fb
            cl = [caps.get(s, full) for s in range(n)]
            ar = allreduce_seconds(cluster, self.params * self.grad_bytes, cl, plan, algo)["seconds"]
            total = n * cluster.gpus_per_server
            return compute + max(0.0, ar - self.overlap * compute * 2 / 3), (total - lost_gpus) / total
        if lost_gpus:
            raise ValueError("a subset cannot drop GPUs that hold a unique model shard")
        pp, m = self.pp, self.micro_batches
        act = self.micro_batch * self.seq * self.hidden * 2
        healthy_p2p = p2p_seconds(full, full, act, cluster.nic_Bps, cluster.alpha_s) if pp > 1 else 0.0
        worst_p2p = healthy_p2p
        for s in caps:
            first = s - s % pp
            for a, b in ((s - 1, s), (s, s + 1)):
                if first <= a and b < first + pp:
                    worst_p2p = max(worst_p2p, p2p_seconds(caps.get(a, full), caps.get(b, full), act,
                                                           cluster.nic_Bps, cluster.alpha_s))
        pipeline = (m + pp - 1) * (fb + 2 * worst_p2p)
        grad = self.params / pp * self.grad_bytes       # per server: every TP shard of one stage
        ar = 0.0
        replicas = n // pp
        if replicas > 1:
            stages = {s % pp for s in caps} or {0}
            for st in stages:
                cl = [caps.get(r * pp + st, full) for r in range(replicas)]
                ar = max(ar, exchange(cl, grad, cluster.nic_Bps, cluster.alpha_s, plan, algo)["predicted_s"])
        return pipeline + max(0.0, ar - self.overlap * fb * 2 / 3), 1.0


@dataclasses.dataclass(frozen=True)
class CollectiveLoop:
    """Back-to-back all-reduces of `nbytes` (the benchmark's loop): a step is one all-reduce."""
    nbytes: float
    name: str = "allreduce-loop"
    tp: int = 1
    pp: int = 1
    doc: str = "bench allreduce: one all-reduce after another"
    algo: str = "auto"            # R2CCL_ALGO of the loop
    max_peers: int | None = None  # R2CCL_MAX_PEERS of the loop (None: the library's default)

    kind = "training"

    def check(self, cluster: Cluster) -> None:
        return None

    def step(self, cluster: Cluster, caps: Mapping[int, float], plan: str, lost_gpus: int = 0,
             algo: str | None = None) -> tuple[float, float]:
        full = float(cluster.nics_per_server)
        cl = [caps.get(s, full) for s in range(cluster.servers)]
        return allreduce_seconds(cluster, self.nbytes, cl, plan, algo or self.algo, self.max_peers)["seconds"], 1.0


@dataclasses.dataclass(frozen=True)
class Serving:
    name: str
    params: float
    layers: int
    hidden: int
    kv_bytes_per_token: float     # K and V of every layer, bf16
    tp: int = 8
    pp: int = 2                   # servers per instance
    prompt_tokens: int = 1024     # mean prompt
    output_tokens: int = 256      # mean answer
    batch: int = 64               # requests decoding together on an instance
    rate_per_instance: float | None = None   # requests per second; None: keeps `batch` busy (Little's law)
    mfu_prefill: float = 0.5
    hbm_efficiency: float = 0.7
    doc: str = ""

    kind = "serving"

    def check(self, cluster: Cluster) -> None:
        if self.tp != cluster.gpus_per_server:
            raise ValueError(f"{self.name}: tensor parallel {self.tp} must equal the GPUs per server "
                             f"({cluster.gpus_per_server})")
        if cluster.servers % self.pp:
            raise ValueError(f"{self.name}: {cluster.servers} servers do not split into instances of {self.pp}")

    def instances(self, cluster: Cluster) -> int:
        return cluster.servers // self.pp

    def mean_latency(self, cluster: Cluster) -> float:
        full = [float(cluster.nics_per_server)] * self.pp
        return self.ttft(cluster, full) + self.output_tokens * self.tpot(cluster, full)

    def arrival_rate(self, cluster: Cluster) -> float:
        """Requests per second per instance: given, or enough to keep `batch` requests decoding."""
        return self.rate_per_instance or self.batch / self.mean_latency(cluster)

    def _boundaries(self, cluster: Cluster, caps: list[float], nbytes: float) -> float:
        """Every stage boundary once, and the way back to the first stage (the sampled token)."""
        t = 0.0
        for k in range(self.pp):
            a, b = caps[k], caps[(k + 1) % self.pp]
            t += p2p_seconds(a, b, nbytes if k < self.pp - 1 else 8 * self.batch, cluster.nic_Bps, cluster.alpha_s)
        return t if self.pp > 1 else 0.0

    def tpot(self, cluster: Cluster, caps: list[float]) -> float:
        """Seconds per output token of a request: every stage reads its weights and the batch's
        KV cache once (memory bound), and the batch's activations cross each boundary."""
        gpus = self.tp * self.pp
        kv = self.batch * (self.prompt_tokens + self.output_tokens / 2) * self.kv_bytes_per_token
        read = (self.params * 2 + kv) / (gpus * H100_HBM_Bps * self.hbm_efficiency) * self.pp
        return read + self._boundaries(cluster, caps, self.batch * self.hidden * 2)

    def ttft(self, cluster: Cluster, caps: list[float], prompt: float | None = None) -> float:
        """Prefill of one prompt: compute bound on each stage in turn, the prompt's activations
        across each boundary."""
        L = self.prompt_tokens if prompt is None else prompt
        compute = 2 * self.params * L / (self.tp * H100_BF16_FLOPS * self.mfu_prefill)
        return compute + self._boundaries(cluster, caps, L * self.hidden * 2)


WORKLOADS = {
    # The paper's Megatron-LM GPT shapes. 2.7B: 32 layers x 2560; 13B: 40 layers x 5120.
    # DP 2.7B: 4 sequences of 2048 per GPU and step (the batch is not published), fp32 gradient
    # all-reduce, no overlap; mfu 0.387 makes 2 servers (16 GPUs) run the paper's fault-free
    # 314,618 tokens/s: 0.417 s a step, 0.070 s of it the all-reduce (paper.py checks this).
    "gpt-2.7b-dp": Training("gpt-2.7b-dp", 2.7e9, 32, 2560, micro_batch=4, mfu=0.387,
                            doc="GPT 2.7B, data parallel, 4 x 2048 tokens per GPU per step"),
    "gpt-13b-dp": Training("gpt-13b-dp", 13e9, 40, 5120, micro_batch=4, mfu=0.4,
                           doc="GPT 13B, data parallel, 4 x 2048 tokens per GPU per step"),
    # 13B TP+PP: TP 8 inside a server, PP 2 across servers, 16 micro-batches of 1 x 2048.
    "gpt-13b-tp-pp": Training("gpt-13b-tp-pp", 13e9, 40, 5120, tp=8, pp=2, micro_batch=1, micro_batches=16,
                              mfu=0.4, doc="GPT 13B, TP 8 x PP 2, 16 micro-batches of 1 x 2048"),
    # Serving: a 70B model (80 layers x 8192, 8 KV heads of 128: 320 KiB of KV per token) on
    # 2 servers (TP 8 x PP 2), 64 requests decoding together.
    "llama-70b-serve": Serving("llama-70b-serve", 70e9, 80, 8192, 2 * 80 * 8 * 128 * 2,
                               doc="70B serving, TP 8 x PP 2 per instance, 64 requests in flight each"),
}
