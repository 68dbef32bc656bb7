"""The one place that defines configuration.

Every knob is a field of `Tau2Config`, read from a documented `TAU2_*` environment variable (listed in
`configs/.env.template` and the README) and overridable from CLI flags. A bad value is a one-line
`ConfigError` naming the variable. Secrets (API keys) are never fields: they are read from the
environment by litellm / huggingface-hub when used.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

ENV_PREFIX = "TAU2_"


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the variable and says what is valid."""


def _meta(doc: str, *, choices: tuple[str, ...] | None = None, min_value: float | None = None,
          max_value: float | None = None) -> dict[str, Any]:
    return {"doc": doc, "choices": choices, "min": min_value, "max": max_value}


@dataclass
class Tau2Config:
    # -- user simulator -------------------------------------------------------------------------
    user_model: str = field(default="gpt-4.1", metadata=_meta(
        "litellm model name of the user simulator (tau2's default gpt-4.1; at scale "
        "openai/Qwen/Qwen3-4B-Instruct-2507 served by scripts/start_user_sim.sh)"))
    user_api_base: str = field(default="", metadata=_meta(
        "API base of the user simulator, e.g. http://127.0.0.1:30001/v1; empty = the provider default"))
    user_temperature: float = field(default=0.0, metadata=_meta(
        "sampling temperature of the user simulator", min_value=0.0, max_value=2.0))
    # -- episode ----------------------------------------------------------------------------------
    max_steps: int = field(default=200, metadata=_meta(
        "tau2's max_steps: orchestrator steps before the episode ends as max_steps", min_value=1))
    max_errors: int = field(default=10, metadata=_meta(
        "tau2's max_errors: failed tool calls (parse errors included) before the episode ends", min_value=1))
    max_turns: int = field(default=30, metadata=_meta(
        "policy turns (generate calls) per episode before it ends as truncated", min_value=1))
    max_context_len: int = field(default=32768, metadata=_meta(
        "prompt + response tokens per episode; longer ends the episode as truncated", min_value=16))

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Tau2Config":
        """Defaults, then `TAU2_*` variables, then explicit overrides (CLI flags); validated."""
        environ = os.environ if environ is None else environ
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in fields(cls):
            name = env_var(f.name)
            if name in environ:
                values[f.name] = _parse(name, environ[name], hints[f.name])
        for key, value in overrides.items():
            if value is None:
                continue
            if key not in hints:
                raise ConfigError(f"unknown config field {key!r}; valid: {', '.join(sorted(hints))}")
            values[key] = value
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            choices, lo, hi = f.metadata.get("choices"), f.metadata.get("min"), f.metadata.get("max")
            if choices and value not in choices:
                raise ConfigError(f"{env_var(f.name)}={value!r} is not one of: {', '.join(choices)}")
            if lo is not None and value < lo:
                raise ConfigError(f"{env_var(f.name)}={value!r} must be >= {lo}")
            if hi is not None and value > hi:
                raise ConfigError(f"{env_var(f.name)}={value!r} must be <= {hi}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def env_var(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse(name: str, raw: str, typ: Any) -> Any:
    text = raw.strip()
    try:
        if typ is bool:
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ValueError
        if typ is int:
            return int(text)
        if typ is float:
            return float(text)
        if typing.get_origin(typ) is tuple:
            return tuple(float(x) for x in text.split(","))
        return text
    except ValueError:
        kind = "true/false" if typ is bool else getattr(typ, "__name__", str(typ))
        raise ConfigError(f"{name}={raw!r} is not a valid {kind}") from None


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Expose every config field as a `--flag` (default None = keep the env/default value)."""
    hints = typing.get_type_hints(Tau2Config)
    group = parser.add_argument_group("tau2 config (each also settable as TAU2_<NAME>)")
    for f in fields(Tau2Config):
        flag = "--" + f.name.replace("_", "-")
        typ = hints[f.name]
        if typ is bool:
            group.add_argument(flag, dest=f.name, default=None, action=argparse.BooleanOptionalAction,
                               help=f.metadata["doc"])
        elif typing.get_origin(typ) is tuple:
            group.add_argument(flag, dest=f.name, default=None,
                               type=lambda s, n=env_var(f.name): _parse(n, s, tuple[float, ...]),
                               help=f.metadata["doc"] + " (comma-separated)")
        else:
            group.add_argument(flag, dest=f.name, default=None, type=typ, help=f.metadata["doc"])


def config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Tau2Config:
    names = {f.name for f in fields(Tau2Config)}
    overrides = {k: v for k, v in vars(args).items() if k in names}
    return Tau2Config.from_env(environ, **overrides)
