"""The 2025-26 families (issues 30 and 31), and T5's encoder (GTR), at their deployed sizes with random weights,
against sentence-transformers fp32 in the same run (ratios, not times, travel between machines).

    python benchmarks/families.py [FAMILY ...] [--work DIR] [--target T] [--precision P] [--repeat 3]

Each family is built as a sentence-transformers folder by transformers' own classes (tests/tiny_models.py, so the
layout is the one the suite checks for parity), compiled as a user would (`encoderrt compile`, `--target auto
--precision auto` unless told), and measured by `encoderrt bench --reference`: embedders on passages at 8 clients,
the reranker on rerank lists at one client. Prints, per family, what compile chose, x sentence-transformers fp32,
the engine's efficiency and the backend's share of the GEMM ceiling, and leaves each report under --work. Folders
and artifacts already under --work are reused. Needs the test extra (torch, transformers, sentence-transformers).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import tiny_models  # noqa: E402 - the suite's builders

BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
            initializer_range=0.02, max_positions=514)
"""Issue 30's base-sized configuration (BERT-base's shape)."""
QWEN3_06B = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, head_dim=128, intermediate_size=3072,
                 initializer_range=0.02, max_positions=1024)
"""Qwen3-Embedding-0.6B's and Qwen3-Reranker-0.6B's configuration (8 KV heads: the builders take half)."""
EMBEDDINGGEMMA2 = dict(hidden_size=512, num_hidden_layers=24, num_attention_heads=4, head_dim=256, global_head_dim=512,
                      intermediate_size=2048, hidden_size_per_layer_input=512, embedding_dim=768, sliding_window=512,
                      sliding_window_pattern=6, initializer_range=0.02, max_positions=2048)
"""EmbeddingGemma 2's text tower as transformers' configuration describes it by default (2 KV heads on windowed layers,
one on the wider global ones)."""
CLI = (sys.executable, "-m", "encoderrt.cli")
"""`encoderrt`, as this interpreter has it (not whichever the PATH finds first)."""


@dataclass(frozen=True)
class Family:
    build: Callable[[Path], Path]
    workload: str = "passages"
    concurrency: int = 8
    scale: float = 0.15
    """Of the workload's default size: the 0.6B models' torch reference runs at ~130 tokens/s on 2 cores."""


def _encoder(family: str, pooling: str = "mean", **options) -> Callable[[Path], Path]:
    return lambda folder: tiny_models.sentence_transformers_folder(folder, pooling, normalize=True, max_seq_length=512,
                                                                   family=family, **{**BASE, **options})


FAMILIES: dict[str, Family] = {
    "nomic_bert": Family(_encoder("nomic_bert")),
    "gte": Family(_encoder("gte")),
    "eurobert": Family(_encoder("eurobert")),
    "jina_embeddings_v3": Family(_encoder("jina_embeddings_v3")),
    # UltraBERT's defaults: a 128-token window each side, every third layer global
    "ultrabert": Family(_encoder("ultrabert", sliding_window=128, global_every=3)),
    # EmbeddingGemma's modules: mean pooling, Dense 768 -> 3072 -> 768 without activations, its task prompts
    "embeddinggemma": Family(_encoder("gemma3", dense=((3072, "Identity"), (768, "Identity")),
                                      prompts=tiny_models.EMBEDDINGGEMMA_PROMPTS)),
    "embeddinggemma2": Family(_encoder("embedding_gemma2", **EMBEDDINGGEMMA2,
                                       prompts=tiny_models.EMBEDDINGGEMMA_PROMPTS)),
    # GTR-T5-base's modules: T5 v1.1's encoder (gated GELU, d_ff 2048), mean pooling, Dense 768 -> 768, Normalize
    "gtr_t5_base": Family(_encoder("t5", dense=((768, "Identity"),), intermediate_size=2048)),
    "qwen3_embedding_0.6b": Family(_encoder("qwen3", pooling="lasttoken", **QWEN3_06B, prompts={
        "query": "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"}),
        scale=0.1),
    "qwen3_reranker_0.6b": Family(lambda folder: tiny_models.causal_reranker_folder(folder, **QWEN3_06B),
                                  workload="rerank", concurrency=1, scale=0.02),
}


def measure(name: str, family: Family, work: Path, args: argparse.Namespace) -> str:
    source, artifact, report = work / f"src-{name}", work / f"art-{name}", work / f"rep-{name}"
    if not (source / "config.json").exists():
        family.build(source)
    if not (artifact / "manifest.json").exists():
        choice = [f"--{flag}={value}" for flag, value in (("target", args.target), ("precision", args.precision))
                  if value]
        subprocess.run([*CLI, "compile", str(source), "-o", str(artifact), "--quiet", *choice], check=True)
    subprocess.run([*CLI, "bench", str(artifact), "--workload", family.workload, "--concurrency",
                    str(family.concurrency), "--repeat", str(args.repeat), "--scale", str(args.scale or family.scale),
                    "--reference", "--out", str(report)], check=True, stdout=subprocess.DEVNULL)
    result = json.loads((report / "report.json").read_text())
    model, run = result["model"], result["results"][0]
    backend = result["backend_alone"][family.workload]["ceiling_fraction"]
    parity = ", ".join(f"{key} {value:.6g}" for key, value in model["parity"].items()
                       if key in ("min_cosine", "max_abs_score_diff", "min_spearman"))
    return (f"{name}: {model['target']} {model['precision']} ({parity}), {run['tokens_per_s']:,.0f} tokens/s, "
            f"{run['ratio_to_reference']:.2f}x sentence-transformers fp32, engine efficiency "
            f"{run['engine_efficiency']:.2f}, the backend at {backend:.0%} of the {model['precision']} ceiling "
            f"[{result['cpu']['model']}, tier {result['cpu']['tier']}]")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("families", nargs="*", metavar="FAMILY", help=f"any of {', '.join(FAMILIES)} (default: all)")
    parser.add_argument("--work", type=Path, help="where folders, artifacts and reports go (default: a new one)")
    parser.add_argument("--target", help="compile's --target (default: auto)")
    parser.add_argument("--precision", help="compile's --precision (default: auto)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scale", type=float, help="the bench's --scale (default: each family's)")
    arguments = parser.parse_args()
    if unknown := sorted(set(arguments.families) - set(FAMILIES)):
        parser.error(f"no such family: {', '.join(unknown)}; choose from {', '.join(FAMILIES)}")
    folder = arguments.work or Path(tempfile.mkdtemp(prefix="families-"))
    folder.mkdir(parents=True, exist_ok=True)
    for family_name in arguments.families or FAMILIES:
        print(measure(family_name, FAMILIES[family_name], folder, arguments), flush=True)
