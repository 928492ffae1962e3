"""The tiny LM's reading items, built from the world's pages (the reading and protocol stages of
:func:`rag_lab.train.tiny.recipe.train`; ``experiments/results/tiny_lm.md`` says why each exists).

- Layouts: ``drill`` (``Document: / Question: / Answer:``; a reading item is a whole page with every
  question it answers, :func:`reading_pages`), ``qa`` and ``stoprag_intermediate`` (the protocols' own
  prompts over a page and its retrieval neighbours), and the teacher's ``demos`` (loss on the
  completion). Each corpus layout is also a set of one-question SFT drills (:data:`DRILLS`).
- Renaming (:func:`renamer`): every entity name of a group of texts becomes another of its kind, so the answer
  can only be read, not remembered.
- Batching: :func:`group_by_length` and :func:`draw_reading` (a seeded mix of the layouts).

Hand-written: these are this world's data, which no library makes.
"""

import logging
import random
import re
from collections.abc import Callable, Iterable, Sequence

from rag_lab.data.base import Passage
from rag_lab.env.protocols.base import PROTOCOLS, SEARCH, Action, State, Turn
from rag_lab.env.protocols.simple import QA
from rag_lab.env.protocols.stoprag import StopRAGIntermediate
from rag_lab.env.teacher.reader import answer_from, parse_question
from rag_lab.train.tiny.tokenizer import SPECIAL

log = logging.getLogger(__name__)


# The stop that ends an answer in the reading layouts (qa, stoprag_intermediate and the drills all stop
# at a newline). A reading item's answer piece ends with it, so it is a target: without it a model
# trained on reading items answers and goes on ("Peport Seoholm Seoholm ...").
STOP = "\n"


# The end of a completion whose protocol has no stop string (the tokenizer's EOS, a special token).
EOS = SPECIAL[1]


# The protocols' tags: one token each.
TAGS = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<reflect>",
    "</reflect>",
    "<answer>",
    "</answer>",
    "<STOP>",
    "<CONTINUE>",
)


def page_facts(data) -> list[tuple[Passage, list[tuple[str, str]]]]:
    """Every corpus page with the (question, answer) pairs it answers: one relation question per
    sub-question template of the training split, answered by the teacher's reader from the page."""
    templates: dict[str, str] = {}
    for ex in data.split("train"):
        for sub in ex.decomposition:
            ask = parse_question(sub.question)
            if ask and ask.subject in sub.question:
                templates.setdefault(ask.relation, sub.question.replace(ask.subject, "{X}"))
    out = []
    for page in data.corpus:
        facts = []
        for template in templates.values():
            question = template.format(X=page.title)
            # Some are odd but kept: the reader's "occupation" pattern reads a country's page as
            # "country whose capital is X". These 3% of multi-word answers are spans copied from the
            # page, and they matter: without them the probe stayed on its plateau (held-out 0.06 at
            # 1,000 steps against 0.19-0.25 with them): copying a span trains the copying circuit
            # that reading then uses.
            if (answer := answer_from(question, [page])) is not None:
                facts.append((question, answer))
        if facts:
            out.append((page, facts))
    return out


def reading_drills(facts: list[tuple[Passage, list[tuple[str, str]]]]) -> list[tuple[str, str]]:
    """Single-page reading drills from :func:`page_facts`: ``Document: <page> / Question: <a relation
    question about the page's entity> / Answer:`` → the value the page states."""
    return [
        (f"Document: {page.contents}\nQuestion: {question}\nAnswer:", f" {answer}")
        for page, qas in facts
        for question, answer in qas
    ]


def reading_pages(facts: list[tuple[Passage, list[tuple[str, str]]]]) -> list[tuple[str, ...]]:
    """One reading item per page from :func:`page_facts`: ``Document: <page>``, then every question the
    page answers, each followed by its answer; pieces alternate context and answer (``model.read``
    puts the loss on the answers). Every answer of a page trains on one pass over it: in the probe,
    held-out reading reached 0.375 at 1,000 steps this way against 0.19 with one question per page."""
    out = []
    for page, qas in facts:
        pieces = [f"Document: {page.contents}\n"]
        for question, answer in qas:
            pieces[-1] += f"Question: {question}\nAnswer:"
            pieces += [f" {answer}{STOP}", ""]
        out.append(tuple(pieces[:-1]))
    return out


def shuffle_questions(item: tuple[str, ...], rng: random.Random) -> tuple[str, ...]:
    """A :func:`reading_pages` item with its questions in a random order (the page stays first)."""
    head, first = item[0].split("\nQuestion: ", 1)
    qas = [("Question: " + first, item[1])] + [(item[i], item[i + 1]) for i in range(2, len(item), 2)]
    rng.shuffle(qas)
    return (f"{head}\n{qas[0][0]}", qas[0][1], *[x for qa in qas[1:] for x in qa])


