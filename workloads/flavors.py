"""The model flavor registry: named `ModelSpec`s of every model in the published baselines.

Names are `family-size` in lower case, the size as its source writes it:
- `gpt3-*`: Brown et al. 2020 Table 2.1 (vocab 50257, 2048 positions, tied embeddings).
- `gpt2-*`: karpathy/llm.c scripts/run_gpt2_{124M,350M,774M,1558M}.sh (vocab 50257 as the
  CSV rows give it; llm.c pads it to 50304 for speed), 1024 positions, tied embeddings.
- `megatron-gpt-*`: the GPT models of Narayanan et al. 2021 Table 1 (sizes as printed,
  1008B included) and Korthikanti et al. 2022 Table 3 (22B, 175B; its 530B and 1T
  are the Table 1 529.6B and 1008B dims). Megatron pads the GPT-2 vocabulary to 51200
  and ties embeddings.
- `mcore-gpt-*`: Megatron-Core's weak-scaling table (NVIDIA/Megatron-LM README,
  images/model_table.png, r0.8.0): vocab 131072, 4096 positions. The table gives
  neither ffn nor kv heads: ffn = 4 * hidden and plain multi-head attention assumed.
- `mpt-*`: llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml (vocab 50368, ffn 4 * hidden,
  tied embeddings), with ALiBi as the released MPT models use it. The yamls themselves set no
  `alibi` and so keep MPT's learned position table (configuration_mpt.py defaults); the
  llm-foundry baselines say so (results/baselines/make_baselines.py, checked against the
  published parameter counts).
- `bloom-176b`: bigscience/bloom config.json (ALiBi, vocab padded to 250880, tied).
  `bloom-proto-l{layers}-h{hidden}-a{heads}`: the BLOOM topology-search runs of
  bigscience train/tr11-176B-ml/chronicles-prequel.md (vocab "250k": 250880 assumed).
- `llama2-*`, `llama3-*`, `llama3.1-*`: Meta's params.json / Touvron et al. 2023 Table 1,
  Llama 3 paper (Dubey et al. 2024) Table 3; rope_theta 1e4 (Llama 2) or 5e5 (Llama 3).
- `gpt-debug`, `llama-debug`: tiny models for tests.
Where a CSV row differs from a paper, the flavor follows the CSV row (it is what
was measured); the comments say where.
"""

from __future__ import annotations

import difflib

from workloads.config import ModelSpec, SpecError


def _gpt(name, layers, hidden, heads, vocab, max_seq_len, *, ffn=None, positions="learned"):
    return ModelSpec(
        name=name, family="gpt", layers=layers, hidden=hidden, ffn_hidden=ffn or 4 * hidden,
        heads=heads, kv_heads=heads, vocab=vocab, positions=positions,
        max_seq_len=max_seq_len, tie_embeddings=True,
    )  # fmt: skip


def _llama(name, layers, hidden, ffn, heads, kv_heads, vocab, max_seq_len, rope_theta):
    return ModelSpec(
        name=name, family="llama", layers=layers, hidden=hidden, ffn_hidden=ffn, heads=heads,
        kv_heads=kv_heads, vocab=vocab, positions="rope", max_seq_len=max_seq_len,
        rope_theta=rope_theta,
    )  # fmt: skip


_GPT2_VOCAB = 50257  # GPT-2 BPE (Radford et al. 2019), also used by GPT-3
_MEGATRON_VOCAB = 51200  # GPT-2 BPE padded to a multiple of 128 * tp by Megatron-LM
_MCORE_VOCAB = 131072  # Megatron-Core README weak-scaling table
_MPT_VOCAB = 50368  # llm-foundry mpt-*.yaml vocab_size (GPT-NeoX tokenizer, padded)
_BLOOM_VOCAB = 250880  # bigscience/bloom config.json (250680 tokens padded)
_LLAMA2_VOCAB = 32000  # Touvron et al. 2023, params.json vocab_size
_LLAMA3_VOCAB = 128256  # Llama 3 params.json vocab_size

# BLOOM prototypes from chronicles-prequel.md, as (layers, hidden, heads); ffn = 4 * hidden.
# One row there ("177B, h=12288, L=96") gives no head count and has no flavor.
_BLOOM_PROTOTYPES = (
    (70, 14336, 64), (70, 14336, 112), (70, 14336, 128),
    (72, 14336, 16), (72, 14336, 32), (72, 14336, 64), (72, 14336, 112), (72, 14336, 128),
    (72, 14336, 256),
    (78, 13824, 64), (78, 13824, 96), (78, 13824, 128),
    (80, 13824, 64), (80, 14400, 96),
    (84, 13312, 64), (84, 13312, 128), (84, 13824, 64),
    (94, 13312, 128),
    (96, 12288, 64), (96, 12288, 96), (96, 12288, 128),
    (100, 12288, 64),
    (106, 12288, 64), (106, 12288, 96), (106, 12288, 128),
)  # fmt: skip

