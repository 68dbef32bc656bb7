"""TEMPORARY local stand-in (not committed)."""
import dataclasses

@dataclasses.dataclass
class ServerArgs:
    model_path: str = ""

    @staticmethod
    def add_cli_args(parser) -> None:
        parser.add_argument("--pp-size", type=int, default=1)
        parser.add_argument("--pipeline-parallel-size", type=int, default=1)
        parser.add_argument("--dp-size", type=int, default=1)
        parser.add_argument("--enable-dp-attention", action="store_true")
        parser.add_argument("--enable-deterministic-inference", action="store_true")
        parser.add_argument("--mem-fraction-static", type=float, default=None)
