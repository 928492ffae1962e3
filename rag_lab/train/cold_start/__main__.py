"""``python -m rag_lab.train.cold_start``: the cold start's command line (:data:`HELP`; the cold start itself:
:mod:`rag_lab.train.cold_start`). A command: it imports :mod:`rag_lab.policies`, whose demonstration policies
the teacher's demonstrations roll out (:mod:`rag_lab.train.demonstrators`)."""

import json
import logging
import sys

from hydra.utils import instantiate

import rag_lab.policies  # noqa: F401  (registers the demonstration policies)
from rag_lab.core.cli import cli_overrides
from rag_lab.core.config import build, compose
from rag_lab.core.errors import RagLabError, one_line_errors
from rag_lab.train.cold_start import cold_start, ship

log = logging.getLogger("rag_lab.train.cold_start")

HELP = """python -m rag_lab.train.cold_start: fine-tune the generator's model (generator=tiny, smollm2, or hf
generator.model=<dir>) on the world teacher's rejection-sampled demonstrations (data=synth), cached under
cache_dir/cold_start/; print the result's directory (load it with generator=hf generator.model=<dir>).

Examples:
  python -m rag_lab.train.cold_start generator=tiny cold_start.protocols=[dapo]
  python -m rag_lab.train.cold_start generator=smollm2 cold_start.protocols=[apex_exec] cold_start.lora.r=16

The options below are set as cold_start.<key>=<value>; any key of the run config too (data.*, cache_dir,
seed). The defaults go to the whole training split: about 100 s of teacher rollouts on 2 cores, cached.
--ship: also copy the result into rag_lab/checkpoints/cold_start/ (what `make demo` ships)."""


def main(argv: list[str] | None = None) -> None:
    """The command line (:data:`HELP`)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with one_line_errors():
        args = list(sys.argv[1:] if argv is None else argv)
        to_ship = "--ship" in args
        args = [a for a in args if a != "--ship"]
        overrides = cli_overrides(args, HELP, "cold_start/default")
        picked = any(o.lstrip("+").startswith("cold_start=") for o in overrides)
        overrides = [f"+{o}" if o.startswith("cold_start=") else o for o in overrides]
        cfg = compose(([] if picked else ["+cold_start=default"]) + overrides)
        if not cfg.generator:
            raise RagLabError(
                "cold start: set generator=<the base LM> (tiny, smollm2, hf generator.model=...)"
            )
        data = instantiate(cfg.data)
        base = build(cfg.generator, data=data)
        if not hasattr(base, "model") or not hasattr(base, "tokenizer"):
            raise RagLabError(f"cold start: generator {cfg.generator._target_} is not a transformers model")
        out = cold_start(
            base.model.name_or_path,
            data,
            instantiate(cfg.cold_start),
            cfg.cache_dir,
            tokenizer=base.tokenizer.name_or_path,
            chat=base.chat,
        )
        if to_ship:
            log.info("shipped: %s", ship(out))
    tokenizer = json.loads((out / "train.json").read_text())["tokenizer"]
    hint = f" generator.tokenizer={out / tokenizer}" if tokenizer != "." else ""
    log.info("load it with: generator=hf generator.model=%s%s", out, hint)
    print(out)


if __name__ == "__main__":
    main()
