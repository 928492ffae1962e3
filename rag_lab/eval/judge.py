"""LLM-as-judge accuracy through any generator, with the DAPO paper's YES / NO prompt (its B.4).

Verdicts are cached on disk per (normalised prediction, normalised golds), so re-scoring a run
or scoring the same answers in another run costs no calls; with ``n > 1`` samples the verdict
is the majority (ties are NO). An empty prediction is NO without a call. A judge that cannot be
reached (the generator raises) is a ``JudgeError`` naming the cause, never a silent 0.
"""

import json
from collections.abc import Sequence
from pathlib import Path

from rag_lab.core.errors import RagLabError
from rag_lab.core.ranges import NonNegative, PositiveInt
from rag_lab.core.records import RecordWriter, read_records
from rag_lab.eval.metrics import normalize_answer
from rag_lab.generators.base import Generator, Sampling

# The DAPO paper's judge instruction (appendix B.4), with the normalised prediction and golds.
JUDGE_PROMPT = (
    "You are an evaluation assistant. Your task is to determine whether the given prediction "
    "semantically matches any of the reference answers. This is a flexible match: even if the wording "
    "is different, if the meaning is the same, consider it a match. Prediction: {prediction} Reference "
    "Answers: {golds} Please answer with a single word: - YES → if the prediction expresses the same "
    "meaning as any of the reference answers. - NO → otherwise. Only respond with YES or NO."
)


class JudgeError(RagLabError):
    """The judge could not be asked (unreachable endpoint, failed backend)."""


def verdict(text: str) -> bool | None:
    """YES -> True, NO -> False, anything else -> None (not counted as a vote).

    >>> verdict(" Yes."), verdict("NO"), verdict("maybe")
    (True, False, None)
    """
    word = text.strip().split()[0].strip(".,!:;\"'").upper() if text.strip() else ""
    return {"YES": True, "NO": False}.get(word)


def ask_model(generator, texts: Sequence[str], sampling: Sampling, who: str, error=JudgeError) -> list:
    """One batched ``generate`` of ``texts``, each a one-message chat (plain text for a generator that reads
    plain text: ``chat`` false, the tiny LM); a backend that fails is a one-line ``error`` naming ``who``."""
    chat = getattr(generator, "chat", True)
    prompts = [[{"role": "user", "content": t}] if chat else t for t in texts]
    try:
        return generator.generate(prompts, sampling)
    except (OSError, ConnectionError, TimeoutError, RuntimeError) as e:
        raise error(f"{who} ({type(generator).__name__}) failed: {e}") from None


class LLMJudge:
    def __init__(
        self,
        # the generator that judges: a generator config (null: the run's own generator, shared)
        generator: Generator,
        n: PositiveInt = 1,
        temperature: NonNegative = 0.0,
        # a jsonl of verdicts already given (prompt key -> score), read first, then appended to (null: none)
        cache_path: str | None = None,
    ):
        if generator is None:
            raise JudgeError("judge=llm needs a generator: set generator=<name> or judge.generator=<config>")
        self.generator = generator
        self.n = n
        self.temperature = temperature
        self.cache_path = Path(cache_path) if cache_path else None
        self.cache: dict[str, float] = {}
        self.calls = 0
        if self.cache_path:
            self.cache = {r["key"]: r["score"] for r in read_records(self.cache_path)}

    @staticmethod
    def key(prediction: str, golds: Sequence[str]) -> str:
        return json.dumps([normalize_answer(prediction), sorted({normalize_answer(g) for g in golds})])

    def __call__(self, predictions: Sequence[str], golds: Sequence[Sequence[str]]) -> list[float]:
        """1.0 where the judge says the prediction matches a gold answer, else 0.0."""
        keys = [self.key(p, g) for p, g in zip(predictions, golds, strict=True)]
        todo = list(dict.fromkeys(k for k in keys if k not in self.cache and json.loads(k)[0]))
        if todo:
            self._ask(todo)
        return [self.cache.get(k, 0.0) for k in keys]

    def _ask(self, keys: list[str]) -> None:
        texts = []
        for k in keys:
            prediction, golds = json.loads(k)
            texts.append(JUDGE_PROMPT.format(prediction=prediction, golds=", ".join(golds)))
        sampling = Sampling(n=self.n, temperature=self.temperature, max_new_tokens=4)
        outputs = ask_model(self.generator, texts, sampling, "LLM judge")
        self.calls += len(texts)
        fresh = []
        for k, completions in zip(keys, outputs, strict=True):
            votes = [verdict(c.text) for c in completions]
            self.cache[k] = float(sum(v is True for v in votes) * 2 > self.n)
            fresh.append({"key": k, "score": self.cache[k]})
        if self.cache_path:
            RecordWriter(self.cache_path).write(fresh)
