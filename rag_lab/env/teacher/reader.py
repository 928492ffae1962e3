"""How the world teacher reads: parse a sub-question into (relation, subject) and extract the
answer from retrieved passages through the world's own sentence patterns.

Part of the teacher, a rule-based SIMULATOR of a strong LLM on the embedded world (DESIGN.md):
it never sees gold answers, only the text of the passages it is given, so it fails exactly
when retrieval failed. Hand-written: the patterns are the generator's templates run backwards.
"""

import re
from dataclasses import dataclass
from functools import cache

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
    for sentence in SENTENCE_END.split(passage.text):
        for pattern in _sentence_patterns(ask.relation):
            m = pattern.fullmatch(sentence.strip())
            if not m:
                continue
            subject = m.groupdict().get("s")
            if subject == ask.subject or (subject is None and passage.title == ask.subject):
                return m.group("v")
    return None


def answer_from(question: str, passages: list[Passage]) -> str | None:
    """Answer a single-relation question from passages, best first; None when none states it."""
    ask = parse_question(question)
    if ask is None:
        return None
    return next((v for p in passages if (v := extract(ask, p)) is not None), None)
