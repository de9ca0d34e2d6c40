#!/usr/bin/env bash
# One command for the lent GPU machine (PyTorch with CUDA and Triton there): kernel correctness and speed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 480 python scripts/gpu_check.py
