"""Questions over the generated world, of every kind the real benchmarks have.

- ``single_hop``: one fact ("Where was X born?").
- ``compositional`` (2Wiki / HotpotQA bridge): a 2-relation chain ("Where was the director of F born?").
- ``inference`` (2Wiki): kinship composed from two facts ("Who is the maternal grandfather of X?").
- ``comparison`` (2Wiki / HotpotQA): two entities, one attribute each ("Who was born first, A or B?",
  "Are A and B from the same country?" with yes / no answers).
- ``bridge_comparison`` (2Wiki): a comparison through a bridge ("Which film has the director born
  first, F1 or F2?"), four hops.
- ``3hop`` / ``4hop`` (MuSiQue): longer chains.

Every question carries its gold decomposition: ordered sub-questions in which later ones
reference earlier answers as ``#1``, ``#2``, each with its answer and the title of the passage
that states it. A question is unanswerable when any of those passages is withheld.
"""

import random
from collections.abc import Iterator

from rag_lab.data.synth.world import RELATIONS, Entity, World, date_alias

# (first relation, second relation) -> the kinship term of the composed relation.
KINSHIP = {
    ("mother", "father"): "maternal grandfather",
    ("mother", "mother"): "maternal grandmother",
    ("father", "father"): "paternal grandfather",
    ("father", "mother"): "paternal grandmother",
    ("spouse", "father"): "father-in-law",
    ("spouse", "mother"): "mother-in-law",
}
DATE_RELATIONS = {"birth_date", "death_date"}
# Which-came-first comparisons: kind -> (order key, question, sub-question relation).
FIRST = {
    "person": [
        ("birth_date", "Who was born first, {a} or {b}?"),
        ("death_date", "Who died first, {a} or {b}?"),
    ],
    "film": [("release_year", "Which film came out first, {a} or {b}?")],
    "company": [("founded_year", "Which company was founded first, {a} or {b}?")],
}


def paths(w: World, start: Entity, max_hops: int) -> Iterator[list[str]]:
    """Relation paths from ``start`` that never revisit an entity (no spouse-of-spouse loops)."""

    def walk(entity: Entity, path: list[str], seen: set[str]) -> Iterator[list[str]]:
        for name, rel in RELATIONS.items():
            if rel.domain != entity.kind or name not in entity.facts:
                continue
            value = entity.facts[name]
            if rel.target is None:
                yield [*path, name]
            elif value not in seen:
                yield [*path, name]
                if len(path) + 1 < max_hops:
                    yield from walk(w.entities[value], [*path, name], seen | {value})

    yield from walk(start, [], {start.name})


def chain_question(w: World, start: Entity, rels: list[str]) -> dict:
    """The question, answer and decomposition of a relation chain."""
    steps, entity, phrase = [], start, start.name
    for i, name in enumerate(rels):
        rel = RELATIONS[name]
        value = entity.facts[name]
        steps.append((rel.question.format(x=start.name if i == 0 else f"#{i}"), value, entity.name))
        if i < len(rels) - 1:
            phrase = rel.phrase.format(x=phrase)
            entity = w.entities[value]
    kin = KINSHIP.get(tuple(rels))
    if kin:
        kind, question = "inference", f"Who is the {kin} of {start.name}?"
    else:
        kind = {1: "single_hop", 2: "compositional"}.get(len(rels), f"{len(rels)}hop")
        question = RELATIONS[rels[-1]].question.format(x=phrase)
    aliases = [date_alias(steps[-1][1])] if rels[-1] in DATE_RELATIONS else []
    return _question(w, kind, question, steps[-1][1], steps, aliases)


def _question(w: World, kind: str, question: str, answer: str, steps: list[tuple], aliases=()) -> dict:
    return {
        "type": kind,
        "question": question,
        "answer": answer,
        "aliases": list(aliases),
        "hops": len(steps),
        "answerable": not any(title in w.withheld for _, _, title in steps),
        "decomposition": [{"question": q, "answer": a, "title": t} for q, a, t in steps],
    }


