"""How configs/slime_flags.txt was made: runs the real argument parsers of slime and Megatron-LM (checked out at
the commits the flag file names, into /tmp/slime_src and /tmp/megatron_src) and reads SGLang's ServerArgs from its
wheel's source (/tmp/sgl). A maintenance tool, not part of the package: rerun it when bumping the pinned commits."""
import argparse, ast, importlib, sys, types

MEG = "/tmp/megatron_src"; SLIME = "/tmp/slime_src"; SGL = "/tmp/sgl/full/sglang/srt/server_args.py"
sys.path[:0] = [MEG, SLIME]

def long_flags(parser):
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--")}

def literal_flags(path, func_name=None):
    tree = ast.parse(open(path).read())
    scope = tree
    if func_name:
        scope = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == func_name)
    out = set()
    for c in ast.walk(scope):
        if isinstance(c, ast.Call) and getattr(c.func, "attr", None) == "add_argument":
            out |= {a.value for a in c.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    return out

# ---- SGLang 0.5.15.post1 ServerArgs: (names, dest) per CLI argument, by arg_utils.py's rules
def sglang_args():
    tree = ast.parse(open(SGL).read())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    groups = []
    for st in cls.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            ann = st.annotation
            if not (isinstance(ann, ast.Subscript) and getattr(ann.value, "id", None) == "A"):
                continue
            elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            if len(elts) < 2:
                continue
            m = elts[1]
            names = ["--" + st.target.id.replace("_", "-")]
            if isinstance(m, ast.Call) and getattr(m.func, "id", None) == "Arg":
                kw = {k.arg: k.value for k in m.keywords}
                if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value is True:
                    continue
                if "cli_name" in kw:
                    names = [kw["cli_name"].value]
                if "aliases" in kw:
                    names += [e.value for e in kw["aliases"].elts]
            groups.append((names, st.target.id))
        if isinstance(st, ast.FunctionDef) and st.name == "add_cli_args":
            for c in ast.walk(st):
                if isinstance(c, ast.Call) and getattr(c.func, "attr", None) == "add_argument":
                    names = [a.value for a in c.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
                    dest = next((k.value.value for k in c.keywords if k.arg == "dest"), names[0][2:].replace("-", "_"))
                    groups.append((names, dest))
    # a field declared twice in the class body counts once (the dataclass keeps the last)
    return list({dest: (names, dest) for names, dest in groups}.values())

SGL_GROUPS = sglang_args()

# ---- stubs for what slime imports from SGLang (not installable here); slime's own wrapper logic runs for real
class _ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        for names, dest in SGL_GROUPS:
            parser.add_argument(*names, dest=dest)
class _RouterArgs:
    @staticmethod
    def add_cli_args(parser, use_router_prefix=False, exclude_host_port=False):
        pass
for name, attrs in {"sglang": {}, "sglang.srt": {}, "sglang.srt.server_args": {"ServerArgs": _ServerArgs},
                    "sglang_router": {}, "sglang_router.launch_router": {"RouterArgs": _RouterArgs}}.items():
    mod = types.ModuleType(name); mod.__path__ = []; mod.__dict__.update(attrs); sys.modules[name] = mod

# ---- Megatron-LM's parser, skipping megatron/training/__init__.py (GPU kernels)
import megatron  # noqa
pkg = types.ModuleType("megatron.training"); pkg.__path__ = [MEG + "/megatron/training"]
sys.modules["megatron.training"] = pkg
gv = importlib.import_module("megatron.training.global_vars")
for n in dir(gv):
    if n.startswith("get_"):
        setattr(pkg, n, getattr(gv, n))
from megatron.training.arguments import add_megatron_arguments
meg_parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
megatron_flags = long_flags(meg_parser)

# ---- slime: its provider applied on top of Megatron's parser, as megatron_parse_args(extra_args_provider=...) does
sys.modules["slime.backends.sglang_utils.external"] = types.SimpleNamespace(apply_external_engine_info_to_args=None)
sys.modules["slime.observability.logging_utils"] = types.SimpleNamespace(configure_logger=None)  # needs wandb
import slime.backends.sglang_utils.arguments as slime_sgl  # real slime code, stubbed SGLang underneath
from slime.utils.arguments import get_slime_extra_args_provider
p = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
get_slime_extra_args_provider()(p)
slime_flags = (long_flags(p) - megatron_flags) | literal_flags(SLIME + "/slime/utils/arguments.py", "_pre_parse_mode")
# reset_arg() on a flag Megatron already has (e.g. --wandb-project) keeps it Megatron's; slime still accepts it.
sp = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
slime_sgl.add_sglang_arguments(sp)
slime_sglang_flags = long_flags(sp)

sglang_server_flags = {n for names, _ in SGL_GROUPS for n in names}
conv_in = literal_flags(SLIME + "/../slime_tools/convert_hf_to_torch_dist.py", "add_convertion_args")
conv_out = literal_flags(SLIME + "/../slime_tools/convert_torch_dist_to_hf.py")

for title, flags in [("slime", slime_flags), ("megatron", megatron_flags), ("slime-sglang", slime_sglang_flags),
                     ("sglang-server", sglang_server_flags), ("convert_hf_to_torch_dist", conv_in),
                     ("convert_torch_dist_to_hf", conv_out)]:
    print(f"[{title}]  # {len(flags)} flags")
    print("\n".join(sorted(flags)))
