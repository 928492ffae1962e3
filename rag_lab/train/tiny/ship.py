"""``make tiny-lm``: train ``generator=tiny``'s recipe (:func:`rag_lab.train.tiny.recipe.train`) on the
embedded world and ship the checkpoint that ``generator=tiny`` loads (``rag_lab/checkpoints/tiny_lm``):
the model, its tokenizer, ``recipe.json`` (the settings and the world's fingerprint) and a model card.

``python -m rag_lab.train.tiny.ship [overrides] [--out DIR] [--scores report.md]``. A command (nothing in
the package imports it): it imports :mod:`rag_lab.policies`, whose demonstration policies the recipe's
teacher demonstrations roll out (:mod:`rag_lab.train.demonstrators`).
"""

import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

import rag_lab.policies  # noqa: F401  (registers the demonstration policies)
from rag_lab.train.tiny.generator import (
    SHIPPED,
    before,
    file_digests,
    recipe_part,
    recipe_settings,
    world_fingerprint,
)
from rag_lab.train.tiny.recipe import train

log = logging.getLogger(__name__)


# What the model card copies from the trained model's directory (the rest of it is training scratch).
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "train.json", "tokenizer")


def ship(
    overrides: Sequence[str] = (),
    out: Path | None = None,
    scores: Path | None = None,
    from_scratch: bool = False,
    model: Path | None = None,
) -> Path:
    """``make tiny-lm``: train ``generator=tiny``'s recipe on the embedded world (``data=synth``; both
    with ``overrides``) and write the checkpoint that ``generator=tiny`` loads: the model, its tokenizer,
    ``recipe.json`` (the settings and the world's fingerprint) and a model card (``README.md``: recipe,
    hardware, time, and the table of ``scores``, a report.md, when given). The previous checkpoint is
    replaced only once the new one is complete. A recipe with a chain stage starts it from the shipped
    checkpoint of its earlier stages when there is one, and so does a generalist stage (``from_scratch``:
    every stage trains). ``model``:
    a directory this recipe trained already (a recipe run's cache entry) to ship as it is."""
    import subprocess

    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from rag_lab.core.config import compose

    out = Path(out or SHIPPED)
    cfg = compose(["data=synth", "generator=tiny", *overrides])
    generator = OmegaConf.to_container(cfg.generator, resolve=True)
    settings = recipe_settings(recipe_part(generator))
    data = instantiate(cfg.data)
    start = {} if from_scratch else before(data, settings)
    path = Path(model) if model is not None else train(data, cfg.cache_dir, **start, **settings)
    stats = json.loads((path / "train.json").read_text())
    seconds = stats.get("total_wall_s", stats["wall_s"])
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    )
    card = {
        "recipe": settings,
        "world": world_fingerprint(data),
        "data": OmegaConf.to_container(cfg.data, resolve=True),
        "trained": path.name,
        "train_time": f"{seconds / 60:.0f} min",
        "hardware": _hardware(stats.get("device", "cpu"), stats.get("versions", {}).get("torch")),
        "commit": commit.stdout.strip() or None,
    }
    card |= {stage: folder.name for stage, folder in start.items()}
    tmp = out.with_name(f".{out.name}.new")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in SHIPPED_FILES:
        source = path / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, tmp / name)
    card["files"] = file_digests(tmp)
    (tmp / "recipe.json").write_text(json.dumps(card, indent=1, sort_keys=True) + "\n")
    (tmp / "README.md").write_text(model_card(card, stats, scores.read_text() if scores else None))
    old = out.with_name(f".{out.name}.old")
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    log.info("shipped %s (trained in %s) to %s", path.name, card["train_time"], out)
    return out


