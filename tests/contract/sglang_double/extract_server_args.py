"""How server_args_<version>.json was made: SGLang's server CLI arguments, read from its wheel without importing it.

A maintenance tool, not part of the package or of the test run. SGLang does not import without its GPU stack, so this
reads sglang/srt/server_args.py from the wheel and runs SGLang's own `add_cli_args_from_dataclass`
(sglang/srt/arg_groups/arg_utils.py, standard library only) over a copy of `ServerArgs`' field declarations, then the
hand-written `add_argument` calls of `ServerArgs.add_cli_args`, both against a parser that records every call.
Names the fields use are resolved from the wheel's own source: module constants by evaluating their assignments,
parser choices (`ReasoningParser.DetectorMap`, `FunctionCallParser.ToolCallParserEnum`, `RealKvHashMode`) from the
keys and members their classes declare; functions and classes (type parsers, actions) are recorded by name.

Rerun after moving the SGLang pin (slime's image pins it in docker/version.txt):

    pip download --no-deps sglang==0.5.15.post1 -d /tmp/sgl
    python tests/contract/sglang_double/extract_server_args.py /tmp/sgl/sglang-0.5.15.post1-*.whl
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import importlib.util
import json
import sys
import types
import typing
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


class Ref:
    """A name SGLang's source uses that is a function, class or runtime value: kept as its dotted expression."""

    def __init__(self, expr: str) -> None:
        self.expr = expr

    def __getattr__(self, name: str) -> Ref:
        if name.startswith("__"):
            raise AttributeError(name)
        return Ref(f"{self.expr}.{name}")

    def __call__(self, *args: object, **kwargs: object) -> Ref:
        return Ref(f"{self.expr}(...)")

    def __getitem__(self, item: object) -> Ref:
        return Ref(f"{self.expr}[...]")


class Recorder:
    """Stands in for argparse.ArgumentParser: keeps each add_argument call's names and keywords."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []

    def add_argument(self, *names: str, **kwargs: object) -> None:
        self.calls.append((names, kwargs))


class Wheel:
    def __init__(self, path: Path) -> None:
        self.zip = zipfile.ZipFile(path)

    def source(self, module: str) -> str:
        path = module.replace(".", "/")
        names = set(self.zip.namelist())
        return self.zip.read(path + ".py" if path + ".py" in names else path + "/__init__.py").decode()

    def load_stdlib_module(self, module: str) -> types.ModuleType:
        """A module of the wheel that imports only the standard library (arg_utils, argparse_actions)."""
        spec = importlib.util.spec_from_loader(module, loader=None)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[module] = mod
        # the wheel's own module, which imports only the standard library: run as SGLang runs it
        exec(compile(self.source(module), module, "exec"), mod.__dict__)  # noqa: S102
        return mod

    def top_level(self, module: str, name: str) -> object:
        """A module-level constant of the wheel (literal, or built from other constants), a class holding only
        constants (as a namespace), else a Ref."""
        tree = ast.parse(self.source(module))
        found = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
        if found is not None:
            body = [n for n in found.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
            if not body or not all(isinstance(n, ast.Assign) for n in body):
                return Ref(name)
            constants = self._evaluate(body, module)
            return types.SimpleNamespace(**constants) if len(constants) == len(body) else Ref(name)
        return self._evaluate(tree.body, module).get(name, Ref(name))

    @staticmethod
    def _evaluate(statements: list[ast.stmt], module: str) -> dict[str, object]:
        namespace: dict[str, object] = {}
        for node in statements:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            if node.__class__ is ast.AnnAssign and node.value is None:
                continue
            for target in targets:
                if isinstance(target, ast.Name):
                    try:
                        namespace[target.id] = eval(compile(ast.Expression(node.value), module, "eval"),
                                                    dict(namespace))
                    except Exception:  # noqa: BLE001 - a runtime value: not a constant this tool can read
                        namespace.pop(target.id, None)
        return namespace

    def class_dict_keys(self, module: str, cls: str, attr: str) -> list[str]:
        node = self._class(module, cls)
        for stmt in node.body:
            target = stmt.target if isinstance(stmt, ast.AnnAssign) else (stmt.targets[0] if isinstance(stmt, ast.Assign) else None)
            if isinstance(target, ast.Name) and target.id == attr:
                return [ast.literal_eval(key) for key in stmt.value.keys]
        raise LookupError(f"{module}.{cls}.{attr}")

    def enum_members(self, module: str, cls: str) -> list[str]:
        node = self._class(module, cls)
        return [stmt.targets[0].id for stmt in node.body if isinstance(stmt, ast.Assign)]

    def _class(self, module: str, cls: str) -> ast.ClassDef:
        return next(n for n in ast.walk(ast.parse(self.source(module))) if isinstance(n, ast.ClassDef) and n.name == cls)


def imported_names(tree: ast.Module) -> dict[str, str]:
    """name -> the module it is imported from (absolute imports of server_args.py)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                out[alias.asname or alias.name] = node.module
    return out


