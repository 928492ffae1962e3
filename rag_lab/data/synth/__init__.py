"""``data=synth``: the embedded multi-hop world, generated, written in FlashRAG format, read back.

The world is generated once per config (cached under ``cache_dir/synth/<key>``, :mod:`rag_lab.core.cache`: the
settings and the generator's code) and read back through :class:`~rag_lab.data.flashrag.FlashRAGDataset`,
the same loader a real FlashRAG-format dataset goes through.

The difficulty knob (``data=synth_easy``): ``question_types`` and ``question_max_hops`` keep a selection of
the generated questions in every split; the world (corpus, every generated question, the cache entry) stays
the same, so the shipped tiny LM, trained on the whole world (:attr:`SynthDataset.world`), still fits. The
other knobs of how hard a question is to answer are the run's: passages per search (``retriever.top_k``,
the distractors a reader sees) and the search budget. Passage length is fixed by the world: a shorter page
is a different corpus, and the tiny LM would be retrained for it (130 min on 2 cores).

The judge split (``make claims``' own questions) is written only where ``RAG_LAB_JUDGE=1`` is set
(:data:`JUDGE_ENV`, which ``make claims`` sets): without it no file of the cache entry holds a judge question
(nor its answer's aliases), and asking for the split is refused. A judging run of an entry made without it
adds the judge split's files on first use (:meth:`SynthDataset.split`), drawn again from the same settings:
the same questions, rows and bytes as an entry made under the variable. Neither the cache key nor any other
split depends on the variable: the judge split is drawn after the others, with a random stream of its own.
"""

import copy
import json
import os
import random
from functools import cached_property

from rag_lab.core import cache
from rag_lab.core.ranges import NonNegativeInt, PositiveInt, Probability
from rag_lab.core.records import atomic_write_json, atomic_write_text
from rag_lab.data.base import Corpus, DataError, QAExample
from rag_lab.data.flashrag import FlashRAGDataset
from rag_lab.data.jsonl import write_jsonl
from rag_lab.data.synth import formats
from rag_lab.data.synth.questions import judge_questions, make_questions
from rag_lab.data.synth.world import build_world

SPLITS = ("train", "dev", "test", "judge")
# The claims' judge split, and the variable without which it is neither written nor read (make claims sets it;
# rag_lab.eval.provenance refuses a run on it without the variable too).
JUDGE_SPLIT = "judge"
JUDGE_ENV = "RAG_LAB_JUDGE"
JUDGE_REFUSAL = f"reserved for the claims' judgement (make claims, which sets {JUDGE_ENV}=1)"


def judging(environ: dict | None = None) -> bool:
    """Whether ``environ`` (the process's environment by default) sets ``RAG_LAB_JUDGE=1``."""
    return (os.environ if environ is None else environ).get(JUDGE_ENV) == "1"


QUESTION_TYPES = (
    "single_hop",
    "compositional",
    "comparison",
    "inference",
    "bridge_comparison",
    "3hop",
    "4hop",
)
ALL_QUESTIONS = {"types": None, "max_hops": None}


