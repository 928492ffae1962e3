"""EVO-RAG's evidence verifier (arXiv:2505.17391 sec. 3.2, r_ref): an LLM asked whether the evidence
gathered so far, D≤t, is enough to answer the question ("enough_evidence: yes/no"); a REFUSE scores +1
when it says no (the question is unanswerable from what the search can find) and −1 when it says yes.

Any generator answers it (``generator``: the run's own when None, set by the policy; GPT-4o behind
``generator=openai`` in the paper setup). It is asked only about episodes that end in REFUSE (r_ref is 0
on every other step), one batched call, each (question, evidence ids) once per verifier. An unparsable
reply counts as "answerable" (the refusal scores −1): a scored failure, counted in ``unparsed``. A
backend that fails is a one-line error naming it.

Deviation: the paper gives the verifier's question, not its prompt; ours is below (:data:`PROMPT`).
Hand-written: a prompt, a batched call and a parser.
"""

from collections.abc import Sequence

from rag_lab.core.errors import RagLabError
from rag_lab.data.base import Passage, QAExample
from rag_lab.env.episode import Episode
from rag_lab.env.protocols.base import REFUSE
from rag_lab.eval.judge import ask_model, verdict
from rag_lab.generators.base import Sampling

PROMPT = (
    "Question: {question}\nEvidence:\n{evidence}\n"
    "Is this evidence enough to answer the question? Reply with one word: yes or no."
)


class EvidenceVerifier:
    def __init__(self, generator=None, max_new_tokens: int = 4, temperature: float = 0.0):
        self.generator = generator
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.memo: dict[tuple, bool | None] = {}
        self.calls = self.unparsed = 0

    def enough(self, questions: Sequence[str], evidence: Sequence[Sequence[Passage]]) -> list[bool | None]:
        """Per question: True (the evidence is enough), False (not enough), None (unparsable reply)."""
        keys = [(q, tuple(p.id for p in ps)) for q, ps in zip(questions, evidence, strict=True)]
        todo = {k: (q, ps) for k, q, ps in zip(keys, questions, evidence, strict=True) if k not in self.memo}
        if todo:
            if self.generator is None:
                raise RagLabError("reward.verifier.generator: the evidence verifier has no generator")
            texts = [prompt(q, ps) for q, ps in todo.values()]
            sampling = Sampling(temperature=self.temperature, max_new_tokens=self.max_new_tokens)
            replies = ask_model(self.generator, texts, sampling, "reward.verifier", RagLabError)
            self.calls += len(texts)
            for key, reply in zip(todo, replies, strict=True):
                self.memo[key] = verdict(reply[0].text)
                self.unparsed += self.memo[key] is None
        return [self.memo[k] for k in keys]

    def answerable(
        self,
        episodes: Sequence[Episode],
        examples: Sequence[QAExample],
        evidence: Sequence[Sequence[Passage]] | None,
    ) -> list[bool]:
        """r_ref's flag per episode: the verifier's "enough evidence" for an episode ending in REFUSE (an
        unparsable reply: True, so the refusal is charged), the data set's flag elsewhere (unused there)."""
        if evidence is None:
            raise RagLabError("reward.refusal=verifier: the trainer passed no evidence to verify")
        asked = [i for i, ep in enumerate(episodes) if ep.stop_reason == REFUSE]
        verdicts = self.enough([examples[i].question for i in asked], [evidence[i] for i in asked])
        flags = [ex.answerable for ex in examples]
        for i, v in zip(asked, verdicts, strict=True):
            flags[i] = v is not False
        return flags


def prompt(question: str, passages: Sequence[Passage]) -> str:
    """The verifier's question about ``passages`` (numbered, title then text; "(none)" when empty)."""
    lines = [f"[{i}] {p.title}: {p.text}" for i, p in enumerate(passages, start=1)] or ["(none)"]
    return PROMPT.format(question=question, evidence="\n".join(lines))
