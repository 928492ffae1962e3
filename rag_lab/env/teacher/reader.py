"""How the world teacher reads: parse a sub-question into (relation, subject) and extract the
answer from retrieved passages through the world's own sentence patterns.

Part of the teacher, a rule-based SIMULATOR of a strong LLM on the embedded world (DESIGN.md):
it never sees gold answers, only the text of the passages it is given, so it fails exactly
when retrieval failed. Hand-written: the patterns are the generator's templates run backwards.
"""

import re
from dataclasses import dataclass
from functools import cache, lru_cache

from rag_lab.data.base import Passage
from rag_lab.data.synth.world import RELATIONS, SENTENCES

PRONOUN = r"(?:He|She|It|he|she|it|His|Her|Its|his|her|its)"
SENTENCE_END = re.compile(r"(?<=\.)\s+")


@dataclass(frozen=True)
class Ask:
    relation: str
    subject: str


@cache
def _question_patterns() -> list[tuple[str, re.Pattern]]:
    out = []
    for name, rel in RELATIONS.items():
        head, _, tail = rel.question.partition("{x}")
        out.append((name, re.compile(re.escape(head) + r"(?P<x>.+?)" + re.escape(tail) + r"$")))
    return out


@cache
def _sentence_patterns(relation: str) -> list[re.Pattern]:
    patterns = []
    # Most specific first: "born in the city of {v}" must win over "born in {v}".
    for template in sorted(SENTENCES[relation], key=len, reverse=True):
        regex = re.escape(template)
        for slot in ("{Q_l}", "{P}", "{p}", "{Q}"):
            regex = regex.replace(re.escape(slot), PRONOUN)
        regex = regex.replace(re.escape("{s}"), r"(?P<s>[^.]+?)").replace(re.escape("{v}"), r"(?P<v>[^.]+?)")
        patterns.append(re.compile(regex))
    return patterns


@lru_cache(maxsize=1 << 16)  # the teacher asks the same sub-questions over and over
def parse_question(question: str) -> Ask | None:
    """The relation and subject a sub-question asks about.

    >>> parse_question("Where was Tuine Dovale born?")
    Ask(relation='birthplace', subject='Tuine Dovale')
    >>> parse_question("What is the meaning of life?") is None
    True
    """
    for name, pattern in _question_patterns():
        if m := pattern.match(question.strip()):
            return Ask(name, m.group("x"))
    return None


def extract(ask: Ask, passage: Passage) -> str | None:
    """The value of ``ask`` stated in ``passage``, or None. A sentence that names its subject
    must name ``ask.subject``; one that uses a pronoun counts only in the subject's own passage."""
    return _extract(ask.relation, ask.subject, passage.title, passage.text)


@lru_cache(maxsize=1 << 16)  # a rollout reads the same few passages for the same asks again and again
def _extract(relation: str, subject: str, title: str, text: str) -> str | None:
    for sentence in SENTENCE_END.split(text):
        for pattern in _sentence_patterns(relation):
            m = pattern.fullmatch(sentence.strip())
            if not m:
                continue
            named = m.groupdict().get("s")
            if named == subject or (named is None and title == subject):
                return m.group("v")
    return None


def answer_from(question: str, passages: list[Passage]) -> str | None:
    """Answer a single-relation question from passages, best first; None when none states it."""
    ask = parse_question(question)
    if ask is None:
        return None
    return next((v for p in passages if (v := extract(ask, p)) is not None), None)