_SPECS = (
    # Brown et al. 2020 Table 2.1 (n_layers, d_model, n_heads). The table's GPT-3 XL
    # (d_model 2048, 24 heads of 128) and 13B (d_model 5140) are not self-consistent;
    # as Megatron and others do, XL uses 16 heads of 128 and 13B d_model 5120.
    _gpt("gpt3-125m", 12, 768, 12, _GPT2_VOCAB, 2048),
    _gpt("gpt3-350m", 24, 1024, 16, _GPT2_VOCAB, 2048),
    _gpt("gpt3-760m", 24, 1536, 16, _GPT2_VOCAB, 2048),
    _gpt("gpt3-1.3b", 24, 2048, 16, _GPT2_VOCAB, 2048),
    _gpt("gpt3-2.7b", 32, 2560, 32, _GPT2_VOCAB, 2048),
    _gpt("gpt3-6.7b", 32, 4096, 32, _GPT2_VOCAB, 2048),
    _gpt("gpt3-13b", 40, 5120, 40, _GPT2_VOCAB, 2048),
    _gpt("gpt3-175b", 96, 12288, 96, _GPT2_VOCAB, 2048),
    # llm.c scripts/run_gpt2_*.sh (GPT-2 sizes; llm.c names the 355M one 350M)
    _gpt("gpt2-124m", 12, 768, 12, _GPT2_VOCAB, 1024),
    _gpt("gpt2-350m", 24, 1024, 16, _GPT2_VOCAB, 1024),
    _gpt("gpt2-774m", 36, 1280, 20, _GPT2_VOCAB, 1024),
    _gpt("gpt2-1558m", 48, 1600, 25, _GPT2_VOCAB, 1024),
    # Narayanan et al. 2021 Table 1 (layers, hidden, heads; ffn 4h; seq 2048)
    _gpt("megatron-gpt-1.7b", 24, 2304, 24, _MEGATRON_VOCAB, 2048),
    _gpt("megatron-gpt-3.6b", 30, 3072, 32, _MEGATRON_VOCAB, 2048),
    _gpt("megatron-gpt-7.5b", 36, 4096, 32, _MEGATRON_VOCAB, 2048),
    _gpt("megatron-gpt-18.4b", 40, 6144, 48, _MEGATRON_VOCAB, 2048),
    _gpt("megatron-gpt-39.1b", 48, 8192, 64, _MEGATRON_VOCAB, 2048),
    _gpt("megatron-gpt-76.1b", 60, 10240, 80, _MEGATRON_VOCAB, 2048),
    _gpt("megatron-gpt-145.6b", 80, 12288, 96, _MEGATRON_VOCAB, 2048),
    _gpt("megatron-gpt-310.1b", 96, 16384, 128, _MEGATRON_VOCAB, 2048),
    _gpt("megatron-gpt-529.6b", 105, 20480, 128, _MEGATRON_VOCAB, 2048),
    _gpt("megatron-gpt-1008b", 128, 25600, 160, _MEGATRON_VOCAB, 2048),
    # Korthikanti et al. 2022 Table 3 (22B; 175B = GPT-3 dims with Megatron's vocab)
    _gpt("megatron-gpt-22b", 48, 6144, 64, _MEGATRON_VOCAB, 2048),
    _gpt("megatron-gpt-175b", 96, 12288, 96, _MEGATRON_VOCAB, 2048),
    # Megatron-Core README model_table.png (layers, hidden, heads; seq 4096)
    _gpt("mcore-gpt-1.7b", 24, 2048, 16, _MCORE_VOCAB, 4096),
    _gpt("mcore-gpt-7.1b", 30, 4096, 32, _MCORE_VOCAB, 4096),
    _gpt("mcore-gpt-16b", 32, 6144, 48, _MCORE_VOCAB, 4096),
    _gpt("mcore-gpt-32b", 48, 7168, 56, _MCORE_VOCAB, 4096),
    _gpt("mcore-gpt-70b", 84, 8192, 64, _MCORE_VOCAB, 4096),
    _gpt("mcore-gpt-119b", 92, 10240, 80, _MCORE_VOCAB, 4096),
    _gpt("mcore-gpt-177b", 96, 12288, 96, _MCORE_VOCAB, 4096),
    _gpt("mcore-gpt-314b", 96, 16384, 128, _MCORE_VOCAB, 4096),
    _gpt("mcore-gpt-462b", 112, 18432, 144, _MCORE_VOCAB, 4096),
    # llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml (n_layers, d_model, n_heads);
    # max_seq_len is the largest the benchmark table runs (ALiBi needs no table).
    _gpt("mpt-125m", 12, 768, 12, _MPT_VOCAB, 65536, positions="alibi"),
    _gpt("mpt-350m", 24, 1024, 16, _MPT_VOCAB, 32768, positions="alibi"),
    _gpt("mpt-760m", 24, 1536, 12, _MPT_VOCAB, 32768, positions="alibi"),
    _gpt("mpt-1b", 24, 2048, 16, _MPT_VOCAB, 65536, positions="alibi"),
    _gpt("mpt-3b", 32, 2560, 20, _MPT_VOCAB, 65536, positions="alibi"),
    _gpt("mpt-7b", 32, 4096, 32, _MPT_VOCAB, 65536, positions="alibi"),
    _gpt("mpt-13b", 40, 5120, 40, _MPT_VOCAB, 32768, positions="alibi"),
    _gpt("mpt-30b", 48, 7168, 56, _MPT_VOCAB, 8192, positions="alibi"),
    _gpt("mpt-70b", 80, 8192, 64, _MPT_VOCAB, 2048, positions="alibi"),
    # bigscience/bloom config.json: n_layer 70, hidden 14336, n_head 112
    _gpt("bloom-176b", 70, 14336, 112, _BLOOM_VOCAB, 2048, positions="alibi"),
    *(
        _gpt(f"bloom-proto-l{n}-h{h}-a{a}", n, h, a, _BLOOM_VOCAB, 2048, positions="alibi")
        for n, h, a in _BLOOM_PROTOTYPES
    ),
    # Touvron et al. 2023 (Llama 2) Table 1 + params.json: 4096 context, theta 1e4
    _llama("llama2-7b", 32, 4096, 11008, 32, 32, _LLAMA2_VOCAB, 4096, 10_000.0),
    _llama("llama2-13b", 40, 5120, 13824, 40, 40, _LLAMA2_VOCAB, 4096, 10_000.0),
    _llama("llama2-70b", 80, 8192, 28672, 64, 8, _LLAMA2_VOCAB, 4096, 10_000.0),
    # Dubey et al. 2024 Table 3 + params.json: theta 5e5; Llama 3 8192, 3.1 131072 context
    _llama("llama3-8b", 32, 4096, 14336, 32, 8, _LLAMA3_VOCAB, 8192, 500_000.0),
    _llama("llama3-70b", 80, 8192, 28672, 64, 8, _LLAMA3_VOCAB, 8192, 500_000.0),
    _llama("llama3.1-8b", 32, 4096, 14336, 32, 8, _LLAMA3_VOCAB, 131072, 500_000.0),
    _llama("llama3.1-70b", 80, 8192, 28672, 64, 8, _LLAMA3_VOCAB, 131072, 500_000.0),
    _llama("llama3.1-405b", 126, 16384, 53248, 128, 8, _LLAMA3_VOCAB, 131072, 500_000.0),
    # tiny models for tests
    _gpt("gpt-debug", 4, 64, 4, 256, 128),
    _llama("llama-debug", 4, 64, 256, 4, 2, 256, 128, 10_000.0),
)

