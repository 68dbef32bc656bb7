"""sglang.srt.server_args.ServerArgs of SGLang 0.5.15.post1: its CLI arguments and the dataclass fields behind them.

SGLang's real module does not import without its GPU stack. Its CLI arguments (names, dest, action, nargs, type,
choices, defaults: everything but the help texts) were read from the wheel by ../../../extract_server_args.py into
../../../server_args_0.5.15.post1.json; `add_cli_args` registers exactly those, so slime's wrapper
(slime/backends/sglang_utils/arguments.py: the --sglang- prefix and its skip list) runs over SGLang's real surface.
The type parsers and argparse actions SGLang names are given here with the same parsing behaviour (sglang/srt/utils/
common.py, sglang/srt/arg_groups/argparse_actions.py); what only the server does with a value is left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "server_args_0.5.15.post1.json"
logger = logging.getLogger(__name__)


# ---- type parsers SGLang names (sglang/srt/utils/common.py, sglang/srt/model_executor/cuda_graph_config.py) -------
def nullable_str(val: str) -> str | None:
    return None if not val or val == "None" else val


def human_readable_int(value: str) -> int:
    """'1k' -> 1000, '1Ki' -> 1024, '25.6k' -> 25600 (decimals only with SI suffixes), else a plain int."""
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value.strip())
    if match is None:
        return int(value)
    number, suffix = match.groups()
    if suffix in iec and "." in number:
        raise argparse.ArgumentTypeError(f"Decimals are not allowed with IEC suffixes like '{suffix}'.")
    return int(float(number) * (iec.get(suffix) or si[suffix]))


def json_list_type(value: str) -> object:
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"Invalid JSON list: {value}. Please provide a valid JSON list.") from exc


def parse_cuda_graph_config_arg(raw: str) -> dict:
    """A JSON object of phase -> settings (SGLang also checks the phase names and keys; the double does not)."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}")
    return parsed


# ---- argparse actions SGLang names (sglang/srt/arg_groups/argparse_actions.py): same nargs, same stored values ---
def _deprecated(option_string: str, new_flag: str | None) -> None:
    replacement = f" Use '{new_flag}' instead." if new_flag else ""
    logger.warning(f"'{option_string}' is deprecated and will be removed in a future release.{replacement}")


class DeprecatedAction(argparse.Action):
    def __init__(self, option_strings, dest, nargs=0, **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        _deprecated(option_string, None)


class DeprecatedStoreTrueAction(argparse.Action):
    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        _deprecated(option_string, self.new_flag)
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(argparse.Action):
    def __init__(self, option_strings, dest, new_flag=None, const_value=None, nargs=0, default=None, **kwargs):
        self.new_flag, self.const_value = new_flag, const_value
        super().__init__(option_strings, dest, nargs=nargs, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        _deprecated(option_string, self.new_flag)
        setattr(namespace, self.dest, self.const_value)


class DeprecatedAliasStoreAction(argparse.Action):
    def __init__(self, option_strings, dest, new_flag=None, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        _deprecated(option_string, self.new_flag)
        setattr(namespace, self.dest, values)


class LoRAPathAction(argparse.Action):
    """Each value is a path, or a JSON object with lora_name and lora_path."""

    def __call__(self, parser, namespace, values, option_string=None):
        paths = []
        for value in values or []:
            value = value.strip()
            paths.append(json.loads(value) if value.startswith("{") and value.endswith("}") else value)
        setattr(namespace, self.dest, paths)


CALLABLES = {
    "str": str, "int": int, "float": float, "json.loads": json.loads, "argparse.BooleanOptionalAction":
    argparse.BooleanOptionalAction, **{f.__name__: f for f in (nullable_str, human_readable_int, json_list_type,
                                                                 parse_cuda_graph_config_arg)},
    **{c.__name__: c for c in (DeprecatedAction, DeprecatedStoreTrueAction, DeprecatedStoreConstAction,
                               DeprecatedAliasStoreAction, LoRAPathAction)},
}


def _decode(value: object) -> object:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if "$callable" in value:
            return CALLABLES[value["$callable"]]
        if "$tuple" in value:
            return tuple(_decode(v) for v in value["$tuple"])
        if "$set" in value:
            return {_decode(v) for v in value["$set"]}
        return {k: _decode(v) for k, v in value.items()}
    return value


def cli_arguments() -> list[tuple[list[str], dict]]:
    """(flags, add_argument keywords) of every SGLang server argument, in SGLang's order."""
    record = json.loads(DATA.read_text())
    return [(arg["flags"], {k: _decode(v) for k, v in arg.items() if k != "flags"}) for arg in record["arguments"]]


def _fields() -> list[tuple]:
    """One dataclass field per argument dest (first registration wins), with SGLang's CLI default."""
    fields: dict[str, tuple] = {}
    for flags, kwargs in cli_arguments():
        dest = kwargs.get("dest") or flags[0].lstrip("-").replace("-", "_")
        default = kwargs.get("default")
        if dest in fields or default == argparse.SUPPRESS:
            continue
        spec = dataclasses.field(default_factory=lambda d=default: type(d)(d)) if isinstance(default, (list, dict, set)) \
            else dataclasses.field(default=default)
        fields[dest] = (dest, object, spec)
    return list(fields.values())


def _add_cli_args(parser: argparse.ArgumentParser) -> None:
    """SGLang's server flags, as ServerArgs.add_cli_args registers them (slime prefixes them with --sglang-)."""
    for flags, kwargs in cli_arguments():
        parser.add_argument(*flags, **kwargs)


def _url(self) -> str:
    """ServerArgs.url: where the server answers (an IPv6 host in brackets)."""
    return f"http://[{self.host}]:{self.port}" if ":" in self.host else f"http://{self.host}:{self.port}"


ServerArgs = dataclasses.make_dataclass("ServerArgs", _fields(),
                                        namespace={"add_cli_args": staticmethod(_add_cli_args), "url": _url,
                                                   "__module__": __name__})
