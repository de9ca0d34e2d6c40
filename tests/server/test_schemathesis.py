"""schemathesis, run as a user runs it, against real servers: generated valid and invalid requests on every
operation of the OpenAPI document, every check. No 5xx, no response outside the documented schema.

Two servers, one model per task each, so that a request naming no model reaches it: BERT-family encoders (embedder,
cross-encoder, classifier), and the other kinds of model, whose own rules a request can break (a decoder embedder
with an instruction prompt, a causal-LM reranker with a chat template, SPLADE, ColBERT): fuzzing by hand once found an
empty text that hung a causal reranker's engine.

Bounded for CI (`SCHEMATHESIS_EXAMPLES` per operation, 30 by default: ~2,100 requests a server);
SCHEMATHESIS_EXAMPLES=500 SCHEMATHESIS_SEED=41 sends ~10,000."""

import json
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from encoderrt import Engine
from encoderrt.server import ServerSettings, create_app
from server_helpers import ready_registry, running_server

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "30"))
CONFIG = Path(__file__).with_name("schemathesis.toml")


@pytest.fixture(scope="module")
def other_kinds(tiny_dir, compile_artifact, tmp_path_factory):
    """Artifacts of the kinds beyond BERT's heads, one per task."""
    import tiny_models as tm

    root, artifacts = tiny_dir / "fuzzed", tmp_path_factory.mktemp("fuzzed")
    sources = {
        "qwen3_embedder": tm.sentence_transformers_folder(root / "qwen3", pooling="lasttoken", normalize=True,
                                                          family="qwen3",
                                                          prompts={"query": "Instruct: find the passage\nQuery:"}),
        "qwen3_reranker": tm.causal_reranker_folder(root / "qwen3-reranker"),
        "splade": tm.sparse_encoder_folder(root / "splade"),
        "colbert": tm.colbert_folder(root / "colbert"),
    }
    return {name: compile_artifact(source, artifacts / name).path for name, source in sources.items()}


@pytest.mark.parametrize("models", ["bert_heads", "other_kinds"])
def test_generated_requests_find_no_server_error_and_no_schema_violation(models, request, tmp_path):
    if models == "bert_heads":
        artifacts = request.getfixturevalue("tiny_artifacts")
        paths = {"embedder": artifacts["st-cls"], "reranker": artifacts["bert-cross-encoder"],
                 "classifier": artifacts["bert-classifier"]}
    else:
        paths = request.getfixturevalue("other_kinds")
    engines = {name: Engine.load(path, max_batch_tokens=512) for name, path in paths.items()}
    assert shutil.which("schemathesis"), "schemathesis is a test dependency: pip install -e '.[test]'"
    settings = ServerSettings(max_client_batch_size=32)
    with running_server(create_app(settings, ready_registry(**engines)), settings) as url:
        run = subprocess.run(
            ["schemathesis", "--config-file", str(CONFIG), "run", f"{url}/openapi.json", "--checks", "all",
             "--max-examples", str(EXAMPLES), "--seed", os.environ.get("SCHEMATHESIS_SEED", "14"), "--no-color",
             "--workers", "2", "--report", "ndjson", "--report-dir", str(tmp_path), "--request-timeout", "30",
             "--suppress-health-check", "all"],
            capture_output=True, text=True, timeout=900, cwd=tmp_path)  # its example cache stays out of the checkout
    for engine in engines.values():
        engine.close()
    print(run.stdout[-6000:])
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    scenarios = [json.loads(line)["ScenarioFinished"] for line in next(tmp_path.glob("*.ndjson")).read_text().splitlines()
                 if line.startswith('{"ScenarioFinished"')]
    statuses = Counter(interaction["response"]["status_code"] for scenario in scenarios
                       for interaction in scenario["recorder"].get("interactions", {}).values() if interaction.get("response"))
    tested = {scenario["recorder"]["label"] for scenario in scenarios if scenario["recorder"].get("interactions")}
    print(f"schemathesis: {sum(statuses.values())} requests on {len(tested)} operations, statuses {dict(statuses)}")
    assert len(tested) >= 20, tested  # every route was exercised, not a schema that failed to load
    assert not [status for status in statuses if status >= 500], statuses