class SynthDataset:
    """The generated world with train / dev / test / judge splits of disjoint questions.

    ``judge`` (``judge_size`` questions) is the claims' own split (``make claims``): questions no other split
    holds, drawn from the same world after the others with a random stream of its own, so that adding it
    changed no question of train, dev or test (nor the tiny LM's world fingerprint). It is written and read
    only under ``RAG_LAB_JUDGE=1`` (the module's docstring; a run on it: :mod:`rag_lab.eval.provenance`)."""

    scorer = "squad"

    def __init__(
        self,
        cache_dir: str,
        seed: int = 0,
        n_people: PositiveInt = 400,
        n_cities: PositiveInt = 60,
        n_countries: PositiveInt = 12,
        n_films: PositiveInt = 150,
        n_companies: PositiveInt = 60,
        n_bands: PositiveInt = 30,
        withhold_rate: Probability = 0.05,
        max_hops: PositiveInt = 4,
        dev_size: NonNegativeInt = 300,
        test_size: NonNegativeInt = 500,
        judge_size: NonNegativeInt = 500,
        name: str = "synth",
        question_types: list[str] | None = None,
        question_max_hops: PositiveInt | None = None,
    ):
        """``question_types`` (null: all of :data:`QUESTION_TYPES`) and ``question_max_hops`` (null: any)
        select the questions every split holds, from the same generated world."""
        self.name = name
        unknown = sorted(set(question_types or ()) - set(QUESTION_TYPES))
        if unknown:
            raise DataError(
                f"data.question_types: unknown type '{unknown[0]}' (known: {', '.join(QUESTION_TYPES)})"
            )
        if question_max_hops is not None and question_max_hops < 1:
            raise DataError(f"data.question_max_hops: {question_max_hops} keeps no question (at least 1)")
        self.selection = {"types": question_types, "max_hops": question_max_hops}
        sizes = {
            "people": n_people,
            "cities": n_cities,
            "countries": n_countries,
            "films": n_films,
            "companies": n_companies,
            "bands": n_bands,
        }
        self.params = {
            "seed": seed,
            "sizes": sizes,
            "withhold_rate": withhold_rate,
            "max_hops": max_hops,
            "dev_size": dev_size,
            "test_size": test_size,
            "judge_size": judge_size,
        }
        self.root = cache.path(cache_dir, "synth", self.params, code=__name__)
        if not (self.root / "world.json").exists():
            self._generate()
        self._flashrag = FlashRAGDataset(str(self.root), str(self.root / "corpus.jsonl"), name=name)

    def _generate(self, judge_only: bool = False) -> None:
        """Write the entry: the corpus, train / dev / test in every format and ``id_aliases.json``, and under
        ``RAG_LAB_JUDGE=1`` the judge split's files. ``judge_only``: add the judge split's files (and its
        answers' aliases) to an entry made without them, every split drawn again (the judge split's MuSiQue
        rows draw their distractors from the stream after the other splits')."""
        p = self.params
        rng = random.Random(p["seed"])
        world = build_world(rng, p["sizes"], p["withhold_rate"])
        title_to_id = {title: pid for pid, (title, _) in world.passages.items()}
        questions = make_questions(rng, world, p["max_hops"])
        rng.shuffle(questions)
        n_dev, n_test = p["dev_size"], p["test_size"]
        if n_dev + n_test >= len(questions):
            raise DataError(
                f"data.dev_size + data.test_size = {n_dev + n_test}, but this world has only "
                f"{len(questions)} questions: raise data.n_people / data.n_films or lower the sizes"
            )
        splits = {
            "dev": questions[:n_dev],
            "test": questions[n_dev : n_dev + n_test],
            "train": questions[n_dev + n_test :],
        }
        if p["judge_size"] and judging():
            splits[JUDGE_SPLIT] = self._judge_questions(world, questions, splits["test"])
        aliases = formats.two_wiki_aliases(questions + splits.get(JUDGE_SPLIT, []))
        write_jsonl(self.root / "id_aliases.json", aliases)
        for split, qs in splits.items():  # in this order: each split's MuSiQue rows draw from rng
            rows = self._rows(split, qs, world, title_to_id, rng)
            if not judge_only or split == JUDGE_SPLIT:
                self._write(split, rows)
        if judge_only:
            return
        write_jsonl(
            self.root / "corpus.jsonl",
            [{"id": pid, "contents": f"{t}\n{x}"} for pid, (t, x) in world.passages.items()],
        )
        # Written last: its presence marks a complete cache entry.
        atomic_write_json(self.root / "world.json", {"params": p, "passages": len(world.passages)})

    def _judge_questions(self, world, questions: list[dict], test: list[dict]) -> list[dict]:
        """The judge split: ``judge_size`` questions no other split holds, in the test split's type mix,
        from a random stream of its own (so that it changes no other split)."""
        p = self.params
        own = random.Random(f"judge:{p['seed']}")
        taken = {q["question"] for q in questions}
        judge = judge_questions(own, world, p["max_hops"], taken, test, p["judge_size"])
        if len(judge) < p["judge_size"]:
            raise DataError(
                f"data.judge_size = {p['judge_size']}, but this world has only {len(judge)} "
                "questions that no other split holds: lower it or raise data.n_people / data.n_films"
            )
        return judge

    @staticmethod
    def _rows(split: str, qs: list[dict], world, title_to_id: dict[str, str], rng: random.Random) -> dict:
        """A split's rows in each format: FlashRAG, MuSiQue (its distractors drawn from ``rng``), HotpotQA
        and 2Wiki (both on the MuSiQue rows' contexts)."""
        flash = [formats.flashrag(f"{split}-{i}", q, title_to_id) for i, q in enumerate(qs)]
        musique = [
            formats.musique(f"{split}-{i}", q, world.passages, title_to_id, rng) for i, q in enumerate(qs)
        ]
        hotpot = [formats.hotpotqa(row, q) for row, q in zip(musique, qs, strict=True)]
        two_wiki = [formats.two_wiki(row, q) for row, q in zip(musique, qs, strict=True)]
        return {"flash": flash, "musique": musique, "hotpot": hotpot, "two_wiki": two_wiki}

    def _write(self, split: str, rows: dict) -> None:
        """A split's files, the FlashRAG one (the one this dataset reads) last: its presence marks the
        split's files complete."""
        write_jsonl(self.root / f"musique_{split}.jsonl", rows["musique"])
        atomic_write_text(
            self.root / f"hotpotqa_{split}.json", json.dumps(rows["hotpot"], ensure_ascii=False)
        )
        atomic_write_text(self.root / f"2wiki_{split}.json", json.dumps(rows["two_wiki"], ensure_ascii=False))
        write_jsonl(self.root / f"{split}.jsonl", rows["flash"])

    def splits(self) -> list[str]:
        """The splits this world has: judge only when ``judge_size`` > 0 and ``RAG_LAB_JUDGE=1`` is set."""
        return [s for s in SPLITS if s != JUDGE_SPLIT or (self.params["judge_size"] and judging())]

    def split(self, name: str) -> list[QAExample]:
        if name not in SPLITS:
            raise DataError(f"{self.name} has no split '{name}' (has: {', '.join(self.splits())})")
        if name == JUDGE_SPLIT:
            if not self.params["judge_size"]:
                raise DataError(f"{self.name} has no judge split: data.judge_size is 0")
            if not judging():
                raise DataError(f"{self.name}: the judge split is {JUDGE_REFUSAL}; probes use dev / test")
            if not (self.root / f"{JUDGE_SPLIT}.jsonl").exists():  # an entry made without RAG_LAB_JUDGE=1
                self._generate(judge_only=True)
        types, max_hops = self.selection["types"], self.selection["max_hops"]
        kept = [
            ex
            for ex in self._flashrag.split(name)
            if (types is None or ex.type in types) and (max_hops is None or ex.hops <= max_hops)
        ]
        if not kept:
            raise DataError(
                f"data.question_types / data.question_max_hops: no question of the {name} split is kept "
                f"(types {types}, at most {max_hops} hops)"
            )
        return kept

    @cached_property
    def world(self) -> "SynthDataset":
        """The whole world, every question kept: what the tiny LM's recipe reads (its fingerprint, its
        training data), whatever the selection."""
        if self.selection == ALL_QUESTIONS:
            return self
        whole = copy.copy(self)  # shares the read files
        whole.selection = ALL_QUESTIONS
        return whole

    @property
    def skipped(self) -> dict[str, int]:
        return self._flashrag.skipped

    @property
    def duplicates(self) -> dict[str, int]:
        return self._flashrag.duplicates

    @cached_property
    def corpus(self) -> Corpus:
        return self._flashrag.corpus