FLAVORS: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    """Add `spec` under its name; refuses a name that is already taken."""
    if spec.name in FLAVORS:
        raise SpecError(f"model.name={spec.name!r} is already a registered flavor")
    FLAVORS[spec.name] = spec
    return spec


for _spec in _SPECS:
    register(_spec)


def get_flavor(name: str) -> ModelSpec:
    """The registered spec called `name`; unknown names list the closest ones."""
    if not isinstance(name, str):
        raise SpecError(
            f"model.name={name!r} must be a string naming a registered flavor "
            f"(`prismbench workloads` lists all {len(FLAVORS)})"
        )
    try:
        return FLAVORS[name]
    except KeyError:
        close = difflib.get_close_matches(name.lower(), FLAVORS, n=5, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise SpecError(
            f"model.name={name!r} is not a registered flavor{hint} "
            f"(`prismbench workloads` lists all {len(FLAVORS)})"
        ) from None


def find_flavors(
    *,
    layers: int,
    hidden: int,
    heads: int | None = None,
    ffn_hidden: int | None = None,
    kv_heads: int | None = None,
    vocab: int | None = None,
) -> tuple[str, ...]:
    """Names of the flavors with these dims (None = any), in registry order."""
    wanted = {"layers": layers, "hidden": hidden, "heads": heads, "ffn_hidden": ffn_hidden,
              "kv_heads": kv_heads, "vocab": vocab}  # fmt: skip
    return tuple(
        name
        for name, spec in FLAVORS.items()
        if all(v is None or getattr(spec, k) == v for k, v in wanted.items())
    )


def parameter_count(spec: ModelSpec) -> int:
    """Analytic parameter count of the GPT/Llama module built from `spec`."""
    h, f, kv_dim = spec.hidden, spec.ffn_hidden, spec.kv_heads * spec.head_dim
    if spec.family == "gpt":
        attention = 2 * (h * h + h) + 2 * (h * kv_dim + kv_dim)
        mlp = (h * f + f) + (f * h + h)
        norms = 2 * (2 * h)  # LayerNorm weight and bias, twice per block
        final_norm = 2 * h
        positions = spec.max_seq_len * h if spec.positions == "learned" else 0
    else:
        attention = 2 * h * h + 2 * h * kv_dim
        mlp = 3 * h * f
        norms = 2 * h
        final_norm = h
        positions = 0
    embeddings = spec.vocab * h
    output = 0 if spec.tie_embeddings else spec.vocab * h
    return embeddings + positions + spec.layers * (attention + mlp + norms) + final_norm + output
