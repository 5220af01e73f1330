"""The normalized op record the capture stage produces and the cost models consume.

Vocabulary (docs/MODELS.md has the table): GEMM-like ops, flash attention forward/backward, and
memory-bound classes priced by the bytes they move.
"""

from __future__ import annotations

from dataclasses import dataclass

GEMM_OPS = ("mm", "addmm", "bmm", "linear", "scaled_mm")
ATTENTION_OPS = ("flash_attn_fwd", "flash_attn_bwd")
MEMORY_OPS = (
    "elementwise", "norm", "softmax", "reduction", "copy", "embedding", "optimizer_step", "cross_entropy",
)
OP_NAMES = GEMM_OPS + ATTENTION_OPS + MEMORY_OPS
# the dtypes an op runs in, and a GPU preset has peaks for (emulator.hardware.presets reads it
# here: this module keys a capture (prismbench.capture_sources), the presets only price one)
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
# FlashAttention-2 (Dao 2023) and its benchmark script count the backward pass as 2.5x the forward
# FLOPs (5 matmuls of the forward's size-2 each, against 2 in the forward).
ATTN_BWD_FLOP_RATIO = 2.5


@dataclass(frozen=True, kw_only=True)
class OpRecord:
    """One kernel-level op: normalized name, dtype, work and the shape fields its model needs."""

    name: str
    dtype: str
    flops: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    heads_q: int = 0
    heads_kv: int = 0
    seq_q: int = 0
    seq_kv: int = 0
    head_dim: int = 0
    causal: bool = False
    # The aten op the capture recorded ("aten.native_layer_norm_backward"): one memory-bound
    # class covers kernels of different speeds, and measured tables tell them apart by it.
    aten: str = ""

    def __post_init__(self) -> None:
        if self.name not in OP_NAMES:
            raise ValueError(f"op.name={self.name!r} is not in the vocabulary; known: {OP_NAMES}")
        if self.dtype not in DTYPES:
            raise ValueError(f"op.dtype={self.dtype!r} must be one of {DTYPES}")
        if self.name == "scaled_mm" and self.dtype != "fp8":
            raise ValueError(f"op.dtype={self.dtype!r}: scaled_mm is an fp8 GEMM")
        for field in ("flops", "bytes_read", "bytes_written", "m", "n", "k", "heads_q", "heads_kv",
                      "seq_q", "seq_kv", "head_dim"):
            if getattr(self, field) < 0:
                raise ValueError(f"op.{field}={getattr(self, field)!r} must be >= 0")
        if self.batch < 1:
            raise ValueError(f"op.batch={self.batch!r} must be >= 1")
        if self.name in GEMM_OPS and min(self.m, self.n, self.k) < 1:
            raise ValueError(f"op {self.name}: m, n, k must be >= 1 (got {self.m}, {self.n}, {self.k})")
        if self.name in ATTENTION_OPS and min(self.heads_q, self.heads_kv, self.seq_q, self.seq_kv, self.head_dim) < 1:
            raise ValueError(f"op {self.name}: heads_q, heads_kv, seq_q, seq_kv, head_dim must be >= 1")

    @property
    def bytes_total(self) -> float:
        return self.bytes_read + self.bytes_written


def gemm_op(name: str, m: int, n: int, k: int, *, batch: int = 1, dtype: str = "bf16") -> OpRecord:
    """C[batch, m, n] = A[batch, m, k] @ B[batch, k, n]: 2mnk FLOPs per batch entry."""
    size = DTYPE_BYTES[dtype]
    out_size = 2 if dtype == "fp8" else size  # fp8 GEMMs write bf16 outputs in torch's scaled_mm recipes
    return OpRecord(
        name=name, dtype=dtype, m=m, n=n, k=k, batch=batch,
        flops=2.0 * m * n * k * batch,
        bytes_read=float((m * k + k * n) * batch * size),
        bytes_written=float(m * n * batch * out_size),
    )


def attention_flops(batch: int, heads_q: int, seq_q: int, seq_kv: int, head_dim: int, causal: bool) -> float:
    """Forward FLOPs: two matmuls (QK^T and PV) of 2*sq*skv*d each per head; causal keeps half."""
    flops = 4.0 * batch * heads_q * seq_q * seq_kv * head_dim
    return flops / 2 if causal else flops


def attention_op(name: str, *, batch: int, heads_q: int, heads_kv: int, seq_q: int, seq_kv: int,
                 head_dim: int, causal: bool = True, dtype: str = "bf16") -> OpRecord:
    """Flash attention forward or backward, with FLOPs and the bytes of Q, K, V, O (and grads)."""
    fwd = attention_flops(batch, heads_q, seq_q, seq_kv, head_dim, causal)
    size = DTYPE_BYTES[dtype]
    q_o = 2.0 * batch * heads_q * seq_q * head_dim * size
    k_v = 2.0 * batch * heads_kv * seq_kv * head_dim * size
    is_bwd = name == "flash_attn_bwd"
    return OpRecord(
        name=name, dtype=dtype, batch=batch, heads_q=heads_q, heads_kv=heads_kv, seq_q=seq_q,
        seq_kv=seq_kv, head_dim=head_dim, causal=causal,
        flops=fwd * (ATTN_BWD_FLOP_RATIO if is_bwd else 1.0),
        bytes_read=q_o + k_v + (q_o / 2 if is_bwd else 0.0),
        bytes_written=(q_o / 2 + k_v) if is_bwd else q_o / 2,
    )


def memory_op(name: str, *, bytes_read: float, bytes_written: float, dtype: str = "bf16", flops: float = 0.0) -> OpRecord:
    """A memory-bound op priced by the bytes it moves."""
    if name not in MEMORY_OPS:
        raise ValueError(f"op.name={name!r} is not a memory-bound class; known: {MEMORY_OPS}")
    return OpRecord(name=name, dtype=dtype, bytes_read=bytes_read, bytes_written=bytes_written, flops=flops)
