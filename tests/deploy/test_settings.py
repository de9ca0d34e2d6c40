"""Settings are declared once: every declared setting is a flag of `encoderrt serve` with the field's own name and
default, a Ray Serve argument with the same default where it applies in a replica, and a row of
docs/configuration.md; every field a user may want is declared."""

import dataclasses
from pathlib import Path

import pytest

from encoderrt.cli import build_parser
from encoderrt.deploy.settings import SECTIONS, RayAppArgs, RaySettings, configuration_page
from encoderrt.runtime.config import EngineConfig
from encoderrt.runtime.settings import declared
from encoderrt.server.loading import ModelSpec
from encoderrt.server.settings import ConnectionLimits, ServerSettings

DOCS = Path(__file__).parents[2] / "docs" / "configuration.md"
SETTINGS = [item for _, cls in SECTIONS for item in declared(cls)]
NOT_SETTINGS = {
    # fields that are not one value a user sets, and why
    (EngineConfig, "default_prompt_name"): "set per model: ModelSpec declares --default-prompt-name",
    (ServerSettings, "engine"): "the nested EngineConfig",
    (ServerSettings, "connections"): "the nested ConnectionLimits",
    (ModelSpec, "path"): "the MODEL argument itself",
}


def _serve_parser():
    commands = next(a for a in build_parser()._actions if a.dest == "command")
    return commands.choices["serve"]


@pytest.mark.parametrize("cls", [EngineConfig, ServerSettings, ConnectionLimits, ModelSpec, RaySettings])
def test_every_field_a_user_may_set_is_declared(cls):
    names = {item.name for item in declared(cls)}
    undeclared = [f.name for f in dataclasses.fields(cls) if f.name not in names and (cls, f.name) not in NOT_SETTINGS]
    assert not undeclared, f"{cls.__name__} fields with no flag: {undeclared}"


@pytest.mark.parametrize("item", SETTINGS, ids=lambda item: item.name)
def test_each_setting_is_a_flag_of_its_own_name_and_default(item):
    parser = _serve_parser()
    action = next((a for a in parser._actions if item.flag in a.option_strings), None)
    assert action is not None, f"{item.flag} is missing from encoderrt serve"
    assert action.dest == item.name and action.option_strings[0] == "--" + item.name.replace("_", "-")
    parsed = parser.parse_args([])
    assert getattr(parsed, item.name) == ([] if item.per_model else item.default)


@pytest.mark.parametrize("command", ["compile", "serve", "embed", "score", "bench", "cache"])
def test_each_commands_help_prints_every_help_text_whole(command, capsys):
    # argparse formats help texts with %: a setting's "within 10% of" once made `serve --help` a traceback
    with pytest.raises(SystemExit) as ended:
        build_parser().parse_args([command, "--help"])
    assert ended.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    if command == "serve":
        for item in SETTINGS:
            assert " ".join(item.help.split()) in shown, f"{item.flag}'s help is not shown whole"


@pytest.mark.parametrize("item", SETTINGS, ids=lambda item: item.name)
def test_each_app_setting_is_a_ray_argument_with_the_same_default(item):
    fields = RayAppArgs.model_fields
    if not item.in_app:
        assert item.name not in fields, f"{item.name} belongs to the process, not to a replica's app"
        return
    assert item.name in fields, f"Ray Serve's application takes no {item.name}"
    defaults = RayAppArgs.model_validate({"models": "m"})
    assert getattr(defaults, item.name) == ([] if item.per_model else item.default)


@pytest.mark.parametrize("item", SETTINGS, ids=lambda item: item.name)
def test_each_setting_has_its_row_in_the_docs(item):
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith(f"| `{item.flag}`")]
    assert len(rows) == 1, f"docs/configuration.md has {len(rows)} rows for {item.flag}"
    assert f"| {item.shown_default()} |" in rows[0]


def test_the_docs_page_is_what_the_declarations_generate():
    assert DOCS.read_text() == configuration_page(), "run: python scripts/write_configuration_docs.py"


