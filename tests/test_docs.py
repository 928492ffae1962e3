"""The docs: every config key has help text (rag_lab/reporting/docs.py defines it), and the site builds with
``--strict`` (a broken link, a missing page, a results page not linked from results.md fail it)."""

import subprocess
from pathlib import Path

import pytest

from rag_lab.reporting import docs

from conftest import logged_metrics, undocumented_metrics

ROOT = Path(__file__).resolve().parents[1]


def test_every_config_key_has_help():
    missing = docs.keys_without_help()
    assert not missing, (
        f"{len(missing)} config keys have no help text (a comment above the key or its run of keys, in the "
        "yaml or at the parameter's declaration; rag_lab/reporting/docs.py):\n" + "\n".join(missing)
    )


def test_help_is_the_comment_heading_the_run():
    lines = ["# a and b", "a: 1", "b: 2", "", "c: 3", "# d", "d: 4  # d's own"]
    assert docs.comment_help(lines) == {1: "a and b", 2: "a and b", 6: "d's own"}
    # read as a nested block, the first comment is a key's; as a whole file, it describes the option
    assert docs.yaml_help("\n".join(lines), file=False) == {"a": "a and b", "b": "a and b", "d": "d's own"}
    assert docs.yaml_help("\n".join(lines)) == {"d": "d's own"}


def test_a_files_opening_comment_is_no_keys_help():
    """The option's description above its first key does not document that key's run; a key's own comment,
    trailing or heading a later run, still does."""
    text = "# BM25 over the corpus.\n# Two lines.\n_target_: x.Y\nk1: 1.5  # saturation\nb: 0.75\n# c\nc: 1\n"
    assert docs.yaml_help(text) == {"k1": "saturation", "c": "c"}


def test_site_builds_strict(tmp_path, monkeypatch):
    """mkdocs build --strict, in this process (the package is imported once for the suite)."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    monkeypatch.chdir(ROOT)
    config = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path / "site"), strict=True)
    build(config)
    assert (tmp_path / "site" / "reference" / "config" / "policy" / "index.html").exists()
    assert (tmp_path / "site" / "notebooks" / "stoprag.ipynb").exists()


@pytest.mark.parametrize("group", ["policy", "retriever"])
def test_reference_lists_a_key_with_its_range(group):
    keys = {k.name: k for k in docs.option_keys(group, "stoprag" if group == "policy" else "bm25")}
    assert group != "policy" or (keys["top_p"].valid == "in (0, 1]" and keys["k"].default == 1)
    assert group != "retriever" or keys["k1"].default == 1.5


# Issue 73's acceptance search: a citation of the maintainers' private notes (their method checklist and their
# copies of the papers), which a reader of the repo cannot open. Papers are cited by arXiv id (or OpenReview)
# with a section, equation or table, and each method by its page, docs/methods/<method>.md. (The strings are
# built in two pieces so that this file does not match its own search.)
PRIVATE = ("METHODS" + ".md", "papers" + "/")
SEARCHED = ("rag_lab", "conf", "docs", "notebooks", "experiments", "tests", "README.md", "Makefile")


def test_no_citation_points_at_a_file_the_repo_does_not_hold():
    hits = []
    for name in SEARCHED:
        top = ROOT / name
        for path in [top] if top.is_file() else sorted(top.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            for n, line in enumerate(path.read_bytes().splitlines(), 1):
                if any(s.encode() in line for s in PRIVATE):
                    hits.append(
                        f"{path.relative_to(ROOT)}:{n}: {line.decode(errors='replace').strip()[:100]}"
                    )
    why = "cite the paper by arXiv id and section, and the method by docs/methods/<method>.md"
    assert not hits, why + ":\n" + "\n".join(hits)


METHODS = ("stoprag", "dapo", "evorag", "r3rag", "apex")


@pytest.mark.parametrize("method", METHODS)
def test_each_method_page_documents_the_keys_its_curves_plot(method):
    """Every key of the method's curves.png panels (``PANELS``: what ``write_curves`` plots) is in the page's
    "Logged metrics" section; every key a training run logs is checked in the tiny runs that write them
    (``undocumented_metrics`` in test_stoprag, test_dapo, test_evorag, test_r3rag, test_apex)."""
    import importlib

    page = (ROOT / "docs" / "methods" / f"{method}.md").read_text()
    assert len(logged_metrics(page)) >= 5, f"docs/methods/{method}.md: no Logged metrics table"
    module = "rag_lab.policies.dapo.trainer" if method == "dapo" else f"rag_lab.policies.{method}.policy"
    panels = getattr(importlib.import_module(module), "PANELS", [])
    plotted = [{key: 0.0 for _, keys in panels for key in keys}]
    assert not undocumented_metrics(method, plotted), f"docs/methods/{method}.md misses plotted keys"


def test_a_logged_key_missing_from_its_page_is_named():
    """The check itself: with one key's row taken out of the page, a log holding that key fails it; a
    ``<name>`` pattern matches one path segment, no more."""
    page = (ROOT / "docs" / "methods" / "r3rag.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `clip_fraction`"))
    rows = [{"step": 1, "clip_fraction": 0.1, "kl": 0.01}]
    assert undocumented_metrics("r3rag", rows, page) == []
    assert undocumented_metrics("r3rag", rows, page.replace(row + "\n", "")) == ["clip_fraction"]
    dapo = (ROOT / "docs" / "methods" / "dapo.md").read_text()
    named = [{"rewards/search/mean": 0.0, "rewards/a/b/mean": 0.0}]
    assert undocumented_metrics("dapo", named, dapo) == ["rewards/a/b/mean"]


def test_make_docs_names_materials_end_of_life():
    done = subprocess.run(["make", "-n", "docs"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "Material for MkDocs reaches end of life on 2027-05-05; its successor is Zensical" in done.stdout