def _hardware(device: str, torch_version: str | None) -> str:
    """The card's hardware line: the GPU the last stage trained on (train.json's ``device``), else the
    CPU and its threads; with the torch version it trained with (train.json's, else this one)."""
    import platform

    import torch

    cpu = f"{_cpu_name() or platform.machine()}, {torch.get_num_threads()} threads"
    where = device if device != "cpu" else cpu
    return f"{where}, torch {torch_version or torch.__version__}"


def _cpu_name() -> str | None:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


def model_card(card: dict, stats: dict, scores: str | None) -> str:
    """The shipped checkpoint's README: what it is, its recipe, where and how long it trained, scores."""
    settings = "\n".join(f"| `{k}` | `{json.dumps(v)}` |" for k, v in card["recipe"].items())
    parameters = stats.get("parameters")
    last = f"; {stats.get('wall_s', 0) / 60:.0f} min of the total"  # the last stage's own time
    general = card["recipe"].get("generalist_steps")
    chain = ""
    if card["recipe"].get("chain_steps"):
        chain = (
            ", then a chain stage (the teacher's chain-of-thought over gold passages beside reading layouts"
            " and the method loops' demonstrations"
            + (f", trained from the shipped `{card['before_chain']}`" if card.get("before_chain") else "")
            + ("" if general else last)
            + ")"
        )
    generalist = ""
    if general:
        generalist = (
            ". Last, a generalist stage: the same mix with every protocol's demonstrations the generalist's"
            " (`generator=generalist`: the world teacher's reading, but searching with the question, a fixed"
            " number of times, and planning with the question whole or split at its surface: what a general"
            " instruct model knows without the answer key), so that the methods start with room to learn"
            + (
                f"; trained from the shipped `{card['before_generalist']}`"
                if card.get("before_generalist")
                else ""
            )
            + last
        )
    start = card.get("before_generalist") or card.get("before_chain")
    trained = (
        f"Its last stage trained on: {card['hardware']}, in {stats.get('wall_s', 0) / 60:.0f} min (commit "
        f"{card['commit']}), from the shipped `{start}` (its card gives the stages before)."
        if start
        else f"Trained on: {card['hardware']}, in {card['train_time']} (commit {card['commit']})."
    )
    return f"""# The tiny LM (`generator=tiny`)

A Qwen2-style causal LM of {parameters:,} parameters, vocabulary {stats.get("vocab_size")}, trained from
scratch by `rag_lab.train.tiny.recipe.train` on the embedded world (`data=synth`, world fingerprint
`{card["world"]}`): a reading stage over renamed pages, SFT on the world teacher's demonstrations of every
protocol, then a protocol stage{chain}{generalist}. `make tiny-lm` reproduces it;
`experiments/results/tiny_lm.md` says how the recipe was found.

- {trained}
- Loaded by `generator=tiny` when the run's world and settings match `recipe.json`; otherwise the
  recipe trains a model for the run (cached) and the log says which fingerprint differs.

## Scores

{scores.strip() if scores else "(not measured)"}

## Recipe

| setting | value |
|---|---|
{settings}
"""


def main(argv: Sequence[str] | None = None) -> None:
    import argparse
    import sys

    from rag_lab.core.errors import one_line_errors

    parser = argparse.ArgumentParser(
        prog="python -m rag_lab.train.tiny.ship",
        description="Train generator=tiny's recipe on the embedded world and ship the checkpoint "
        "(rag_lab/checkpoints/tiny_lm).",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. generator.reading_steps=3000")
    parser.add_argument("--out", type=Path, default=None, help="where to write it (default: the shipped one)")
    parser.add_argument("--scores", type=Path, default=None, help="a report.md whose table goes on the card")
    parser.add_argument(
        "--from-scratch",
        action="store_true",
        help="train every stage (not the chain stage alone from the shipped one)",
    )
    parser.add_argument(
        "--model", type=Path, default=None, help="ship this trained model dir (the recipe's) as it is"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with one_line_errors():
        print(ship(args.overrides, args.out, args.scores, args.from_scratch, args.model))


if __name__ == "__main__":
    main()
