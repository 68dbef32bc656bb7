"""sglang.srt.server_args.ServerArgs of SGLang 0.5.15.post1: the dataclass slime reads and its CLI arguments."""

import dataclasses


@dataclasses.dataclass
class ServerArgs:
    model_path: str = ""

    @staticmethod
    def add_cli_args(parser) -> None:
        """SGLang's server flags (slime prefixes them with --sglang-)."""
