"""``generator=tiny``: the embedded default LM — trained from scratch on the world, cached, loaded.

Data: the corpus (pretraining texts, ``title\\ntext``) and the world teacher's demonstrations of
every protocol on the *training* questions (rag_lab.generators.teacher.demos; BM25 retrieval,
``k`` passages per search, Stop-RAG pipelines of ``iterations``). Training: ``train_tiny_lm``
(rag_lab.train.tiny_lm). The checkpoint lives under ``cache_dir/tiny_lm/<hash of config and
data>``, so the first run trains it and every later run with the same world and sizes reuses it;
``train_seed`` (not the run's seed) seeds training, so runs over several seeds share one LM.
The result is an ordinary ``HFGenerator`` with plain-text prompts (no chat template).
"""

import hashlib
import json
import logging
import math
import random
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, replace
from pathlib import Path

from rag_lab.data.base import Passage
from rag_lab.env.protocols.base import PROTOCOLS, SEARCH, Action, State, Turn
from rag_lab.env.protocols.simple import QA
from rag_lab.env.protocols.stoprag import StopRAGIntermediate
from rag_lab.errors import RagLabError
from rag_lab.generators.teacher.demos import collect, sample
from rag_lab.generators.teacher.generator import TeacherGenerator
from rag_lab.generators.teacher.reader import answer_from, parse_question
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.train.tiny_lm import SPECIAL, TinyConfig, fingerprint, train_tiny_lm, tune_tiny_lm

log = logging.getLogger(__name__)

# The stop that ends an answer in the reading layouts (qa, stoprag_intermediate and the drills all stop
# at a newline). A reading item's answer piece ends with it, so it is a target: without it a model
# trained on reading items answers and goes on ("Peport Seoholm Seoholm ...").
STOP = "\n"

# The end of a completion whose protocol has no stop string (the tokenizer's EOS, a special token).
EOS = SPECIAL[1]

# The protocols' tags: one token each.
TAGS = ("<think>", "</think>", "<search>", "</search>", "<information>", "</information>", "<reflect>",
        "</reflect>", "<answer>", "</answer>", "<STOP>", "<CONTINUE>")  # fmt: skip


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
    page answers, each followed by its answer; pieces alternate context and answer (``tiny.read``
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
    contrast: bool = False,
) -> tuple[str, ...]:
    """A reading item in the ``qa`` protocol's own layout: ``Documents:`` with page ``i`` and 0 to
    ``max_pages - 1`` of its neighbours in random order, then up to ``max_questions`` questions about
    any of those pages, each as ``Question: q`` + the protocol's tag, followed by its answer and the
    protocol's stop (:data:`STOP`, a target too). The first question is exactly a ``qa`` prompt; later
    ones repeat its last line. ``contrast``: the first questions ask one relation of every page that
    states it (the item's other pages are BM25 neighbours of page ``i``: the same kind of entity).
    Reading learned in one layout does not carry to another: a model
    at 0.59 on drill-layout pages scored 0.03 on the same pages as ``qa`` prompts."""
    others = rng.sample(neighbours[i], min(rng.randint(0, max_pages - 1), len(neighbours[i])))
    chosen = [i, *others]
    rng.shuffle(chosen)
    qas = [qa for j in chosen for qa in facts[j][1]]
    first: list[tuple[str, str]] = []
    if contrast:
        # One relation asked of every page that states it, first: copying the value of the asked
        # relation from any page then answers one of them only, so the loss pays for matching the
        # question's entity to its page.
        by_relation: dict[str, list[tuple[str, str]]] = {}
        for qa in qas:
            by_relation.setdefault(getattr(parse_question(qa[0]), "relation", ""), []).append(qa)
        shared = [group for relation, group in sorted(by_relation.items()) if relation and len(group) > 1]
        first = rng.sample(group := rng.choice(shared), min(max_questions, len(group))) if shared else []
    rest = [qa for qa in qas if qa not in first]
    qas = first + rng.sample(rest, min(max_questions - len(first), len(rest)))
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


