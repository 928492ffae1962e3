"""Evidence as a controlled variable (rag_lab/data/evidence.py): what the index holds of the corpus, set by
``corpus.coverage`` and ``corpus.distractors``, with the world, its questions and the LM unchanged."""

import hashlib
import json
import re
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rag_lab.data.evidence import Evidence, distractors, index_corpus, kept, reachable
from rag_lab.eval.provenance import row_hash
from rag_lab.train.tiny.generator import world_fingerprint

from conftest import TINY_DATA, cli, compose


def files_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()


def test_the_knobs_leave_the_world_and_the_lm_unchanged_and_key_their_own_index(tmp_path, capfd, monkeypatch):
    cache = tmp_path / "cache"
    base = ["policy=standard_rag", "generator=tiny", "eval.limit=4", f"cache_dir={cache}"]
    settings = {
        "whole": [],
        "knobs": ["corpus.coverage=0.6", "corpus.distractors=2"],
        "other": ["corpus.coverage=0.8", "corpus.seed=1"],
        **{name: [f"retriever={name}"] for name in ("random", "empty", "oracle")},
    }
    seen = {}
    for name, knobs in settings.items():
        rc, out = cli("run", [*base, *knobs, f"hydra.run.dir={tmp_path / name}"], capfd, monkeypatch)
        assert rc == 0, out
        (world,) = (cache / "synth").iterdir()  # one world, whatever the knobs
        data = instantiate(compose([*base, *knobs]).data)
        prov = json.loads((tmp_path / name / "provenance.json").read_text())
        seen[name] = (files_digest(world), world_fingerprint(data), prov["lm"])
    assert len(set(seen.values())) == 1, seen
    # each corpus setting its own index (the oracle's BM25 is the whole corpus's; random and empty build none)
    assert len(list((cache / "index" / "bm25").iterdir())) == 3
    metrics = json.loads((tmp_path / "knobs" / "metrics.json").read_text())
    assert (
        metrics["all"]["reachable"]
        < 1.0
        == json.loads((tmp_path / "whole" / "metrics.json").read_text())["all"]["reachable"]
    )


def test_a_knob_at_its_default_changes_no_row_hash():
    cfg = compose(["experiment=compare_synth", "experiment/compare_synth=stoprag"])
    assert "corpus" in cfg
    without = OmegaConf.create(OmegaConf.to_container(cfg))
    del without["corpus"]
    assert row_hash(cfg) == row_hash(without)
    assert row_hash(compose(["corpus.coverage=0.8"])) != row_hash(compose([]))


def test_coverage_keeps_its_share_of_pages_nested_and_drops_their_questions(data):
    ids = data.corpus.ids
    kept_at = {c: {pid for pid in ids if kept(pid, c, 0)} for c in (1.0, 0.8, 0.6)}
    assert kept_at[1.0] == set(ids)
    assert kept_at[0.6] < kept_at[0.8] < kept_at[1.0]  # nested levels
    for c in (0.8, 0.6):
        assert abs(len(kept_at[c]) / len(ids) - c) < 0.08
    assert {pid for pid in ids if kept(pid, 0.6, 1)} != kept_at[0.6]  # corpus.seed draws another set
    corpus = index_corpus(data, Evidence(coverage=0.6))
    assert set(corpus.ids) == kept_at[0.6] and index_corpus(data, Evidence()) is data.corpus
    questions = data.split("test")
    for ex in questions:
        expected = ex.answerable and all(pid in kept_at[0.6] for pid in ex.supporting_ids)
        assert reachable(ex, corpus) is expected
        assert reachable(ex, data.corpus) is ex.answerable
    share = sum(reachable(ex, corpus) for ex in questions) / len(questions)
    assert 0 < share < 0.8


def test_a_distractor_restates_its_page_with_every_fact_in_conflict(data):
    pages = dict(zip(data.corpus.ids, zip(data.corpus.titles, data.corpus.texts, strict=True), strict=True))
    made = distractors(data, 2, seed=0)
    assert len(made) == 2 * len(pages) and len({pid for pid, _, _ in made}) == len(made)
    by_title = {title: text for title, text in pages.values()}
    for pid, title, text in made:
        original = by_title[title]
        assert pid not in pages and text != original
        # the same sentences (a near-duplicate), each fact's value another
        assert len(re.findall(r"\.(?:\s|$)", text)) == len(re.findall(r"\.(?:\s|$)", original))
    person = next(t for t, x in pages.values() if " was born " in x or "native of" in x)
    original, copies = by_title[person], [x for _, t, x in made if t == person]
    assert len(copies) == 2 and copies[0] != copies[1]
    birthplace = re.search(r"(?:born in (?:the city of )?|native of )([A-Z]\w+)", original).group(1)
    assert all(birthplace not in copy for copy in copies)
    corpus = index_corpus(data, Evidence(distractors=2))
    assert len(corpus) == 3 * len(pages) and corpus.fingerprint != data.corpus.fingerprint
    assert distractors(data, 2, seed=0) == made  # the same numbers from the same settings


@pytest.mark.parametrize("coverage", [0.6])
def test_every_question_keeps_its_gold_ids_under_the_knobs(data, coverage):
    """The questions (and their gold) are the data's: the knobs change the index only."""
    before = [ex.supporting_ids for ex in data.split("test")]
    index_corpus(data, Evidence(coverage=coverage, distractors=1))
    assert [ex.supporting_ids for ex in data.split("test")] == before


def test_the_index_and_serve_commands_build_the_runs_index():
    """``rag_lab.serve`` (a node's retrieval server) and ``rag_lab.index`` build the index a run with the same
    ``corpus.*`` searches: a client's corpus check passes only on the same fingerprint."""
    from rag_lab.serve import retrieval

    knobs = [*TINY_DATA, "corpus.coverage=0.6", "corpus.distractors=1"]
    cfg = compose(knobs)
    expected = index_corpus(instantiate(cfg.data), Evidence(**cfg.corpus))
    _, info = retrieval(compose([*knobs, "retriever=bm25"], config_name="serve"))
    assert (info["corpus"], info["passages"]) == (expected.fingerprint, len(expected))
