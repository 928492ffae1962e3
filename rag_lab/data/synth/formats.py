"""The generated world's questions written in the real benchmarks' on-disk formats.

Each writer takes one generated question (``world.make_questions``) and returns one row of the
format, so that the format's own loader reads back the same ``QAExample``.
"""

import random

from rag_lab.data.contexts import passage_id

# Distractor paragraphs per MuSiQue row (real MuSiQue rows carry 20 paragraphs in all).
MUSIQUE_DISTRACTORS = 6


def flashrag(qid: str, q: dict, title_to_id: dict[str, str]) -> dict:
    """FlashRAG jsonl: ``id, question, golden_answers, metadata`` (supports + decomposition in metadata)."""
    decomposition = [
        {"question": d["question"], "answer": d["answer"], "support_id": title_to_id.get(d["title"])}
        for d in q["decomposition"]
    ]
    supports = {
        title_to_id[t]: t for t in dict.fromkeys(d["title"] for d in q["decomposition"]) if t in title_to_id
    }
    meta = {"type": q["type"], "hops": q["hops"], "answerable": q["answerable"]}
    meta |= {"supporting_ids": list(supports), "supporting_titles": list(supports.values())}
    meta["decomposition"] = decomposition
    return {
        "id": qid,
        "question": q["question"],
        "golden_answers": [q["answer"], *q["aliases"]],
        "metadata": meta,
    }


def musique(
    qid: str, q: dict, passages: dict[str, tuple[str, str]], title_to_id: dict[str, str], rng: random.Random
) -> dict:
    """MuSiQue jsonl: supporting paragraphs (in hop order) among random distractors.

    A withheld support (an unanswerable question) is absent from ``paragraphs``, as in
    MuSiQue-Full's unanswerable rows; its step's ``paragraph_support_idx`` is null.
    """
    support_ids = list(
        dict.fromkeys(title_to_id[d["title"]] for d in q["decomposition"] if d["title"] in title_to_id)
    )
    pool = [pid for pid in passages if pid not in support_ids]
    chosen = rng.sample(pool, min(MUSIQUE_DISTRACTORS, len(pool)))
    # Distractors go at random positions; supports keep their hop order.
    order = support_ids + chosen
    slots = sorted(rng.sample(range(len(order)), len(support_ids)))
    layout: list[str | None] = [None] * len(order)
    for slot, pid in zip(slots, support_ids, strict=True):
        layout[slot] = pid
    rest = iter(chosen)
    layout = [pid if pid is not None else next(rest) for pid in layout]
    idx_of = {pid: i for i, pid in enumerate(layout)}
    paragraphs = [
        {
            "idx": i,
            "title": passages[pid][0],
            "paragraph_text": passages[pid][1],
            "is_supporting": pid in support_ids,
        }
        for i, pid in enumerate(layout)
    ]
    decomposition = [
        {
            "id": n,
            "question": d["question"],
            "answer": d["answer"],
            "paragraph_support_idx": idx_of.get(title_to_id.get(d["title"])),
        }
        for n, d in enumerate(q["decomposition"])
    ]
    return {
        "id": qid,
        "type": q["type"],
        "paragraphs": paragraphs,
        "question": q["question"],
        "question_decomposition": decomposition,
        "answer": q["answer"],
        "answer_aliases": q["aliases"],
        "answerable": q["answerable"],
    }


def _sentences(text: str) -> list[str]:
    """Split a passage into HotpotQA-style sentences that join back to the exact text."""
    parts = text.split(". ")
    return [p + ". " for p in parts[:-1]] + [parts[-1]]


def hotpotqa(musique_row: dict, q: dict) -> dict:
    """HotpotQA json item (``_id, question, answer, type, context, supporting_facts``) built from
    the question's MuSiQue row, so the formats share one context set. HotpotQA has no aliases."""
    context = [[p["title"], _sentences(p["paragraph_text"])] for p in musique_row["paragraphs"]]
    facts = [[p["title"], 0] for p in musique_row["paragraphs"] if p["is_supporting"]]
    return {
        "_id": musique_row["id"],
        "question": q["question"],
        "answer": q["answer"],
        "type": q["type"],
        "level": "synthetic",
        "context": context,
        "supporting_facts": facts,
    }


def answer_qid(answer: str) -> str:
    """A Wikidata-like id for an answer string (2Wiki's ``answer_id``)."""
    return "Q" + passage_id("answer", answer)


def two_wiki(musique_row: dict, q: dict) -> dict:
    """2Wiki json item: HotpotQA's fields plus ``evidences`` triples and the answer's ``answer_id``."""
    item = hotpotqa(musique_row, q)
    item["evidences"] = [[d["title"], d["question"], d["answer"]] for d in q["decomposition"]]
    item["answer_id"] = answer_qid(q["answer"])
    return item


def two_wiki_aliases(questions: list[dict]) -> list[dict]:
    """``id_aliases.json`` rows (``Q_id, aliases, demonyms``) for every answer that has aliases."""
    rows = {answer_qid(q["answer"]): q["aliases"] for q in questions if q["aliases"]}
    return [{"Q_id": qid, "aliases": aliases, "demonyms": []} for qid, aliases in rows.items()]
