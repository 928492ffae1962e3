"""The docs: every config key has help text (rag_lab/reporting/docs.py defines it), and the site builds with
``--strict`` (a broken link, a missing page, a results page not linked from results.md fail it)."""

import subprocess
from pathlib import Path

import pytest

from rag_lab.reporting import docs

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


def test_make_docs_names_materials_end_of_life():
    done = subprocess.run(["make", "-n", "docs"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "Material for MkDocs reaches end of life on 2027-05-05; its successor is Zensical" in done.stdout
