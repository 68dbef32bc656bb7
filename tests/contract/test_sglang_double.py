"""The SGLang double's server arguments: SGLang 0.5.15.post1's own, and slime's wrapper applied to them as in slime."""

from __future__ import annotations

import argparse
import json

from sglang.srt import server_args as double

SLIME_SKIPS = {"--model-path", "--config", "--trust-remote-code", "--random-seed", "--enable-memory-saver",
               "--tp-size", "--port", "--nnodes", "--node-rank", "--dist-init-addr", "--gpu-id-step", "--base-gpu-id",
               "--nccl-port", "--skip-server-warmup", "--enable-return-routed-experts"}


def server_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    double.ServerArgs.add_cli_args(parser)
    return parser


def test_the_data_names_its_source() -> None:
    record = json.loads(double.DATA.read_text())
    assert record["sglang"] == "0.5.15.post1" and len(record["wheel_sha256"]) == 64
    assert record["made_by"].startswith("tests/contract/sglang_double/extract_server_args.py sglang-0.5.15.post1-")
    flags = [f for argument in record["arguments"] for f in argument["flags"]]
    assert len(flags) == len(set(flags)) > 400


def test_sglang_arguments_keep_their_definitions() -> None:
    parser = server_parser()
    args = parser.parse_args(["--model-path", "m", "--tensor-parallel-size", "2", "--mem-fraction-static", "0.5",
                              "--tool-call-parser", "qwen25", "--enable-metrics", "--max-total-tokens", "4k"])
    assert (args.tp_size, args.mem_fraction_static, args.tool_call_parser, args.enable_metrics) == (2, 0.5, "qwen25", True)
    assert args.dp_size == 1 and args.host == "127.0.0.1" and args.port == 30000  # SGLang's defaults
    assert isinstance(args.max_total_tokens, int)
    # a deprecated alias stores into its new dest, as SGLang's DeprecatedStoreTrueAction does
    assert parser.parse_args(["--model-path", "m", "--stream-output"]).incremental_streaming_output is True
    for bad in (["--tool-call-parser", "nope"], ["--tp-size", "two"], []):  # choices, types, the required model
        try:
            parser.parse_args(bad if bad == [] else ["--model-path", "m", *bad])
        except SystemExit:
            continue
        raise AssertionError(f"accepted {bad}")


def test_the_dataclass_holds_a_field_per_argument() -> None:
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(double.ServerArgs)}
    assert fields["tp_size"].default == 1 and fields["host"].default == "127.0.0.1"
    assert double.ServerArgs(model_path="m").model_path == "m"


def test_slimes_wrapper_prefixes_and_skips_as_in_slime() -> None:
    from slime.backends.sglang_utils.arguments import add_sglang_arguments

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_sglang_arguments(parser)
    wrapped = {o for a in parser._actions for o in a.option_strings}
    sglang = {f for flags, _ in double.cli_arguments() for f in flags}
    # slime skips SGLang's --config and adds a --sglang-config of its own (a deployment YAML)
    assert {"--sglang-" + f[2:] for f in SLIME_SKIPS} & wrapped == {"--sglang-config"}
    skipped = {f for flags, _ in double.cli_arguments() if flags[0] in SLIME_SKIPS for f in flags}  # with aliases
    assert {"--model", "--tensor-parallel-size"} <= skipped
    assert {f for f in sglang if "--sglang-" + f[2:] not in wrapped} == skipped - {"--config"}
    args, rest = parser.parse_known_args(["--sglang-mem-fraction-static", "0.7", "--sglang-dp-size", "2", "--x"])
    assert (args.sglang_mem_fraction_static, args.sglang_dp_size, rest) == (0.7, 2, ["--x"])
