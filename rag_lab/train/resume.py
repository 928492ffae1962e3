"""Resuming a training after a kill, as every trainer of rag_lab does it (the cold start's SFT, DAPO's
stages, APEX's planner, Stop-RAG's Q-network, EVO-RAG's cycles): which checkpoint to resume from, which
model a finished stage left, and what to say when a training stopped early.

A checkpoint is written atomically by its trainer, but a disk that fills up or a copy cut short can still
leave a truncated file. :func:`last_good_checkpoint` skips those (it reads every weight and state file
of a Trainer checkpoint, newest first) and says which it skipped; :func:`load_torch` reads a ``torch.save``
file, or returns None naming the damaged file, so the caller trains from its last good state (or from the
start). A damaged *finished* model in a cache is never retrained silently: :func:`readable` names it and
the directory to remove.
"""

import json
import logging
import re
import zipfile
from pathlib import Path
from typing import Any

from rag_lab.core.errors import RagLabError

log = logging.getLogger(__name__)


def damage(path: Path) -> str | None:
    """Why the weights or state file ``path`` cannot be read (None: it can). Cheap, without reading the
    tensors: a safetensors file's header must describe exactly the bytes that follow it, a ``torch.save``
    file (a zip) must end with its central directory, a json must parse. A cut-short file fails all three."""
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                list(f.keys())
        elif path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix in (".pt", ".pth", ".bin"):
            with zipfile.ZipFile(path) as z:
                z.infolist()
    except Exception as e:  # noqa: BLE001 - any failure to read it is the damage we report
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'unreadable'}"
    return None


# the file a checkpoint's writer writes last: transformers' Trainer writes a checkpoint's folder in place, its
# trainer state after the weights, optimizer and random states (a process killed before it leaves the rest
# half-written: found by a 2-process EVO-RAG run killed during its third save); R3-RAG's PPO renames a whole
# folder holding state.json into place
WRITTEN_LAST = ("trainer_state.json", "state.json")


def last_good_checkpoint(work: Path) -> str | None:
    """The newest ``checkpoint-N`` under ``work`` whose files all read and whose writer finished it (its
    :data:`WRITTEN_LAST` file is there), skipping (and naming) damaged and incomplete ones."""
    if not work.is_dir():
        return None
    found = [(re.fullmatch(r"checkpoint-(\d+)", p.name), p) for p in work.iterdir()]
    for _, checkpoint in sorted(((int(m.group(1)), p) for m, p in found if m), reverse=True):
        files = [p for p in sorted(checkpoint.iterdir()) if p.is_file()]
        problems = [(p, why) for p in files if (why := damage(p))]
        if not problems and files and any((checkpoint / name).is_file() for name in WRITTEN_LAST):
            return str(checkpoint)
        where, why = problems[0] if problems else (checkpoint, "empty" if not files else "incomplete")
        log.warning("resume: %s is damaged (%s): skipping %s", where, why, checkpoint.name)
    return None


def load_torch(path: Path, map_location: Any = None) -> Any | None:
    """``torch.load(path, weights_only=True)``: tensors and plain data (dicts, lists, numbers, strings) only,
    never an unpickled object (a shared cache or a downloaded run dir would run its writer's code). None
    (with a warning naming the file) when it is missing or damaged; a RagLabError naming it when it holds
    anything else (an old checkpoint, or not ours)."""
    import pickle

    import torch

    if not path.exists():
        return None
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        if str(e).startswith("Weights only load failed"):
            raise RagLabError(
                f"{path}: holds pickled Python objects, not only tensors and plain data: refused (loading it "
                "could run code); remove it to train it again"
            ) from None
        log.warning("%s is damaged (%s: %s): not resuming from it", path, type(e).__name__, e)
        return None
    except Exception as e:  # noqa: BLE001 - a truncated file raises any of several errors
        log.warning("%s is damaged (%s: %s): not resuming from it", path, type(e).__name__, e)
        return None


def readable(model_dir: Path, what: str) -> Path:
    """``model_dir`` when its weights read; else a RagLabError naming the damaged file and what to remove."""
    for path in sorted(model_dir.glob("*.safetensors")):
        if why := damage(path):
            raise RagLabError(f"{what}: {path} is damaged ({why}): remove {model_dir} to train it again")
    return model_dir


def stopped_early(what: str, step: int, total: int | None, work: Path) -> RagLabError:
    """The error for ``what`` stopped at ``step`` of ``total``: it names the checkpoint the next run resumes
    from, or says that none was written.

    >>> str(stopped_early("DAPO stage 1", 0, 30, Path("/nowhere")))
    'DAPO stage 1: stopped at step 0 of 30, before its first checkpoint: the next run starts it over'
    """
    last = last_good_checkpoint(work)
    where = f"{what}: stopped at step {step}" + (f" of {total}" if total else "")
    if last is None:
        return RagLabError(f"{where}, before its first checkpoint: the next run starts it over")
    return RagLabError(f"{where}; the next run resumes from {last}")


def load_model(path: Path | str, like):
    """The causal LM saved at ``path`` (a finished stage or cycle), in eval mode, on the device and in the
    dtype of the model ``like`` (bf16 where the run trains in bf16: no float32 copy beside it); whole in
    every process of a sharded launch (:func:`rag_lab.core.loading.replicated_loading`: a trainer that
    trains it shards it when it prepares it)."""
    from transformers import AutoModelForCausalLM

    from rag_lab.core.loading import replicated_loading

    first = next(like.parameters())
    with replicated_loading():
        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=first.dtype)
    return loaded.to(first.device).eval()
