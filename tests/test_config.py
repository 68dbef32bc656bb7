"""The one config: env parsing, one-line errors naming the variable, CLI precedence, and a template that
cannot drift from the dataclass."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from pathlib import Path

import pytest

from tau2_rl_pipeline.config import ConfigError, Tau2Config, add_config_args, config_from_args, env_var

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "configs" / ".env.template"
FIELD_SECTION = "# ===== Tau2Config fields"
OTHER_SECTION = "# ===== Other variables"


def _template_section(start: str, end: str | None) -> str:
    text = TEMPLATE.read_text()
    body = text[text.index(start):]
    return body[:body.index(end)] if end else body


def test_template_lists_exactly_the_config_fields_with_their_defaults():
    assigned = dict(re.findall(r"^# (TAU2_\w+)=(.*)$", _template_section(FIELD_SECTION, OTHER_SECTION), re.MULTILINE))
    expected = {env_var(f.name) for f in fields(Tau2Config)}
    assert sorted(assigned) == sorted(expected)
    # each default, as written, parses back to the field's default
    parsed = Tau2Config.from_env(assigned)
    for f in fields(Tau2Config):
        assert getattr(parsed, f.name) == f.default, f"{env_var(f.name)} in the template: {assigned[env_var(f.name)]}"
    other = re.findall(r"^# (TAU2_\w+)=", _template_section(OTHER_SECTION, None), re.MULTILINE)
    assert not set(other) & expected, "a config field is documented among the other variables"


def test_template_names_secrets_without_values():
    secrets = dict(re.findall(r"^#?\s*(\w*(?:KEY|TOKEN)\w*)=(.*)$", TEMPLATE.read_text(), re.MULTILINE))
    assert {"OPENAI_API_KEY", "HF_TOKEN", "WANDB_API_KEY"} <= set(secrets)
    assert all(value == "" for value in secrets.values()), secrets


def test_every_field_is_read_outside_config():
    """A setting nobody reads is a lie in the docs: each field must appear as `.name` in some module."""
    sources = "\n".join(p.read_text() for p in (ROOT / "tau2_rl_pipeline").rglob("*.py") if p.name != "config.py")
    unread = [f.name for f in fields(Tau2Config) if not re.search(rf"\.{f.name}\b", sources)]
    assert not unread, f"config fields read nowhere: {unread}"


# ---------------------------------------------------------------------------------------------------
# parsing and validation


def test_env_values_are_parsed_by_type():
    cfg = Tau2Config.from_env({
        "TAU2_REWARD_ALPHA": " 0.5 ", "TAU2_APPLY_CURRICULUM_WEIGHTS": "off", "TAU2_FILTER_ZERO_STD": "Yes",
        "TAU2_PARTIAL_WEIGHTS": "1,0,0,0.5", "TAU2_CURRICULUM_MIN_ATTEMPTS": "8", "TAU2_TASK_SAMPLER": "learning_value",
        "TAU2_CURRICULUM_STATE_PATH": "/tmp/c.json", "UNRELATED": "x"})
    assert cfg.reward_alpha == 0.5 and cfg.apply_curriculum_weights is False and cfg.filter_zero_std is True
    assert cfg.partial_weights == (1.0, 0.0, 0.0, 0.5) and cfg.curriculum_min_attempts == 8
    assert cfg.task_sampler == "learning_value" and cfg.curriculum_state_path == "/tmp/c.json"
    assert Tau2Config.from_env({}) == Tau2Config()


@pytest.mark.parametrize("environ,variable,says", [
    ({"TAU2_REWARD_ALPHA": "abc"}, "TAU2_REWARD_ALPHA", "not a valid float"),
    ({"TAU2_REWARD_ALPHA": "-0.1"}, "TAU2_REWARD_ALPHA", ">= 0"),
    ({"TAU2_REWARD_ALPHA": "nan"}, "TAU2_REWARD_ALPHA", "finite"),
    ({"TAU2_APPLY_CURRICULUM_WEIGHTS": "maybe"}, "TAU2_APPLY_CURRICULUM_WEIGHTS", "true/false"),
    ({"TAU2_PARTIAL_WEIGHTS": "0.5,0.2,0.3"}, "TAU2_PARTIAL_WEIGHTS", "4 non-negative"),
    ({"TAU2_PARTIAL_WEIGHTS": "0.5,a,0.3,0"}, "TAU2_PARTIAL_WEIGHTS", "comma-separated list of numbers"),
    ({"TAU2_TELECOM_PARTIAL_WEIGHTS": "0.5,-0.2,0.3,0"}, "TAU2_TELECOM_PARTIAL_WEIGHTS", "4 non-negative"),
    ({"TAU2_TELECOM_PARTIAL_WEIGHTS": "0,0,0,0"}, "TAU2_TELECOM_PARTIAL_WEIGHTS", "positive sum"),
    ({"TAU2_CURRICULUM_HARD_THRESHOLD": "0.8"}, "TAU2_CURRICULUM_HARD_THRESHOLD", "below TAU2_CURRICULUM_SOLVED"),
    ({"TAU2_CURRICULUM_SOLVED_THRESHOLD": "1.5"}, "TAU2_CURRICULUM_SOLVED_THRESHOLD", "<= 1.0"),
    ({"TAU2_CURRICULUM_MIN_ATTEMPTS": "0"}, "TAU2_CURRICULUM_MIN_ATTEMPTS", ">= 1"),
    ({"TAU2_CURRICULUM_MIN_ATTEMPTS": "2.5"}, "TAU2_CURRICULUM_MIN_ATTEMPTS", "not a valid int"),
    ({"TAU2_TASK_SAMPLER": "greedy"}, "TAU2_TASK_SAMPLER", "uniform, learning_value"),
    ({"TAU2_SAMPLER_FLOOR": "0"}, "TAU2_SAMPLER_FLOOR", "> 0"),
    ({"TAU2_SAMPLER_FLOOR": "0.3"}, "TAU2_SAMPLER_FLOOR", "<= 0.25"),
    ({"TAU2_MAX_STEPS": "0"}, "TAU2_MAX_STEPS", ">= 1"),
])
def test_bad_values_give_one_line_errors_naming_the_variable(environ, variable, says):
    with pytest.raises(ConfigError) as err:
        Tau2Config.from_env(environ)
    message = str(err.value)
    assert message.startswith(variable + "=") and says in message and "\n" not in message


def test_unknown_override_is_rejected():
    with pytest.raises(ConfigError, match="unknown config field 'reward_alfa'"):
        Tau2Config.from_env({}, reward_alfa=0.3)


# ---------------------------------------------------------------------------------------------------
# CLI


def _parse(argv: list[str], environ: dict[str, str]) -> Tau2Config:
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    return config_from_args(parser.parse_args(argv), environ)


def test_cli_flags_beat_env_and_env_beats_defaults():
    environ = {"TAU2_REWARD_ALPHA": "0.5", "TAU2_APPLY_CURRICULUM_WEIGHTS": "1",
               "TAU2_PARTIAL_WEIGHTS": "0,1,0,0", "TAU2_TASK_SAMPLER": "learning_value"}
    cfg = _parse(["--reward-alpha", "0.1", "--no-apply-curriculum-weights", "--partial-weights", "1,0,0,0"], environ)
    assert (cfg.reward_alpha, cfg.apply_curriculum_weights, cfg.partial_weights) == (0.1, False, (1.0, 0.0, 0.0, 0.0))
    assert cfg.task_sampler == "learning_value"  # no flag: the env value stays
    assert _parse([], {}).reward_alpha == 0.25


def test_cli_values_are_validated_too():
    with pytest.raises(ConfigError, match="^TAU2_CURRICULUM_HARD_THRESHOLD="):
        _parse(["--curriculum-hard-threshold", "0.9"], {})
    with pytest.raises(ConfigError, match="^TAU2_PARTIAL_WEIGHTS="):
        _parse(["--partial-weights", "1,2"], {})


def test_the_settings_page_documents_every_variable_with_its_default():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "recipes-and-settings.md").read_text()
    for f in fields(Tau2Config):
        default = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else str(f.default)
        assert f"| `{env_var(f.name)}` | `{default}` |" in readme, env_var(f.name)


# ---------------------------------------------------------------------------------------------------
# unknown TAU2_* variables


def test_an_unknown_variable_gets_one_line_naming_the_closest_known_one():
    from tau2_rl_pipeline.config import unknown_variable_warnings

    lines = unknown_variable_warnings({"TAU2_USE_CURICULUM": "0", "TAU2_REWARD_ALPA": "0.5", "TAU2_ZZZ": "1",
                                       "TAU2_USE_CURRICULUM": "1", "TAU2_GPU_LAYOUT": "8", "OTHER_ALPA": "1"})
    assert len(lines) == 3 and all("\n" not in line for line in lines)
    by_name = {line.split()[1]: line for line in lines}
    assert by_name["TAU2_USE_CURICULUM"].endswith("did you mean TAU2_USE_CURRICULUM?")
    assert by_name["TAU2_REWARD_ALPA"].endswith("did you mean TAU2_REWARD_ALPHA?")
    assert "configs/.env.template" in by_name["TAU2_ZZZ"]


def test_from_env_warns_once_per_unknown_variable(capsys):
    environ = {"TAU2_FORMAT_PENALTI": "0.1"}
    assert Tau2Config.from_env(environ) == Tau2Config()  # ignored, not fatal
    Tau2Config.from_env(environ)
    err = capsys.readouterr().err
    assert err.count("TAU2_FORMAT_PENALTI") == 1 and "did you mean TAU2_FORMAT_PENALTY?" in err
    Tau2Config.from_env({"TAU2_LOG_LEVEL": "INFO", "TAU2_QWEN3_TOKENIZER": "x", "TAU2_REWARD_ALPHA": "0.1"})
    assert capsys.readouterr().err == ""


def test_the_other_known_variables_are_the_templates_other_section():
    from tau2_rl_pipeline.config import OTHER_VARIABLES

    other = re.findall(r"^# (TAU2_\w+)=", _template_section(OTHER_SECTION, None), re.MULTILINE)
    assert sorted(other) == sorted(OTHER_VARIABLES)


@pytest.mark.parametrize("environ,says", [
    ({"TAU2_GRPO_MIN_PASS_RATE": "0.6", "TAU2_GRPO_MAX_PASS_RATE": "0.5"}, "must not exceed TAU2_GRPO_MAX_PASS_RATE"),
    ({"TAU2_USE_JUDGE": "1"}, "needs TAU2_JUDGE_MODEL and TAU2_JUDGE_API_BASE"),
    ({"TAU2_USER_STRATEGY": "shout"}, "not one of: llm, react, verify, reflection"),
    ({"TAU2_FORMAT_PENALTY": "-1"}, ">= 0"),
])
def test_new_recipe_settings_are_checked(environ, says):
    with pytest.raises(ConfigError, match=says):
        Tau2Config.from_env(environ)


def test_help_shows_the_first_run_options_and_help_all_every_one(capsys, monkeypatch) -> None:
    """--help stays one screen (30 lines at 100 columns): groups marked more=True show under --help-all only, and
    --help says so."""
    monkeypatch.setenv("COLUMNS", "100")
    from tau2_rl_pipeline.eval.args import build_parser as eval_parser
    from tau2_rl_pipeline.local.pipeline import build_parser as demo_parser

    for build, first, tuning in ((demo_parser, "--domain", "--grpo-steps"), (eval_parser, "--model", "--top-p")):
        parser = build()
        short, full = parser.format_help(), None
        with pytest.raises(SystemExit):
            parser.parse_args(["--help-all"])
        full = capsys.readouterr().out
        assert first in short and tuning not in short and "--help-all also lists" in short
        assert first in full and tuning in full and "--help-all also lists" not in full
        assert len(short.splitlines()) <= 30, short
        assert parser.parse_args([tuning, "1"]) is not None  # hidden from --help, still accepted