def comparisons(rng: random.Random, w: World, n: int) -> Iterator[dict]:
    people = w.of_kind("person")
    for kind, options in FIRST.items():
        pool = w.of_kind(kind)
        for _ in range(n // len(FIRST)):
            key, template = rng.choice(options)
            a, b = rng.sample(pool, 2)
            if key not in a.order or key not in b.order or a.order[key] == b.order[key]:
                continue
            first = a if a.order[key] < b.order[key] else b
            ask = RELATIONS[key].question
            steps = [
                (ask.format(x=a.name), a.facts[key], a.name),
                (ask.format(x=b.name), b.facts[key], b.name),
            ]
            yield _question(w, "comparison", template.format(a=a.name, b=b.name), first.name, steps)
    for i in range(n // len(FIRST)):
        a = rng.choice(people)
        same = [p for p in people if p is not a and p.facts["nationality"] == a.facts["nationality"]]
        b = rng.choice(same) if same and i % 2 == 0 else rng.choice([p for p in people if p is not a])
        ask = RELATIONS["nationality"].question
        steps = [
            (ask.format(x=a.name), a.facts["nationality"], a.name),
            (ask.format(x=b.name), b.facts["nationality"], b.name),
        ]
        answer = "yes" if a.facts["nationality"] == b.facts["nationality"] else "no"
        yield _question(w, "comparison", f"Are {a.name} and {b.name} from the same country?", answer, steps)


def bridge_comparisons(rng: random.Random, w: World, n: int) -> Iterator[dict]:
    films = w.of_kind("film")
    for i in range(n):
        f1, f2 = rng.sample(films, 2)
        d1, d2 = (w.entities[f.facts["director"]] for f in (f1, f2))
        if d1 is d2:
            continue
        bridge = [
            (f"Who directed {f1.name}?", d1.name, f1.name),
            (f"Who directed {f2.name}?", d2.name, f2.name),
        ]
        if i % 2 == 0:
            if d1.order["birth_date"] == d2.order["birth_date"]:
                continue
            steps = [
                *bridge,
                ("When was #1 born?", d1.facts["birth_date"], d1.name),
                ("When was #2 born?", d2.facts["birth_date"], d2.name),
            ]
            answer = f1.name if d1.order["birth_date"] < d2.order["birth_date"] else f2.name
            question = f"Which film has the director who was born first, {f1.name} or {f2.name}?"
        else:
            steps = [
                *bridge,
                ("What is the nationality of #1?", d1.facts["nationality"], d1.name),
                ("What is the nationality of #2?", d2.facts["nationality"], d2.name),
            ]
            answer = "yes" if d1.facts["nationality"] == d2.facts["nationality"] else "no"
            question = f"Are the directors of {f1.name} and {f2.name} from the same country?"
        yield _question(w, "bridge_comparison", question, answer, steps)


def make_questions(rng: random.Random, w: World, max_hops: int = 4) -> list[dict]:
    """Per entity, one chain question of each length it has (1..max_hops, single-hop half the
    time), plus comparisons and bridge comparisons; de-duplicated by question text."""
    out: list[dict] = []
    for entity in w.entities.values():
        by_length: dict[int, list[list[str]]] = {}
        for path in paths(w, entity, max_hops):
            by_length.setdefault(len(path), []).append(path)
        for length, options in sorted(by_length.items()):
            if length == 1 and rng.random() < 0.5:
                continue
            out.append(chain_question(w, entity, rng.choice(options)))
        kin = [p for p in by_length.get(2, []) if tuple(p) in KINSHIP]
        if kin:
            out.append(chain_question(w, entity, rng.choice(kin)))
    n_people = len(w.of_kind("person"))
    out += comparisons(rng, w, n_people)
    out += bridge_comparisons(rng, w, len(w.of_kind("film")))
    seen: set[str] = set()
    return [q for q in out if not (q["question"] in seen or seen.add(q["question"]))]


def judge_questions(
    rng: random.Random, w: World, max_hops: int, taken: set[str], like: list[dict], n: int, rounds: int = 8
) -> list[dict]:
    """``n`` questions of ``w`` that no other split holds (their text is not in ``taken``): the claims' judge
    split (``data.judge_size``). Drawn from ``rounds`` further passes of :func:`make_questions` (each picks
    other relation paths, pairs and films), in the type mix of ``like`` (the test split) as far as the new
    questions of each type reach; a type that runs short is filled from the others."""
    pool: dict[str, list[dict]] = {}
    seen = set(taken)
    for _ in range(rounds):
        for q in make_questions(rng, w, max_hops):
            if q["question"] not in seen:
                seen.add(q["question"])
                pool.setdefault(q["type"], []).append(q)
    counts: dict[str, int] = {}
    for q in like:
        counts[q["type"]] = counts.get(q["type"], 0) + 1
    # each type's share of n, by largest remainder (ties by type name: no float near-tie decides a split)
    exact = {kind: n * c / max(len(like), 1) for kind, c in counts.items()}
    quota = {kind: int(x) for kind, x in exact.items()}
    for kind in sorted(exact, key=lambda k: (quota[k] - exact[k], k))[: n - sum(quota.values())]:
        quota[kind] += 1
    out, rest = [], []
    for kind in sorted(pool):
        options = pool[kind]
        rng.shuffle(options)
        take = quota.get(kind, 0)
        out += options[:take]
        rest += options[take:]
    rng.shuffle(rest)
    out += rest[: n - len(out)]
    rng.shuffle(out)
    return out
