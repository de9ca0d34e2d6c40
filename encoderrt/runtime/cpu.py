"""What this CPU offers the int8 and bf16 kernels, read from /proc/cpuinfo, and the CPU time a process or one of
its threads has used, from /proc.

Machines of one kind differ (Sapphire Rapids with AMX, EPYCs with avx512_bf16, EPYCs with AVX2 only), and
two choices depend on it: how int8 weights are quantised (below) and what a benchmark's figures are held to.
"""

from __future__ import annotations

import os
import platform
from functools import cache
from pathlib import Path

REPORTED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
_INT8_DOT_PRODUCTS = ("avx512_vnni", "avx_vnni", "amx_int8")
_BF16_GEMMS = ("avx512_bf16", "amx_bf16")


@cache
def cpu_model_and_flags() -> tuple[str, frozenset[str]]:
    model, flags = platform.processor() or "unknown", frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name") and model in ("unknown", ""):
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = frozenset(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return model, flags


def int8_dot_products(flags: frozenset[str] | None = None) -> bool:
    """Whether int8 GEMMs accumulate u8 x s8 products in 32 bits (VNNI or AMX).

    Without them (AVX2, AVX-512F) x86 kernels multiply u8 x s8 with vpmaddubsw, which sums pairs of
    products into int16 and saturates: on an AVX2 EPYC a tiny cross-encoder's int8 Spearman fell to 0.88
    (0.51 for ELECTRA) and embeddings to min cosine 0.88. So compile quantises differently there:
    onnxruntime gets uint8 weights (its u8 x u8 kernels widen before they add), NNCF 7-bit weights on
    every layer (its overflow fix).
    """
    return _has_any(_INT8_DOT_PRODUCTS, flags)


def bf16_instructions(flags: frozenset[str] | None = None) -> bool:
    """Whether this CPU computes bf16 products natively (avx512_bf16 or AMX), as OpenVINO's BF16 capability says,
    read without loading OpenVINO (for the compile cache's key)."""
    return _has_any(_BF16_GEMMS, flags)


def _has_any(wanted: tuple[str, ...], flags: frozenset[str] | None) -> bool:
    """Whether the CPU (or the given flags) has any of `wanted`."""
    flags = cpu_model_and_flags()[1] if flags is None else flags
    return any(flag in flags for flag in wanted)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int | str = "self", thread: int | None = None) -> float:
    """User + system CPU seconds of process `pid` so far, or of its thread whose native id is `thread`; OSError
    where /proc has none (not Linux, or the thread has ended)."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rpartition(")")[2].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime and stime: fields 14 and 15 of proc(5)