def server_args_namespace(wheel: Wheel, tree: ast.Module, arg_utils: types.ModuleType,
                          actions: types.ModuleType) -> dict[str, object]:
    """Every name ServerArgs' field declarations and add_cli_args use, resolved as described in the docstring."""
    module = "sglang.srt.server_args"
    namespace: dict[str, object] = {"A": arg_utils.A, "Arg": arg_utils.Arg, "argparse": argparse, "json": json,
                                    "dataclasses": dataclasses, **{n: getattr(typing, n) for n in typing.__all__}}
    namespace.update({n: getattr(actions, n) for n in dir(actions) if n.endswith("Action")})
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    used = {n.id for n in ast.walk(cls) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    imports = imported_names(tree)
    for name in sorted(used - namespace.keys() - set(dir(__builtins__)) - {"ServerArgs"}):
        source = imports.get(name, module)
        value = wheel.top_level(source, name) if source.startswith("sglang") else Ref(name)
        namespace[name] = Ref(name) if isinstance(value, Ref) else value
    namespace["ReasoningParser"] = types.SimpleNamespace(DetectorMap=dict.fromkeys(
        wheel.class_dict_keys(imports["ReasoningParser"], "ReasoningParser", "DetectorMap")))
    namespace["FunctionCallParser"] = types.SimpleNamespace(ToolCallParserEnum=dict.fromkeys(
        wheel.class_dict_keys(imports["FunctionCallParser"], "FunctionCallParser", "ToolCallParserEnum")))
    namespace["RealKvHashMode"] = [types.SimpleNamespace(name=m) for m in
                                   wheel.enum_members(imports["RealKvHashMode"], "RealKvHashMode")]
    return namespace


def record_cli_args(wheel: Wheel) -> list[tuple[tuple, dict]]:
    arg_utils = wheel.load_stdlib_module("sglang.srt.arg_groups.arg_utils")
    actions = wheel.load_stdlib_module("sglang.srt.arg_groups.argparse_actions")
    tree = ast.parse(wheel.source("sglang.srt.server_args"))
    namespace = server_args_namespace(wheel, tree, arg_utils, actions)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    fields = [stmt for stmt in cls.body if isinstance(stmt, ast.AnnAssign)]
    add_cli_args = next(stmt for stmt in cls.body if isinstance(stmt, ast.FunctionDef) and stmt.name == "add_cli_args")
    add_cli_args.decorator_list = []
    body = ast.Module(body=[ast.ClassDef(name="ServerArgs", bases=[], keywords=[], body=fields, decorator_list=[]),
                                add_cli_args], type_ignores=[])
    module = types.ModuleType("sglang.srt.server_args")  # get_type_hints reads the class's module globals
    module.__dict__.update(namespace)
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    # ServerArgs' own field declarations and add_cli_args, from the wheel
    exec(compile(ast.fix_missing_locations(body), module.__name__, "exec"), namespace)  # noqa: S102
    server_args = dataclasses.dataclass(namespace["ServerArgs"])
    namespace["ServerArgs"] = server_args
    namespace["add_cli_args_from_dataclass"] = arg_utils.add_cli_args_from_dataclass
    recorder = Recorder()
    namespace["add_cli_args"](recorder)
    return recorder.calls


def encode(value: object) -> object:
    """JSON for one keyword value; what JSON cannot hold is tagged: {"$callable": name}, {"$tuple": [...]},
    {"$set": [...]}."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        if isinstance(value, (set, frozenset)):
            return {"$set": [encode(v) for v in sorted(value)]}
        items = [encode(v) for v in value]
        return items if isinstance(value, list) else {"$tuple": items}
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, Ref):
        return {"$callable": value.expr}
    if callable(value):
        module = getattr(value, "__module__", "")
        prefix = "argparse." if module == "argparse" else "json." if module == "json" else ""
        return {"$callable": prefix + value.__qualname__}
    raise TypeError(f"cannot record {value!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    wheel = Wheel(args.wheel)
    version = args.wheel.name.split("-")[1]
    arguments = [{"flags": list(names), **{k: encode(v) for k, v in kwargs.items() if k != "help"}}
                 for names, kwargs in record_cli_args(wheel)]
    record = {
        "sglang": version,
        "made_by": "tests/contract/sglang_double/extract_server_args.py " + args.wheel.name,
        "wheel_sha256": hashlib.sha256(args.wheel.read_bytes()).hexdigest(),
        "source": "sglang/srt/server_args.py ServerArgs.add_cli_args (help texts left out)",
        "arguments": arguments,
    }
    out = args.out or HERE / f"server_args_{version}.json"
    head = json.dumps({k: v for k, v in record.items() if k != "arguments"}, indent=1)[:-2]
    lines = ",\n  ".join(json.dumps(argument) for argument in arguments)  # one argument a line: readable diffs
    out.write_text(f'{head},\n "arguments": [\n  {lines}\n ]\n}}\n')
    print(f"{out}: {len(arguments)} arguments")


if __name__ == "__main__":
    main()
