"""What a trainer says when it stopped before its last step (a callback's ``should_training_stop``, a
kill caught in-process): where the next run resumes, or that it starts over when no checkpoint was
written. Shared by every transformers trainer of rag_lab (the cold start's SFT, DAPO, APEX's planner)."""

from pathlib import Path

from rag_lab.errors import RagLabError


def stopped_early(what: str, step: int, total: int | None, work: Path) -> RagLabError:
    """The error for ``what`` stopped at ``step`` of ``total``: it names the checkpoint the next run resumes
    from, or says that none was written.

    >>> str(stopped_early("DAPO stage 1", 0, 30, Path("/nowhere")))
    'DAPO stage 1: stopped at step 0 of 30, before its first checkpoint: the next run starts it over'
    """
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(str(work)) if work.is_dir() else None
    where = f"{what}: stopped at step {step}" + (f" of {total}" if total else "")
    if last is None:
        return RagLabError(f"{where}, before its first checkpoint: the next run starts it over")
    return RagLabError(f"{where}; the next run resumes from {last}")
