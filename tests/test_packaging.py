"""pyproject.toml's dependencies and extras, the optional modules' one-line errors, and what a wheel holds."""

import ast
import re
import subprocess
import sys
import tomllib
import zipfile
from importlib import import_module

import pytest

from rag_lab import CONF_DIR
from rag_lab.core.cache import PACKAGE_DIR
from rag_lab.core.extras import EXTRAS

from conftest import TINY_DATA, cli

ROOT = PACKAGE_DIR.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def name(requirement: str) -> str:
    """A requirement's distribution name, normalised as pip compares them (PEP 503).

    >>> name("PyStemmer>=2.2"), name("mkdocstrings[python]==1.0.8"), name("faiss_gpu.cu12")
    ('pystemmer', 'mkdocstrings', 'faiss-gpu-cu12')
    """
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement)[0]).lower()


def test_no_package_is_named_twice():
    extras = PROJECT["optional-dependencies"]
    named = [name(r) for r in PROJECT["dependencies"]]
    for requirements in extras.values():
        # an extra that names others of this project (dev: rag_lab[launchers,wandb]) names no package
        named += [name(r) for r in requirements if name(r) != name(PROJECT["name"])]
    assert sorted({n for n in named if named.count(n) > 1}) == []


def test_gpu_holds_faiss_gpu_alone_and_wandb_is_an_extra():
    base = {name(r) for r in PROJECT["dependencies"]}
    extras = {
        extra: {name(r) for r in requirements}
        for extra, requirements in PROJECT["optional-dependencies"].items()
    }
    assert "faiss-cpu" not in extras["gpu"] and {n for n in extras["gpu"] if n.startswith("faiss")} == {
        "faiss-gpu-cu12"
    }
    assert not {n for n in base if n.startswith("faiss")} and "wandb" not in base
    # each optional module's error names extras that exist and install it
    for module, hint in EXTRAS.items():
        named = re.findall(r"rag_lab\[(\w+)\]", hint)
        assert named and all(any(n.startswith(module) for n in extras[extra]) for extra in named), (
            module,
            hint,
        )


def test_rag_lab_is_a_console_script():
    module, function = PROJECT["scripts"]["rag-lab"].split(":")
    assert callable(getattr(import_module(module), function))


def test_every_faiss_import_names_its_extras():
    """No bare ``import faiss`` in the package: each site asks ``rag_lab.retrievers.dense.import_faiss``."""
    bare = []
    for file in sorted(PACKAGE_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if "faiss" in names or (
                isinstance(node, ast.ImportFrom) and (node.module or "").startswith("faiss")
            ):
                bare.append(f"{file.relative_to(ROOT)}:{node.lineno}")
    assert bare == []


RUN = [*TINY_DATA, "generator=teacher", "policy=standard_rag", "eval.limit=2"]


@pytest.mark.parametrize(
    "module, override, message",
    [
        (
            "wandb",
            "logger=wandb",
            "logger=wandb needs wandb, which is not installed here: pip install 'rag_lab[wandb]'",
        ),
        (
            "faiss",
            "retriever=minilm",
            "retriever: a dense index needs faiss, which is not installed here: pip install 'rag_lab[cpu]' "
            "(or 'rag_lab[gpu]' on a GPU machine)",
        ),
    ],
)
def test_a_missing_optional_module_is_one_line_before_the_run(
    module, override, message, tmp_path, capfd, monkeypatch
):
    """``python -m rag_lab.run`` with the module unimportable: the setting's one line at compose time, before
    the run dir is written (nothing built, nothing trained)."""
    monkeypatch.setitem(sys.modules, module, None)
    rc, out = cli("run", [*RUN, override, f"hydra.run.dir={tmp_path}/run"], capfd, monkeypatch)
    assert rc == 1 and out.strip().splitlines()[-1] == f"error: {message}"
    assert "Traceback" not in out and not (tmp_path / "run" / "config.yaml").exists()


def test_the_package_reaches_the_config_tree_through_its_link():
    assert (PACKAGE_DIR / "conf").is_symlink() and CONF_DIR == (ROOT / "conf").resolve()
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "rag_lab"
    ]
    shipped = {p for pattern in patterns if pattern.startswith("conf/") for p in PACKAGE_DIR.glob(pattern)}
    assert {p.relative_to(CONF_DIR) for p in CONF_DIR.rglob("*.yaml")} == {
        p.relative_to(PACKAGE_DIR / "conf") for p in shipped
    }


@pytest.mark.slow
def test_a_wheel_holds_the_config_tree_and_the_script(tmp_path):
    """``pip wheel`` (no build isolation: the environment's setuptools, offline) of a copy of the sources."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "rag_lab", src / "rag_lab", symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(ROOT / "conf", src / "conf")
    for file in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / file, src / file)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("rag_lab-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        scripts = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert {f"rag_lab/conf/{p.relative_to(CONF_DIR)}" for p in CONF_DIR.rglob("*.yaml")} <= names
    assert "rag-lab = rag_lab.__main__:main" in scripts
