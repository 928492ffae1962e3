"""HotpotQA and 2WikiMultihopQA: whole-file JSON lists with ``context`` and ``supporting_facts``.

Both the official layout (``context = [[title, [sentence, ...]], ...]``, ``supporting_facts =
[[title, sent_id], ...]``, id in ``_id``) and the Hugging Face layout (``context = {title: [...],
sentences: [[...]]}``, ``supporting_facts = {title: [...], sent_id: [...]}``, id in ``id``) are
read; a file may also be jsonl. A passage is one context paragraph (its sentences joined as the
dataset stores them); gold supports are the paragraphs named in ``supporting_facts``.
2Wiki adds ``evidences`` (kept in metadata) and, with ``id_aliases.json`` beside the split files,
the answer's aliases and demonyms, exactly as its official v1.1 scorer builds its gold set.
"""

from collections.abc import Iterable
from pathlib import Path

from rag_lab.data.base import QAExample
from rag_lab.data.contexts import Context, ContextDataset
from rag_lab.data.jsonl import FieldError, read_json_list, read_jsonl, require, require_text


def _pairs(value: object, keys: tuple[str, str], field: str) -> list[tuple]:
    """[[a, b], ...] (official) or {keys[0]: [...], keys[1]: [...]} (Hugging Face) -> [(a, b), ...]."""
    if isinstance(value, dict):
        if not all(k in value for k in keys):
            raise FieldError(f"field '{field}' should have keys {', '.join(keys)}")
        if not isinstance(value[keys[0]], list) or len(value[keys[0]]) != len(value[keys[1]] or ()):
            raise FieldError(f"field '{field}' should have lists of equal length under {', '.join(keys)}")
        return list(zip(value[keys[0]], value[keys[1]], strict=True))
    if isinstance(value, list) and all(isinstance(p, list | tuple) and len(p) == 2 for p in value):
        return [tuple(p) for p in value]
    raise FieldError(f"field '{field}' should be a list of [{keys[0]}, {keys[1]}] pairs")


def parse_row(row: dict, aliases: dict[str, list[str]] | None = None) -> tuple[QAExample, list[Context]]:
    qid = row.get("_id", row.get("id"))
    if not isinstance(qid, str):
        raise FieldError("missing field '_id' (or 'id')")
    facts = _pairs(require(row, "supporting_facts", (list, dict)), ("title", "sent_id"), "supporting_facts")
    support_titles = {title for title, _ in facts}
    contexts = []
    for title, sentences in _pairs(require(row, "context", (list, dict)), ("title", "sentences"), "context"):
        if not isinstance(sentences, list) or not all(isinstance(x, str) for x in sentences):
            raise FieldError(f"field 'context' should hold sentence lists (title {title!r})")
        contexts.append(Context(title, "".join(sentences), title in support_titles))
    if not all(isinstance(sent, int) and not isinstance(sent, bool) for _, sent in facts):
        raise FieldError("field 'supporting_facts' should pair each title with a sentence index (int)")
    answer = require(row, "answer", str)
    extra = (aliases or {}).get(row.get("answer_id", ""), [])
    metadata = {"level": row.get("level")}
    if "evidences" in row:
        metadata["evidences"] = row["evidences"]
    example = QAExample(
        id=qid,
        question=require_text(row, "question"),
        answers=(answer, *sorted(set(extra) - {answer})),
        type=row.get("type", ""),
        hops=max(1, len(support_titles)),
        supporting_facts=tuple((str(title), int(sent)) for title, sent in facts),
        metadata=metadata,
    )
    return example, contexts


class HotpotQADataset(ContextDataset):
    scorer = "hotpotqa"
    source = "https://hotpotqa.github.io (hotpot_train_v1.1.json, hotpot_dev_distractor_v1.json)"
    make_target = "data-hotpotqa"

    def __init__(
        self,
        path: str,
        split_files: dict[str, str],
        name: str = "hotpotqa",
        skip_malformed: bool = False,
        sample: dict[str, int] | None = None,
        sample_seed: int = 0,
    ):
        super().__init__(path, split_files, name, skip_malformed, sample, sample_seed)

    def aliases(self) -> dict[str, list[str]]:
        return {}

    def read(self, path: Path) -> Iterable[tuple[QAExample, list[Context]]]:
        aliases = self.aliases()
        counter: dict[str, int] = {}
        reader = read_jsonl if path.suffix == ".jsonl" else read_json_list
        yield from reader(path, lambda row: parse_row(row, aliases), self.skip_malformed, counter)
        self.skipped[path.name] = counter.get("skipped", 0)


class TwoWikiDataset(HotpotQADataset):
    scorer = "2wiki"
    source = "https://github.com/Alab-NII/2wikimultihop (data_ids_april7.zip)"
    make_target = "data-2wiki"

    def __init__(
        self,
        path: str,
        split_files: dict[str, str],
        name: str = "2wiki",
        alias_file: str = "id_aliases.json",
        skip_malformed: bool = False,
        sample: dict[str, int] | None = None,
        sample_seed: int = 0,
    ):
        super().__init__(path, split_files, name, skip_malformed, sample, sample_seed)
        self.alias_file = self.path / alias_file

    def aliases(self) -> dict[str, list[str]]:
        """Q_id -> aliases + demonyms (jsonl), as the official v1.1 scorer reads them; {} if absent."""
        if not self.alias_file.exists():
            return {}
        out = {}
        for row in read_jsonl(self.alias_file, lambda r: r):
            out[require(row, "Q_id", str)] = list(row.get("aliases", [])) + list(row.get("demonyms", []))
        return out
