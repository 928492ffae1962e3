"""FlashRAG-format datasets: ``{split}.jsonl`` rows ``{id, question, golden_answers, metadata}``
and a corpus jsonl of ``{id, contents}`` with the title on the first line of ``contents``.

This is the format of FlashRAG's NQ, TriviaQA, PopQA, Bamboogle … releases, and the format the
embedded world is written in. Gold supports and decompositions, where present, ride in
``metadata`` (``supporting_ids``, ``decomposition``, ``type``, ``hops``, ``answerable``).
"""

from functools import cached_property
from pathlib import Path

from rag_lab.data.base import Corpus, DataError, QAExample, SubQuestion, kept_questions
from rag_lab.data.jsonl import FieldError, read_jsonl, require, require_int, require_text


def parse_example(row: dict) -> QAExample:
    answers = require(row, "golden_answers", list)
    if not all(isinstance(a, str) for a in answers):
        raise FieldError("field 'golden_answers' should be a list of strings")
    meta = row.get("metadata") or {}
    if not isinstance(meta, dict):
        raise FieldError(f"field 'metadata' should be dict, got {type(meta).__name__}")
    steps = meta.get("decomposition") or []
    if not isinstance(steps, list) or not all(isinstance(d, dict) for d in steps):
        raise FieldError("field 'metadata.decomposition' should be a list of objects")
    try:
        decomposition = tuple(
            SubQuestion(require(d, "question", str), require(d, "answer", str), d.get("support_id"))
            for d in steps
        )
        hops = require_int(meta, "hops", max(1, len(decomposition)))
    except FieldError as e:
        raise FieldError(f"metadata: {e}") from None
    return QAExample(
        id=str(require(row, "id", (str, int))),
        question=require_text(row, "question"),
        answers=tuple(answers),
        type=meta.get("type", ""),
        hops=hops,
        answerable=bool(meta.get("answerable", True)),
        supporting_ids=tuple(meta.get("supporting_ids", ())),
        supporting_titles=tuple(meta.get("supporting_titles", ())),
        decomposition=decomposition,
        metadata={
            k: v for k, v in meta.items() if k not in {"decomposition", "supporting_ids", "supporting_titles"}
        },
    )


def load_corpus(path: Path, skip_malformed: bool = False) -> Corpus:
    """Read a FlashRAG corpus jsonl (``id``, ``contents`` = ``title\\ntext``) or a DPR tsv."""
    if path.suffix == ".tsv":
        return load_dpr_tsv(path, skip_malformed)
    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []

    def parse(row: dict) -> None:
        pid = str(require(row, "id", (str, int)))
        title, _, text = require(row, "contents", str).partition("\n")
        ids.append(pid)
        titles.append(title.strip().strip('"'))
        texts.append(text)

    for _ in read_jsonl(path, parse, skip_malformed):
        pass
    if not ids:
        raise DataError(f"{path}: the corpus has no passages (an empty file, or every line was skipped)")
    return Corpus(ids, titles, texts, source=str(path))


def load_dpr_tsv(path: Path, skip_malformed: bool = False) -> Corpus:
    """Read the DPR / wiki-18 tsv (header ``id  text  title``; 21M rows for psgs_w100.tsv)."""
    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []
    with open(path, encoding="utf-8", newline="") as f:
        header = f.readline().rstrip("\n").split("\t")
        if header[:3] != ["id", "text", "title"]:
            raise DataError(f"{path}:1: expected the DPR header 'id<TAB>text<TAB>title', got {header[:3]}")
        for lineno, line in enumerate(f, start=2):
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 3 or not fields[0]:
                if skip_malformed:
                    continue
                raise DataError(
                    f"{path}:{lineno}: expected 3 tab-separated fields (id, text, title), got {len(fields)}"
                )
            ids.append(fields[0])
            texts.append(fields[1].strip('"'))
            titles.append(fields[2].strip('"'))
    return Corpus(ids, titles, texts, source=str(path))


def missing_file(path: Path, what: str, source: str, make_target: str) -> DataError:
    return DataError(f"{what} not found at {path}; get it from {source} (or run `make {make_target}`)")


class FlashRAGDataset:
    """Any FlashRAG-format dataset by path: ``{path}/{split}.jsonl`` plus a corpus jsonl."""

    scorer = "squad"

    def __init__(
        self,
        path: str,
        corpus_path: str,
        name: str = "flashrag",
        # skip a malformed line (counted in the run's log) instead of failing on it
        skip_malformed: bool = False,
        # where the files come from, and the `make` target that downloads them (both named in the error
        # when a file is missing)
        source: str = "https://huggingface.co/datasets/RUC-NLPIR/FlashRAG_datasets",
        make_target: str = "data-flashrag",
    ):
        self.name = name
        self.path = Path(path)
        self.corpus_path = Path(corpus_path)
        self.skip_malformed = skip_malformed
        self.source = source
        self.make_target = make_target
        # Per split: malformed lines skipped, and repeated question ids dropped (data.skip_malformed=true).
        self.skipped: dict[str, int] = {}
        self.duplicates: dict[str, int] = {}

    def splits(self) -> list[str]:
        """The splits present on disk (``{split}.jsonl`` files under ``path``)."""
        if self.path.is_file():
            return []
        return sorted(p.stem for p in self.path.glob("*.jsonl") if p != self.corpus_path)

    def split(self, name: str) -> list[QAExample]:
        path = self.path if self.path.is_file() else self.path / f"{name}.jsonl"
        if not path.exists():
            if self.splits():  # the dataset is there, the split name is not
                raise DataError(f"{self.name} has no split '{name}' (has: {', '.join(self.splits())})")
            raise missing_file(path, f"{self.name} split '{name}'", self.source, self.make_target)
        counter: dict[str, int] = {}
        examples = list(read_jsonl(path, parse_example, self.skip_malformed, counter))
        kept = kept_questions([ex.id for ex in examples], str(path), self.skip_malformed)
        self.duplicates[name] = len(examples) - len(kept)
        examples = [examples[i] for i in kept]
        self.skipped[name] = counter.get("skipped", 0)
        return examples

    @cached_property
    def corpus(self) -> Corpus:
        if not self.corpus_path.exists():
            raise missing_file(self.corpus_path, f"{self.name} corpus", self.source, self.make_target)
        return load_corpus(self.corpus_path, self.skip_malformed)