def page_neighbours(facts: list[tuple[Passage, list[tuple[str, str]]]], retriever, k: int) -> list[list[int]]:
    """For each page of ``facts``, the indices of the ``k`` other pages that BM25 ranks highest for its
    title: the distractors a search for that entity would retrieve next to it (similar names)."""
    index = {page.id: i for i, (page, _) in enumerate(facts)}
    hits = retriever.search([page.title for page, _ in facts], k + 1)
    return [
        [index[h.id] for h in row if h.id in index and index[h.id] != i][:k] for i, row in enumerate(hits)
    ]


def qa_reading_item(
    facts: list[tuple[Passage, list[tuple[str, str]]]],
    i: int,
    neighbours: list[list[int]],
    rng: random.Random,
    max_pages: int = 3,
    max_questions: int = 6,
) -> tuple[str, ...]:
    """A reading item in the ``qa`` protocol's own layout: ``Documents:`` with page ``i`` and 0 to
    ``max_pages - 1`` of its neighbours in random order, then up to ``max_questions`` questions about
    any of those pages, each as ``Question: q`` + the protocol's tag, followed by its answer and the
    protocol's stop (:data:`STOP`, a target too). The first question is exactly a ``qa`` prompt; later
    ones repeat its last line. Reading learned in one layout does not carry to another: a model at
    0.59 on drill-layout pages scored 0.03 on the same pages as ``qa`` prompts."""
    others = rng.sample(neighbours[i], min(rng.randint(0, max_pages - 1), len(neighbours[i])))
    chosen = [i, *others]
    rng.shuffle(chosen)
    qas = [qa for j in chosen for qa in facts[j][1]]
    qas = rng.sample(qas, min(max_questions, len(qas)))
    pages, tag = [facts[j][0] for j in chosen], QA().tag
    pieces = [qa_prompt(qas[0][0], pages), qas[0][1] + STOP]
    for question, answer in qas[1:]:
        pieces += [f"Question: {question}{tag}", answer + STOP]
    return tuple(pieces)


def qa_prompt(question: str, pages: list[Passage]) -> str:
    """The ``qa`` protocol's prompt (rendered by the protocol itself) for a question and its pages."""
    return QA().prompt(searched(question, pages))


def searched(question: str, pages: list[Passage]) -> State:
    """The state after one search for ``question`` that returned ``pages``: what the reading layouts
    render through the protocols themselves."""
    return State(question, [Turn(Action(SEARCH, query=question), list(pages))])


def qa_drills(facts: list[tuple[Passage, list[tuple[str, str]]]]) -> list[tuple[str, str]]:
    """:func:`reading_drills` in the ``qa`` protocol's layout: one page, one question, its answer."""
    return [(qa_prompt(question, [page]), answer) for page, qas in facts for question, answer in qas]


def intermediate_prompt(question: str, page: Passage) -> str:
    """Stop-RAG's intermediate-answer prompt (question first, then its one document), as the protocol
    renders it."""
    return StopRAGIntermediate().prompt(searched(question, [page]))


def intermediate_drills(facts: list[tuple[Passage, list[tuple[str, str]]]]) -> list[tuple[str, str]]:
    """:func:`reading_drills` in Stop-RAG's intermediate-answer layout."""
    return [(intermediate_prompt(q, page), answer) for page, qas in facts for q, answer in qas]


def intermediate_reading_item(
    facts: list[tuple[Passage, list[tuple[str, str]]]], i: int, rng: random.Random
) -> tuple[str, str]:
    """A reading item in Stop-RAG's intermediate-answer layout: one random question about page ``i``
    and its answer. One question per item: the question comes before the page, so a second one would
    need the page again."""
    page, qas = facts[i]
    question, answer = rng.choice(qas)
    return intermediate_prompt(question, page), answer + STOP


# generator.reading_layout's corpus layouts -> the SFT drills of that layout (the recipe's ``drills``);
# "demos" is the teacher's demonstrations of every protocol, renamed afresh each time they are drawn,
# loss on the completion; "demos:<protocol>" draws that protocol's only, so a layout list can weight them.
DRILLS = {"drill": reading_drills, "qa": qa_drills, "stoprag_intermediate": intermediate_drills}


READING_LAYOUTS = (*DRILLS, "demos")


# A relation that only one kind of page answers, per kind (person, film, company, country, ...).
KIND_RELATIONS = ("birthplace", "director", "founder", "capital", "origin", "country")


def page_kinds(facts: list[tuple[Passage, list[tuple[str, str]]]]) -> dict[str, str]:
    """title -> the entity's kind, named by a relation only pages of that kind answer (a person's
    page states a birthplace, a city's its country, ...): the world's entity types, read from the text."""
    out = {}
    for page, qas in facts:
        relations = {ask.relation for q, _ in qas if (ask := parse_question(q))}
        out[page.title] = next((r for r in KIND_RELATIONS if r in relations), "")
    return out


