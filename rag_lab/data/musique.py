"""MuSiQue (``musique_ans_v1.0_*.jsonl`` and ``musique_full_v1.0_*.jsonl``).

Rows: ``id, question, answer, answer_aliases, answerable, paragraphs[{idx, title,
paragraph_text, is_supporting}], question_decomposition[{id, question, answer,
paragraph_support_idx}]``. Decomposition questions reference earlier answers as ``#1``, ``#2``.
The official test split has no answers, so ``test`` reads the dev file by default (as Stop-RAG).
"""

from collections.abc import Iterable
from pathlib import Path

from rag_lab.data.base import QAExample, SubQuestion
from rag_lab.data.contexts import Context, ContextDataset
from rag_lab.data.jsonl import FieldError, read_jsonl, require, require_text

SPLITS = {
    "train": "musique_ans_v1.0_train.jsonl",
    "dev": "musique_ans_v1.0_dev.jsonl",
    "test": "musique_ans_v1.0_dev.jsonl",
}


def parse_row(row: dict) -> tuple[QAExample, list[Context]]:
    paragraphs = require(row, "paragraphs", list)
    contexts, by_idx = [], {}
    for p in paragraphs:
        if not isinstance(p, dict):
            raise FieldError("field 'paragraphs' should hold objects")
        c = Context(require(p, "title", str), require(p, "paragraph_text", str), bool(p.get("is_supporting")))
        contexts.append(c)
        by_idx[p.get("idx", len(by_idx))] = c
    decomposition = []
    for step in require(row, "question_decomposition", list):
        if not isinstance(step, dict):
            raise FieldError("field 'question_decomposition' should hold objects")
        support = by_idx.get(step.get("paragraph_support_idx"))
        decomposition.append(
            SubQuestion(
                require(step, "question", str), require(step, "answer", str), support.id if support else None
            )
        )
    aliases = require(row, "answer_aliases", list) if "answer_aliases" in row else []
    example = QAExample(
        id=str(require(row, "id", str)),
        question=require_text(row, "question"),
        answers=(require(row, "answer", str), *aliases),
        # real rows encode the type in the id (2hop__…, 3hop1__…); the generated world writes it out
        type=row.get("type") or str(row["id"]).split("__")[0],
        hops=max(1, len(decomposition)),
        answerable=bool(row.get("answerable", True)),
        decomposition=tuple(decomposition),
    )
    return example, contexts


class MuSiQueDataset(ContextDataset):
    scorer = "musique"
    source = "https://github.com/StonyBrookNLP/musique (download_data.sh)"
    make_target = "data-musique"

    def __init__(
        self,
        path: str,
        split_files: dict[str, str] | None = None,
        name: str = "musique",
        skip_malformed: bool = False,
        sample: dict[str, int] | None = None,
        sample_seed: int = 0,
    ):
        super().__init__(path, split_files or SPLITS, name, skip_malformed, sample, sample_seed)

    def read(self, path: Path) -> Iterable[tuple[QAExample, list[Context]]]:
        counter: dict[str, int] = {}
        yield from read_jsonl(path, parse_row, self.skip_malformed, counter)
        self.skipped[path.name] = counter.get("skipped", 0)
