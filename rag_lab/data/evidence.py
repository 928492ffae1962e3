"""Evidence as a controlled variable: what the index holds of a dataset's corpus (``corpus.coverage``,
``corpus.distractors``; issue 74, docs/how-to/evidence.md).

Two studies found that the corpus decides much of what search-agent papers report: SearchAgentReview
(arXiv 2605.27881) measured EM moving 2-6 points per method when the missing gold documents of Wiki-18 were
restored, more than the gap between the algorithms it compared. A real corpus's gaps can only be estimated;
the generated world knows every question's gold pages, so here they are set:

- ``coverage`` (0, 1]: the share of gold pages kept in the index. A page is kept when a hash of
  (``corpus.seed``, its id) falls below ``coverage``, so the pages kept at 0.6 are a subset of those kept at
  0.8 (the levels are nested) and the choice does not depend on the run's seed. The gold pages are, for
  ``data=synth``, every page of the world (each is an entity's page, the evidence of the questions about
  that entity); for another dataset, the pages its questions' ``supporting_ids`` name in the train, dev and
  test splits (the other pages are kept).
- ``distractors`` ≥ 0 (``data=synth`` only): for every page of the world, that many near-duplicates: the
  same title (the same entity) and the same sentences, with every fact's value replaced by another of its
  kind (another city, person, date ...), so a reader that takes a distractor answers wrongly. Distractors
  are added for every page, kept or not, so the two knobs are independent: at coverage 0.6 a question may
  find only conflicting pages about the entity it needs.

Only the index changes: the dataset, its questions, its world and the default LM stay the same (their
fingerprints do not read these settings), and the cold starts' demonstrations search the whole corpus. The
index's corpus has its own fingerprint, so each setting has its own cached index and its own cached
training (the methods key them by ``env.corpus.fingerprint``). Hand-written: no library edits a QA corpus's
gold evidence.
"""

import hashlib
import random
import re
from dataclasses import dataclass

from rag_lab.core.errors import RagLabError
from rag_lab.data.base import Corpus, QAExample
from rag_lab.data.contexts import passage_id

# the splits whose gold pages a dataset other than synth has dropped (never the claims' judge split: its
# files exist only inside a judgement)
GOLD_SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class Evidence:
    """``corpus:`` of the run config (rag_lab/core/config.py: CorpusConfig)."""

    coverage: float = 1.0
    distractors: int = 0
    seed: int = 0

    @property
    def whole(self) -> bool:
        """The dataset's corpus as it is (the default)."""
        return self.coverage >= 1.0 and self.distractors == 0


def index_corpus(data, evidence: Evidence) -> Corpus:
    """The corpus the run's retriever indexes and its env reads: ``data.corpus`` itself under the default,
    else its kept pages (their order kept), then the distractors."""
    corpus = data.corpus
    if evidence.whole:
        return corpus
    if evidence.distractors and not hasattr(data, "params"):
        raise RagLabError(
            f"corpus.distractors: {evidence.distractors} needs data=synth (a distractor restates a page of "
            f"the generated world with conflicting facts); data={getattr(data, 'name', '?')} has no world"
        )
    gold = None if hasattr(data, "params") else gold_pages(data)
    rows = [
        i
        for i, pid in enumerate(corpus.ids)
        if (gold is not None and pid not in gold) or kept(pid, evidence.coverage, evidence.seed)
    ]
    ids = [corpus.ids[i] for i in rows]
    titles = [corpus.titles[i] for i in rows]
    texts = [corpus.texts[i] for i in rows]
    if evidence.distractors:
        for pid, title, text in distractors(data, evidence.distractors, evidence.seed):
            ids.append(pid)
            titles.append(title)
            texts.append(text)
    knobs = f"corpus.coverage={evidence.coverage:g}, corpus.distractors={evidence.distractors}"
    source = f"{corpus.source} ({knobs})"
    return Corpus(ids, titles, texts, source=source)


def kept(pid: str, coverage: float, seed: int) -> bool:
    """Whether page ``pid`` is in the index at ``coverage``: a uniform hash of (seed, id) below it.

    >>> kept("a", 1.0, 0), kept("a", 1e-9, 0)
    (True, False)
    """
    digest = hashlib.blake2b(f"{seed}\x00{pid}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < coverage


def gold_pages(data) -> set[str]:
    """The pages the questions of ``data``'s train, dev and test splits name as their support."""
    splits = getattr(data, "splits", lambda: GOLD_SPLITS)()
    questions = [ex for name in GOLD_SPLITS if name in splits for ex in data.split(name)]
    return {pid for ex in questions for pid in ex.supporting_ids}


def reachable(ex: QAExample, corpus: Corpus) -> bool | None:
    """Whether ``ex``'s gold evidence can be found in ``corpus``: answerable, and every supporting page
    there (None where the dataset names no supporting page)."""
    if not ex.answerable:
        return False
    if not ex.supporting_ids:
        return None
    return all(pid in corpus for pid in ex.supporting_ids)


def distractors(data, n: int, seed: int) -> list[tuple[str, str, str]]:
    """``n`` near-duplicates of every page of the synth world, as (id, title, text): the page's sentences
    with each fact's value replaced by another value of the same kind, drawn by a stream of (seed, page)."""
    from rag_lab.data.synth.world import RELATIONS, build_world

    p = data.params
    world = build_world(random.Random(p["seed"]), p["sizes"], p["withhold_rate"])
    if set(world.passages) != set(data.corpus.ids):
        raise RagLabError(f"corpus.distractors: the world rebuilt from {data.root} differs from its corpus")
    values: dict[tuple[str, str], list[str]] = {}
    for e in world.entities.values():
        for rel, value in e.facts.items():
            values.setdefault((e.kind, rel), []).append(value)
    pools = {key: sorted(set(vs)) for key, vs in values.items()}
    kinds = {e.kind for e in world.entities.values()}
    names = {kind: sorted(e.name for e in world.of_kind(kind)) for kind in kinds}
    out = []
    for pid, (title, text) in world.passages.items():
        entity = world.entities[title]
        for j in range(n):
            rng = random.Random(f"distractor:{seed}:{pid}:{j}")
            swap = {}
            for rel, value in entity.facts.items():
                target = RELATIONS[rel].target
                pool = names[target] if target else pools[(entity.kind, rel)]
                others = [v for v in pool if v != value and v != title]
                if others:
                    swap[value] = rng.choice(others)
            changed = conflicting(text, swap)
            out.append((passage_id(title, f"{changed}\x00{j}"), title, changed))
    return out


def conflicting(text: str, swap: dict[str, str]) -> str:
    """``text`` with every whole-word occurrence of a key of ``swap`` replaced by its value, at once (a
    replacement is never replaced again).

    >>> conflicting("Ana was born in Rome. She is a poet.", {"Rome": "Oslo", "poet": "actor"})
    'Ana was born in Oslo. She is a actor.'
    """
    if not swap:
        return text
    longest_first = sorted(swap, key=len, reverse=True)
    pattern = re.compile(r"\b(" + "|".join(re.escape(k) for k in longest_first) + r")\b")
    return pattern.sub(lambda m: swap[m.group(1)], text)
