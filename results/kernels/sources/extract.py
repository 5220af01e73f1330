"""Copy the published A100 (and paired H100) measurements build_a100.py uses into small CSVs here.

    python results/kernels/sources/extract.py MIRRORS     (MIRRORS: a folder holding bare or
                                                          normal git clones named owner+repo/repo)

Run once; its outputs are committed so the build needs no network. Every number is copied as
published (units converted only where the column name says so); which rows are kept and why is
in README.md beside this file. The commits read are pinned in COMMITS and written to each file's
`source` column.
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMMITS = {
    "microsoft/vidur": "7d47513363ec447a741ac5e47241580b47724fbf",
    "PrincetonUniversity/LLMCompass": "2e015fd2ee750e6cad8d7152df52551e5b41ef20",
    "VIA-Research/vTrain": "f8dda8473a48b373b1d25f51f52d685bff5150c5",
}
VIDUR_MODELS = (
    "meta-llama/Llama-2-7b-hf",
    "meta-llama/Llama-2-70b-hf",
    "meta-llama/Meta-Llama-3-8B",
    "meta-llama/Meta-Llama-3-70B",
    "codellama/CodeLlama-34b-Instruct-hf",
    "internlm/internlm-20b",
    "Qwen/Qwen-72B",
    "microsoft/phi-2",
)
VIDUR_OPS = (
    "emb",
    "input_layernorm",
    "attn_pre_proj",
    "attn_post_proj",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
VIDUR_TOKENS = (128, 256, 512, 1024, 2048, 4096)  # training-sized token counts only
VIDUR_DIMS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp")
VTRAIN_SIZES = tuple(2**i * 2**20 for i in range(11))  # 1 MiB .. 1 GiB, powers of two


def show(mirrors: Path, repo: str, path: str) -> str | None:
    git = mirrors / repo.replace("/", "+") / "repo"
    done = subprocess.run(["git", "-C", str(git), "show", f"{COMMITS[repo]}:{path}"],
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout if done.returncode == 0 else None


def write(name: str, header: list[str], rows: list[list]) -> None:
    with (HERE / name).open("w", newline="") as handle:
        out = csv.writer(handle, lineterminator="\n")
        out.writerow(header)
        out.writerows(rows)
    print(f"wrote {len(rows)} rows to {name}")


def vidur(mirrors: Path) -> None:
    rows = []
    for gpu in ("a100", "h100"):
        for model in VIDUR_MODELS:
            path = f"data/profiling/compute/{gpu}/{model}/mlp.csv"
            text = show(mirrors, "microsoft/vidur", path)
            if text is None:
                continue  # vidur has no H100 profile of Llama 3
            for r in csv.DictReader(io.StringIO(text)):
                if int(r["num_tokens"]) not in VIDUR_TOKENS:
                    continue
                for op in VIDUR_OPS:
                    median = r.get(f"time_stats.{op}.median", "")
                    if median:
                        std = f"{float(r[f'time_stats.{op}.std']):.4g}"
                        rows.append([gpu, model, *(r[d] for d in VIDUR_DIMS), r["num_tokens"],
                                     r["num_tensor_parallel_workers"], op, median, std])  # fmt: skip
    # source of a row: microsoft/vidur@COMMITS:data/profiling/compute/<gpu>/<model>/mlp.csv
    header = ["gpu", "model", *VIDUR_DIMS, "num_tokens", "tp", "op", "median_ms", "std_ms"]
    write("vidur_mlp.csv", header, rows)


def llmcompass(mirrors: Path) -> None:
    rows = []
    figures = {"matmul": "ab/real_hardware/matmul_A100.csv", "gelu": "g/real_hardware/gelu_A100.csv",
               "layernorm": "de/real_hardware/layernorm_A100.csv", "softmax": "cf/real_hardware/softmax_A100.csv"}  # fmt: skip
    for kind, rel in figures.items():
        path = f"ae/figure5/{rel}"
        where = f"PrincetonUniversity/LLMCompass@{COMMITS['PrincetonUniversity/LLMCompass'][:10]}:{path}"
        for line in show(mirrors, "PrincetonUniversity/LLMCompass", path).strip().splitlines():
            cells = [c.strip() for c in line.split(",")]
            if kind == "matmul":  # M, N, K, latency "0.1900ms", throughput "101.7Tflops"
                m, n, k, ms = (
                    int(cells[0]),
                    int(cells[1]),
                    int(cells[2]),
                    float(cells[3].removesuffix("ms")),
                )
                rows.append([kind, m, n, k, ms * 1e3, where])
            elif kind == "gelu":  # elements, Gelem/s (= elements / latency / 1e9)
                m, rate = int(cells[0]), float(cells[1])
                rows.append([kind, m, "", "", m / (rate * 1e9) * 1e6, where])
            else:  # M, N, Gelem/s
                m, n, rate = int(cells[0]), int(cells[1]), float(cells[2])
                rows.append([kind, m, n, "", m * n / (rate * 1e9) * 1e6, where])
    write("llmcompass_a100.csv", ["kind", "m", "n", "k", "latency_us", "source"], rows)


def vtrain(mirrors: Path) -> None:
    rows = []
    for gpus in range(2, 9):
        path = f"trace/a100/AR_GPU{gpus}_1M_1024M_LUT"
        where = f"VIA-Research/vTrain@{COMMITS['VIA-Research/vTrain'][:10]}:{path}"
        for line in show(mirrors, "VIA-Research/vTrain", path).strip().splitlines()[1:]:
            size, _count, dtype, t_oop, bw_oop, t_ip, bw_ip = (c.strip() for c in line.split(","))
            if int(size) in VTRAIN_SIZES:
                rows.append([gpus, size, dtype, t_oop, bw_oop, t_ip, bw_ip, where])
    header = [
        "gpus",
        "size_bytes",
        "dtype",
        "time_oop_ns",
        "busbw_oop_GBps",
        "time_ip_ns",
        "busbw_ip_GBps",
        "source",
    ]
    write("vtrain_a100_allreduce.csv", header, rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mirrors", nargs="?", type=Path, default=Path("/work/.mirror"),
                        metavar="MIRRORS", help="a folder holding bare or normal git clones "
                        "named owner+repo/repo (default: %(default)s)")  # fmt: skip
    mirrors = parser.parse_args().mirrors
    vidur(mirrors)
    llmcompass(mirrors)
    vtrain(mirrors)
