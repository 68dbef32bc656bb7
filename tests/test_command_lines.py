"""The installed commands' command lines ([project.scripts]): every numeric option is checked as it is parsed, in
one line that names the option and the rule, before anything starts or is written; and --help answers without
loading tau2, litellm or torch (the commands that did took seconds of CPU to print their help)."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tau2_rl_pipeline.config import Bounded

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
HEAVY = ("tau2", "litellm", "torch", "transformers")


def entry_point(name: str):
    module, function = COMMANDS[name].split(":")
    return getattr(importlib.import_module(module), function)


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def command_parser(name: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """The parser the command's own main builds (caught as it parses, so nothing else runs)."""
    def catch(parser, args=None, namespace=None):
        raise _Parsed(parser)

    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_known_args", catch)
        with pytest.raises(_Parsed) as caught:
            entry_point(name)([])
    return caught.value.parser


def numeric_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.type in (int, float) or isinstance(a.type, Bounded)]


def bad_values(rule: Bounded) -> list[str]:
    """Values just outside each of the rule's bounds, and ones that are not numbers of its kind."""
    values = ["x", "1.5" if rule.kind is int else "nan"]
    if rule.at_least is not None:
        values.append(f"{rule.at_least - 1:g}")
    if rule.above is not None:
        values.append(f"{rule.above:g}")
    if rule.at_most is not None:
        values.append(f"{rule.at_most + 1:g}")
    if rule.multiple_of:
        values.append(f"{(rule.at_least or 0) + rule.multiple_of + 1:g}")
    return [v for v in values if v not in {f"{a:g}" for a in rule.also}]


def refusal(parser: argparse.ArgumentParser, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_numeric_option_is_checked_as_it_is_parsed(name: str, monkeypatch, capsys) -> None:
    """Each command's numeric options (its TAU2_* flags too): an argparse type with a rule, which refuses a value
    just outside each bound in one line naming the option and the rule, and accepts the option's default."""
    parser = command_parser(name, monkeypatch)
    unchecked = [a.option_strings[0] for a in numeric_actions(parser) if not isinstance(a.type, Bounded)]
    assert unchecked == [], f"{name}: numeric options parsed without a rule: {unchecked}"
    for action in numeric_actions(parser):
        option, rule = action.option_strings[0], action.type
        if action.default is not None:
            assert rule(str(action.default)) == action.default, (name, option, rule.rule)
        for value in bad_values(rule):
            line = refusal(parser, [option, value], capsys)
            assert line == f"{parser.prog}: error: argument {option}: must be {rule.rule}, got {value!r}", line


def test_the_rules_say_what_they_allow() -> None:
    assert Bounded(int, at_least=1).rule == "a whole number >= 1"
    assert Bounded(float, above=0.0, at_most=1.0).rule == "a number > 0 and <= 1"
    assert Bounded(int, at_least=1, also=(-1,)).rule == "-1 or a whole number >= 1"
    assert Bounded(int, at_least=8, multiple_of=8, why="4 heads").rule == \
        "a whole number >= 8 and a multiple of 8 (4 heads)"
    top_k = Bounded(int, at_least=1, also=(-1,))
    assert top_k("-1") == -1 and top_k(" 20 ") == 20
    for bad in ("0", "-2", "2.0"):
        with pytest.raises(argparse.ArgumentTypeError, match="must be -1 or a whole number >= 1"):
            top_k(bad)
    for bad in ("inf", "-inf", "nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            Bounded(float, at_least=0.0)(bad)


# The demo's options as a new user met them, then each of its other numeric options just outside its rule.
DEMO_SEEN = [("--grpo-steps", "-3"), ("--sft-epochs", "-1"), ("--grpo-n", "0"), ("--grpo-lr", "-1"),
             ("--eval-samples", "0"), ("--max-new-tokens", "0"), ("--hidden-size", "-5"), ("--hidden-size", "12")]


def demo_cases() -> list[tuple[str, str]]:
    from tau2_rl_pipeline.local.pipeline import build_parser

    seen = {option for option, _ in DEMO_SEEN}
    others = [(a.option_strings[0], bad_values(a.type)[-1]) for a in numeric_actions(build_parser())
              if a.option_strings[0] not in seen]
    return DEMO_SEEN + others


@pytest.mark.parametrize("option,value", demo_cases())
def test_a_bad_number_stops_the_demo_before_anything_is_written(option: str, value: str, tmp_path, monkeypatch,
                                                                  capsys) -> None:
    from tau2_rl_pipeline.local.pipeline import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main([option, value, "--out", "demo"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"tau2-rl-demo: error: argument {option}: must be "), err
    assert list(tmp_path.iterdir()) == []  # no --out, no outputs/, no tokenizer: nothing started


def test_the_evaluator_and_the_qualifier_refuse_a_bad_number_before_writing(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    for name, argv, option in (
            ("tau2-rl-eval", ["--runs", "0", "--output", "run.json"], "--runs"),
            ("tau2-rl-eval", ["--top-p", "0", "--output", "run.json"], "--top-p"),
            ("tau2-rl-qualify-user", ["--max-failure-rate", "2", "--output", "q.json"], "--max-failure-rate"),
            ("tau2-rl-qualify-user", ["--concurrency", "0", "--output", "q.json"], "--concurrency")):
        with pytest.raises(SystemExit) as exited:
            entry_point(name)(argv)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and err.startswith(f"{name}: error: argument {option}: must be "), err
        assert list(tmp_path.iterdir()) == []


def test_a_bad_number_from_the_shell_is_one_line_and_exit_2(tmp_path) -> None:
    """What the new user saw as a 16-line traceback, through the module a console script runs."""
    proc = subprocess.run([sys.executable, "-m", "tau2_rl_pipeline.local.pipeline", "--hidden-size", "-5",
                           "--out", "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and proc.stderr == (
        "tau2-rl-demo: error: argument --hidden-size: must be a whole number >= 8 and a multiple of 8 "
        "(4 heads of an even size), got '-5'\n"), proc.stderr
    assert list(tmp_path.iterdir()) == []


HELP_CHILD = """
import json, sys
from {module} import {function}
sys.argv = [{name!r}, "--help"]
try:
    {function}()
    code = None
except SystemExit as e:
    code = e.code
sys.stdout.flush()
print(json.dumps({{"code": code, "loaded": sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})}}),
      file=sys.stderr)
"""


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_loads_neither_tau2_nor_litellm(name: str, tmp_path) -> None:
    """--help of each installed command, in a fresh interpreter: the help, and none of tau2, litellm, torch or
    transformers imported (tau2-rl-eval and tau2-rl-qualify-user loaded tau2 and litellm first: 4 s of CPU)."""
    module, function = COMMANDS[name].split(":")
    code = HELP_CHILD.format(module=module, function=function, name=name, heavy=HEAVY)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    result = json.loads(proc.stderr.splitlines()[-1])
    assert result["code"] == 0 and proc.stdout.startswith(f"usage: {name} "), proc.stderr[-2000:]
    assert result["loaded"] == [], f"{name} --help imported {result['loaded'][:8]}"


def test_the_rule_check_catches_an_unchecked_option() -> None:
    """The walk above would see a plain type=int (a new option added without a rule)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--rate", type=Bounded(float, above=0.0), default=1.0)
    assert [a.option_strings[0] for a in numeric_actions(parser) if not isinstance(a.type, Bounded)] == ["--steps"]
    assert math.isnan(float(bad_values(Bounded(float, at_least=0.0))[1]))