def test_flags_reach_the_settings_objects_and_older_spellings_still_work():
    from encoderrt.runtime.settings import from_arguments

    args = _serve_parser().parse_args(["--max-queue", "7", "--max-wait-ms", "0.5", "--sessions", "2",
                                       "--request-read-timeout", "3", "--max-batch-tokens", "none"])
    engine = from_arguments(EngineConfig, args)
    assert (engine.max_queue_items, engine.max_wait_ms, engine.sessions, engine.max_batch_tokens) == (7, 0.5, 2, None)
    assert from_arguments(ConnectionLimits, args).request_read_timeout == 3.0
    ray = RayAppArgs.model_validate({"models": "m", "max_queue": 7, "served_model_names": "a"})
    assert ray.layer(EngineConfig).max_queue_items == 7 and ray.served_model_name == ["a"]


def test_ray_arguments_become_each_layers_settings():
    options = RayAppArgs.model_validate({"models": "a,b", "max_wait_ms": "0", "max_client_batch_size": "8",
                                         "long_inputs": "chunk", "default_prompt_name": ",query"})
    engine = options.layer(EngineConfig)
    assert (engine.max_wait_ms, engine.long_inputs) == (0.0, "chunk")
    assert options.layer(ServerSettings, engine=engine).max_client_batch_size == 8
    specs = options.specs()
    assert [s.default_prompt_name for s in specs] == ["", "query"] and [s.served_model_name for s in specs] == [None] * 2
    with pytest.raises(ValueError, match="3 --served-model-name values for 2 models"):
        RayAppArgs.model_validate({"models": "a,b", "served_model_name": "x,y,z"}).specs()


def _another_value(item) -> tuple[str, object]:
    """A value unlike the default, as the environment's text and as the parsed setting."""
    if item.per_model:
        return "a,b", ["a", "b"]
    if item.choices:
        other = next(c for c in item.choices if c != item.default)
        return other, other
    if item.scalar is int:
        return "7", 7
    if item.scalar is float:
        return "0.25", 0.25
    if item.scalar is bool:
        return ("off", False) if item.default else ("on", True)
    return "text", "text"


@pytest.mark.parametrize("item", SETTINGS, ids=lambda item: item.name)
def test_each_setting_is_also_an_environment_variable_that_a_flag_beats(item, monkeypatch):
    text, value = _another_value(item)
    monkeypatch.setenv(item.env, text)
    assert item.env == "ENCODERRT_" + item.name.upper()
    parser = _serve_parser()  # the variables are read when the parser is built, as at every start of the command
    assert getattr(parser.parse_args([]), item.name) == value
    if item.scalar is bool:  # --flag / --no-flag, no value
        flag = item.flag if item.default else "--no-" + item.flag.removeprefix("--")
        assert getattr(parser.parse_args([flag]), item.name) != value  # the command line wins
        return
    flag_value = "z" if item.per_model else str(item.default if item.default is not None else 3)
    assert getattr(parser.parse_args([item.flag, flag_value]), item.name) != value  # the command line wins


@pytest.mark.parametrize(("env", "text", "says"), [
    ("ENCODERRT_PORT", "eighty", "argument --port: 'eighty' (from ENCODERRT_PORT) is not an integer"),
    ("ENCODERRT_LONG_INPUTS", "split", "'split' (from ENCODERRT_LONG_INPUTS) is not one of truncate, chunk"),
    ("ENCODERRT_MAX_BATCH_TOKENS", "many", "is not an integer or none"),
])
def test_a_bad_variable_is_a_usage_error_naming_it(env, text, says, monkeypatch, capsys):
    monkeypatch.setenv(env, text)
    with pytest.raises(SystemExit) as exit_:
        _serve_parser().parse_args([])
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_models_come_from_a_variable_where_no_model_is_given(monkeypatch):
    monkeypatch.setenv("ENCODERRT_MODELS", "/models/a,/models/b")
    assert _serve_parser().parse_args([]).models == [Path("/models/a"), Path("/models/b")]
    assert _serve_parser().parse_args(["/m/c"]).models == [Path("/m/c")]
    monkeypatch.delenv("ENCODERRT_MODELS")
    assert _serve_parser().parse_args([]).models == []


@pytest.mark.parametrize("item", SETTINGS, ids=lambda item: item.name)
def test_each_variable_is_named_in_the_docs_row_of_its_flag(item):
    (row,) = [line for line in DOCS.read_text().splitlines() if line.startswith(f"| `{item.flag}`")]
    assert f"| `{item.env}` |" in row