# generator.reading_layout's corpus layouts -> the SFT drills of that layout (``drills``); "demos" is the
# teacher's demonstrations of every protocol, renamed afresh each time they are drawn, loss on the
# completion; "traces" the same with the loss on every token (see :func:`trace_item`). "demos:<protocol>"
# (or "traces:<protocol>") draws that protocol's demonstrations only, so a layout list can weight them.
DRILLS = {"drill": reading_drills, "qa": qa_drills, "stoprag_intermediate": intermediate_drills}
READING_LAYOUTS = (*DRILLS, "demos", "traces")


def trace_item(prompt: str, completion: str) -> tuple[str, ...]:
    """A demonstration as a reading item with the loss on every token, prompt included (pieces
    alternate context and answer, so the prompt is an answer piece after an empty context). A trace's
    prompt holds the protocol's own earlier steps: in a Stop-RAG trace every follow-up query (copy the
    last intermediate answer, take the next relation of the question) and every intermediate answer
    (copy from the document above it) is a target in its own place, so one trace trains each step
    several times, where the completion-only loss trains the last one. The two pieces stay apart, as
    prompt and generation are tokenized at inference."""
    return ("", prompt, "", completion)


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
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(titles, key=len, reverse=True))) + r")\b")
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
    of one protocol (a random one; "demos:<protocol>" names it), each renamed afresh; "traces" as demos
    with the loss on every token (:func:`trace_item`). Batches of one kind then swap items so that
    each holds items of similar length (:func:`group_by_length`). ``stops``: a demonstration's
    completion ends with its protocol's stop (as the corpus layouts' answers do) where the protocol does
    not keep it in the text, or EOS where it has none; without it only a later SFT stage (an EOS after
    each completion) teaches where a completion ends."""

    def batch(layout: str) -> tuple[str, list[tuple[str, ...]]]:
        base, _, name = layout.partition(":")
        if base in ("demos", "traces"):
            name = name or rng.choice(sorted(demo_pools))
            picked = [rename(rng.choice(demo_pools[name]), rng) for _ in range(size)]
            protocol = PROTOCOLS.get(name)
            if stops and protocol is not None and not protocol.include_stop:
                # a protocol without a stop string ends where the model writes EOS (as after SFT)
                end = protocol.stop[0] if protocol.stop else EOS
                picked = [(prompt, completion + end) for prompt, completion in picked]
            return f"{base}:{name}", [trace_item(*pair) for pair in picked] if base == "traces" else picked
        return layout, [rename(draws[layout](), rng) for _ in range(size)]

    drawn = [batch(layouts[step % len(layouts)]) for step in range(steps)]
    return [item for items in group_by_length(drawn, random.Random(seed)) for item in items]


def train(
    data,
    cache_dir: str,
    # demonstrations per protocol, in words (sampled from the teacher's rollouts on the training split)
    words_per_protocol: int = 60_000,
    k: int = 3,
    iterations: int = 6,
    # the protocols to demonstrate (null: every protocol)
    protocols: list[str] | None = None,
    hidden: int = 64,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 256,
    max_length: int = 1024,
    copy_steps: int = 2000,
    # a reading stage first: renamed pages with all their questions, answer-only loss (0: none)
    reading_steps: int = 0,
    reading_batch_size: int = 32,
    # the reading items' layout, or a list of layouts taking turns batch by batch: "drill"
    # (reading_pages), "qa" (qa_reading_item, up to reading_max_pages), "stoprag_intermediate" (one page,
    # one question, Stop-RAG's question-first prompt), "demos" (every teacher demonstration, renamed),
    # "traces" (the same, loss on every token: trace_item)
    reading_layout: str | Sequence[str] = "drill",
    reading_max_pages: int = 3,
    # questions per qa reading item, at most (about any of its pages)
    reading_max_questions: int = 6,
    # qa reading items ask one relation of every page that states it first (qa_reading_item's contrast)
    reading_contrast: bool = False,
    # a protocol stage last, cached apart (the model before it is reused): tune_steps batches of
    # reading_batch_size in tune_layout (the reading layouts; "demos:<protocol>" weights a protocol), at
    # tune_lr, each completion ending with its protocol's stop (0: none)
    tune_steps: int = 0,
    tune_layout: str | Sequence[str] = "demos",
    tune_lr: float = 1e-3,
    pretrain_steps: int = 500,
    pretrain_length: int = 256,
    # demonstrations up to this many words also go into pretraining (0: the corpus only)
    pretrain_demo_words: int = 80,
    # passes over the demonstrations (the SFT step count follows from it and the batch size)
    epochs: float = 1.0,
    batch_size: int = 8,
    lr: float = 1e-3,
    warmup_steps: int = 50,
    completion_only_loss: bool = False,
    # multi-word entity names (titles) as one token each (true), or as their words (false: each name part
    # is a frequent word; copied far sooner, experiments/results/tiny_lm.md)
    whole_names: bool = True,
    # the names' embeddings: drawn at this std (0: the model's init) and kept frozen (TinyConfig)
    name_std: float = 0.0,
    freeze_names: bool = False,
    # the names' words as their syllables (Lia ##kria ##burg: build_tokenizer's pieces), not one token each
    name_pieces: bool = False,
    # SFT also on single-page reading drills from the corpus (reading_drills)
    drills: bool = False,
    # each SFT example gets its entities renamed at random (renamer), a fresh renaming per epoch
    rename_entities: bool = False,
    train_seed: int = 0,
) -> Path:
    """The recipe: the tiny LM trained on ``data`` (cached under ``cache_dir/tiny_lm/<hash>``); its path."""
    layouts = _layouts(reading_layout, protocols, "reading_layout")
    tune_layouts = _layouts(tune_layout, protocols, "tune_layout") if tune_steps else []
    # the layouts of the stages that run
    bases = {layout.partition(":")[0] for layout in [*(layouts if reading_steps else []), *tune_layouts]}
    texts = [p.contents for p in data.corpus]
    retriever = BM25Retriever(data.corpus, cache_dir=cache_dir)
    by_protocol = collect(TeacherGenerator(data), data.corpus, retriever, data.split("train"), k, iterations)
    pairs = sample(by_protocol, words_per_protocol, protocols, seed=train_seed)
    facts = page_facts(data) if drills or rename_entities or reading_steps or tune_steps else []
    if drills:
        pairs += [pair for layout in layouts if layout in DRILLS for pair in DRILLS[layout](facts)]
    n_pairs = len(pairs)
    # Renaming keeps each entity's kind (a country becomes another country), as the world does.
    entities = sorted(set(data.corpus.titles))
    rename, rng = renamer(entities, page_kinds(facts)), random.Random(train_seed)
    if rename_entities:
        pairs = [rename(pair, rng) for _ in range(math.ceil(epochs)) for pair in pairs]
    # The reading stage always renames: its drills are the corpus's own facts, so with real names a
    # model memorises them (held-out 0.36 vs train 0.75, experiments/results/tiny_lm.md) instead of
    # reading.
    neighbours = page_neighbours(facts, retriever, 4) if "qa" in bases else []
    pool = reading_pages(facts) if "drill" in bases else []
    chosen = {
        name: demos for name, demos in sorted(by_protocol.items()) if protocols is None or name in protocols
    }
    # "demos"/"traces": every demonstration the teacher gave (not only the SFT sample), one protocol per
    # batch (a random one, or the one the layout names).
    wanted = {"demos", "traces"} & bases
    demo_pools = {name: sorted(d.items()) for name, d in chosen.items()} if wanted else {}
    for layout in [*layouts, *tune_layouts]:
        if ":" in layout and demo_pools and layout.partition(":")[2] not in demo_pools:
            raise RagLabError(
                f"generator: layout {layout!r}: the teacher gave no demonstrations of that protocol"
                f" (it gave {', '.join(demo_pools)})"
            )

    def draws(rng: random.Random) -> dict[str, Callable[[], tuple[str, ...]]]:
        return {
            "drill": lambda: shuffle_questions(rng.choice(pool), rng),
            "qa": lambda: qa_reading_item(
                facts,
                rng.randrange(len(facts)),
                neighbours,
                rng,
                reading_max_pages,
                reading_max_questions,
                reading_contrast,
            ),
            "stoprag_intermediate": lambda: intermediate_reading_item(facts, rng.randrange(len(facts)), rng),
        }

    reading = draw_reading(
        layouts, reading_steps, reading_batch_size, draws(rng), demo_pools, rename, rng, train_seed
    )
    # Short demonstrations (all of them, prompt + completion) join the corpus in pretraining: packed
    # and cheap, they are where the model first learns to copy a name from its context.
    for demos in chosen.values():
        texts += [p + c for p, c in sorted(demos.items()) if len((p + c).split()) <= pretrain_demo_words]
    config = TinyConfig(
        hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, intermediate=intermediate,
        max_length=max_length, copy_steps=copy_steps, reading_steps=reading_steps,
        reading_batch_size=reading_batch_size, pretrain_steps=pretrain_steps,
        pretrain_length=pretrain_length,
        sft_steps=math.ceil(epochs * n_pairs / batch_size), batch_size=batch_size, lr=lr,
        warmup_steps=warmup_steps, seed=train_seed, completion_only_loss=completion_only_loss,
        name_std=name_std, freeze_names=freeze_names,
    )  # fmt: skip
    # whole_names: entity names (multi-word titles) become single tokens, so copying one is a one-token
    # act; but each is then a rare token, and under renaming the names of a kind are interchangeable.
    names = sorted({title for title in data.corpus.titles if " " in title}) if whole_names else []
    pieces = name_words(entities, texts) if name_pieces else set()
    data_hash = fingerprint(texts, pairs, TAGS, names, reading, entities, config.anchored, pieces)
    key = json.dumps([asdict(config), data_hash])
    out = Path(cache_dir).expanduser() / "tiny_lm" / hashlib.sha256(key.encode()).hexdigest()[:16]
    if not out.exists():
        log.info("training the tiny LM (%d texts, %d demonstrations) into %s", len(texts), len(pairs), out)
    path = train_tiny_lm(texts, pairs, config, out, TAGS, names, reading, entities, pieces)
    if tune_steps:
        # The protocol stage, cached apart: the model above (reused when cached) trained on. Its own
        # random stream, so its items do not depend on the stages before; they end with the protocol's
        # stop (nothing after it teaches where a completion ends).
        tune_rng = random.Random(train_seed + 1)
        tuning = draw_reading(
            tune_layouts, tune_steps, reading_batch_size, draws(tune_rng), demo_pools, rename, tune_rng,
            train_seed, stops=True,
        )  # fmt: skip
        tune_config = replace(config, reading_steps=tune_steps, lr=tune_lr)
        tune_hash = fingerprint([], [], (), reading=tuning, entities=entities)
        key = json.dumps([path.name, asdict(tune_config), tune_hash])
        out = Path(cache_dir).expanduser() / "tiny_lm" / hashlib.sha256(key.encode()).hexdigest()[:16]
        if not out.exists():
            log.info("training the tiny LM's protocol stage (%d steps) on %s into %s", tune_steps, path, out)
        path = tune_tiny_lm(path, tuning, tune_config, out, tune_hash, entities)
    return path


def _layouts(value: str | Sequence[str], protocols: list[str] | None, field: str) -> list[str]:
    """generator.<field> as a list of layouts, each checked: a one-line error names a bad one."""
    layouts = [value] if isinstance(value, str) else list(value)
    for layout in layouts:
        base, named, protocol = layout.partition(":")
        if base not in READING_LAYOUTS or (named and base not in ("demos", "traces")):
            raise RagLabError(
                f"generator.{field}: {layout!r} is not one of {', '.join(READING_LAYOUTS)}"
                " (or demos:<protocol>, traces:<protocol>)"
            )
        if named and protocol not in PROTOCOLS:
            raise RagLabError(
                f"generator.{field}: {layout!r} names no protocol (known: {', '.join(sorted(PROTOCOLS))})"
            )
        if named and protocols is not None and protocol not in protocols:
            raise RagLabError(
                f"generator.{field}: {layout!r} names a protocol that generator.protocols"
                f" ({', '.join(protocols)}) leaves out"
            )
    return layouts


# What the model card copies from the trained model's directory (the rest of it is training scratch).
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "train.json", "tokenizer")


def ship(overrides: Sequence[str] = (), out: Path | None = None, scores: Path | None = None) -> Path:
    """``make tiny-lm``: train ``generator=tiny``'s recipe on the embedded world (``data=synth``; both
    with ``overrides``) and write the checkpoint that ``generator=tiny`` loads: the model, its tokenizer,
    ``recipe.json`` (the settings and the world's fingerprint) and a model card (``README.md``: recipe,
    hardware, time, and the table of ``scores``, a report.md, when given). The previous checkpoint is
    replaced only once the new one is complete."""
    import platform
    import subprocess

    import torch
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from rag_lab.config import compose
    from rag_lab.generators.tiny import SHIPPED, recipe_settings, world_fingerprint

    out = Path(out or SHIPPED)
    cfg = compose(["data=synth", "generator=tiny", *overrides])
    generator = OmegaConf.to_container(cfg.generator, resolve=True)
    recipe = {
        k: v
        for k, v in generator.items()
        if k not in ("_target_", "data", "cache_dir", "generate_batch_size", "seed")
    }
    settings = recipe_settings(recipe)
    data = instantiate(cfg.data)
    path = train(data, cfg.cache_dir, **settings)
    stats = json.loads((path / "train.json").read_text())
    seconds = stats.get("total_wall_s", stats["wall_s"])
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    )
    card = {
        "recipe": settings,
        "world": world_fingerprint(data),
        "data": OmegaConf.to_container(cfg.data, resolve=True),
        "trained": path.name,
        "train_time": f"{seconds / 60:.0f} min",
        "hardware": f"{_cpu_name() or platform.machine()}, {torch.get_num_threads()} threads, torch "
        f"{torch.__version__}",
        "commit": commit.stdout.strip() or None,
    }
    tmp = out.with_name(f".{out.name}.new")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in SHIPPED_FILES:
        source = path / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, tmp / name)
    (tmp / "recipe.json").write_text(json.dumps(card, indent=1, sort_keys=True) + "\n")
    (tmp / "README.md").write_text(model_card(card, stats, scores.read_text() if scores else None))
    old = out.with_name(f".{out.name}.old")
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    log.info("shipped %s (trained in %s) to %s", path.name, card["train_time"], out)
    return out


def _cpu_name() -> str | None:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


def model_card(card: dict, stats: dict, scores: str | None) -> str:
    """The shipped checkpoint's README: what it is, its recipe, where and how long it trained, scores."""
    settings = "\n".join(f"| `{k}` | `{json.dumps(v)}` |" for k, v in card["recipe"].items())
    parameters = stats.get("parameters")
    return f"""# The tiny LM (`generator=tiny`)

A Qwen2-style causal LM of {parameters:,} parameters, vocabulary {stats.get("vocab_size")}, trained from
scratch by `rag_lab.train.tiny_world.train` on the embedded world (`data=synth`, world fingerprint
`{card["world"]}`): a reading stage over renamed pages, SFT on the world teacher's demonstrations of every
protocol, then a protocol stage. `make tiny-lm` reproduces it; `experiments/results/tiny_lm.md` says
how the recipe was found.

- Trained on: {card["hardware"]}, in {card["train_time"]} (commit {card["commit"]}).
- Loaded by `generator=tiny` when the run's world and settings match `recipe.json`; otherwise the
  recipe trains a model for the run (cached) and the log says which fingerprint differs.

## Scores

{scores.strip() if scores else "(not measured)"}

## Recipe

| setting | value |
|---|---|
{settings}
"""


def main(argv: Sequence[str] | None = None) -> None:
    import argparse
    import sys

    from rag_lab.errors import one_line_errors

    parser = argparse.ArgumentParser(
        prog="python -m rag_lab.train.tiny_world",
        description="Train generator=tiny's recipe on the embedded world and ship the checkpoint "
        "(rag_lab/checkpoints/tiny_lm).",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. generator.reading_steps=3000")
    parser.add_argument("--out", type=Path, default=None, help="where to write it (default: the shipped one)")
    parser.add_argument("--scores", type=Path, default=None, help="a report.md whose table goes on the card")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with one_line_errors():
        print(ship(args.overrides, args.out, args.scores))


if __name__ == "__main__":
    main()