def renamer(
    titles: list[str], kinds: dict[str, str] | None = None
) -> Callable[[tuple[str, ...], random.Random], tuple[str, ...]]:
    """Entity anonymisation (Hermann et al. 2015): every entity title in a group of texts becomes a
    random other title of the same kind (``kinds``; multi-word for multi-word), the same one throughout
    the group. With names as single tokens, a model can otherwise store facts in the name embeddings
    instead of reading; keeping the kind keeps the world's types (a nationality is a country), so
    the first step of reading (which entity of the page has the asked type) stays learnable."""
    pattern = re.compile(r"\b(" + trie_pattern(titles) + r")\b")
    kinds = kinds or {}

    def key(title: str) -> tuple[str, bool]:
        return kinds.get(title, ""), " " in title

    pools: dict[tuple[str, bool], list[str]] = {}
    for title in titles:
        pools.setdefault(key(title), []).append(title)

    def rename(texts: tuple[str, ...], rng: random.Random) -> tuple[str, ...]:
        mapping: dict[str, str] = {}

        def sub(m: re.Match) -> str:
            return mapping.setdefault(m.group(0), rng.choice(pools[key(m.group(0))]))

        return tuple(pattern.sub(sub, t) for t in texts)

    return rename


def trie_pattern(words: Iterable[str]) -> str:
    """A regex matching exactly ``words``, as a character trie: at each position it takes the longest
    word there that the rest of the pattern allows, as the alternation of the words longest first does
    (same matches), but it tests one branch per character instead of every word in turn: renaming
    with the world's titles ran 22x faster on its corpus (experiments/results/tiny_lm.md, "On a GPU")."""
    trie: dict = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}

    def emit(node: dict) -> str:
        branches = [re.escape(char) + emit(child) for char, child in sorted(node.items()) if char]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


def name_words(titles: Iterable[str], texts: Iterable[str]) -> set[str]:
    """The words of the world's names: every word of a title that ``texts`` never write in lower case
    ("Liakriaburg", "Naelle"; not "The" or "Works")."""
    lower = {w for text in texts for w in re.findall(r"\w+", text) if w.islower()}
    words = {w for title in titles for w in re.findall(r"\w+", title) if w.isalpha()}
    return {w for w in words if w.lower() not in lower}


def group_by_length(
    batches: Sequence[tuple[str, list[tuple[str, ...]]]], rng: random.Random, window: int = 8
) -> list[list[tuple[str, ...]]]:
    """``batches`` (kind, items) with their items regrouped by length: every ``window`` batches of one kind
    (in step order) pool their items, sort them by length, cut them into batches of the same sizes and
    take those back in a random order, so no step sees a trend in length. A batch pads every row to its
    longest: reading items of the ``qa`` layout (1 to 5 pages) cost 2.0x their own tokens in random
    batches of 32, 1.1x grouped over 8 (experiments/results/bench_tiny_training.md)."""
    out = [list(items) for _, items in batches]
    steps_of: dict[str, list[int]] = {}
    for step, (kind, _) in enumerate(batches):
        steps_of.setdefault(kind, []).append(step)
    for steps in steps_of.values():
        for start in range(0, len(steps), window):
            chunk = steps[start : start + window]
            pool = sorted((item for s in chunk for item in out[s]), key=lambda item: sum(map(len, item)))
            sizes, start_at = {s: len(out[s]) for s in chunk}, 0
            rng.shuffle(chunk)  # which step gets which slice of the sorted pool
            for s in chunk:
                out[s] = pool[start_at : start_at + sizes[s]]
                start_at += sizes[s]
    return out


def draw_reading(
    layouts: Sequence[str],
    steps: int,
    size: int,
    draws: dict[str, Callable[[], tuple[str, ...]]],
    demo_pools: dict[str, list[tuple[str, str]]],
    rename: Callable[[tuple[str, ...], random.Random], tuple[str, ...]],
    rng: random.Random,
    seed: int,
    stops: bool = False,
) -> list[tuple[str, ...]]:
    """The reading stage's items, ``steps`` batches of ``size`` in order. Layouts take turns batch by
    batch; a corpus layout's batch holds ``draws[layout]()`` items, a "demos" batch the demonstrations
    of one protocol (a random one; "demos:<protocol>" names it), each renamed afresh. Batches of one
    kind then swap items so that each holds items of similar length (:func:`group_by_length`).
    ``stops``: a demonstration's
    completion ends with its protocol's stop (as the corpus layouts' answers do) where the protocol does
    not keep it in the text, or EOS where it has none; without it only a later SFT stage (an EOS after
    each completion) teaches where a completion ends."""

    def batch(layout: str) -> tuple[str, list[tuple[str, ...]]]:
        base, _, name = layout.partition(":")
        if base == "demos":
            name = name or rng.choice(sorted(demo_pools))
            picked = [rename(rng.choice(demo_pools[name]), rng) for _ in range(size)]
            protocol = PROTOCOLS.get(name)
            if stops and protocol is not None and not protocol.include_stop:
                # a protocol without a stop string ends where the model writes EOS (as after SFT)
                end = protocol.stop[0] if protocol.stop else EOS
                picked = [(prompt, completion + end) for prompt, completion in picked]
            return f"{base}:{name}", picked
        return layout, [rename(draws[layout](), rng) for _ in range(size)]

    drawn = [batch(layouts[step % len(layouts)]) for step in range(steps)]
    return [item for items in group_by_length(drawn, random.Random(seed)) for item in items]
