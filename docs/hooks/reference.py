"""The docs site's build hook (mkdocs.yml ``hooks:``): the pages generated from the code, and the files
outside ``docs/`` that the site shows.

- ``reference/config/``: every config group, each option with its keys, defaults, valid values and help
  text, read by the package's docs module (``rag_lab`` … ``docs.py``: :func:`option_keys`,
  :func:`schema_keys`); ``reference/cli.md``: every command (a module with a ``__main__`` block, found by
  walking the package) with its ``--help``, and the Makefile's targets; ``reference/api/``: one page per
  package, every module of it rendered by mkdocstrings from its docstrings. The pages exist only in the
  build (nothing to go stale on disk); the nav's "Reference" section lists them.
- ``experiments/results/*`` and ``notebooks/*.ipynb`` are served at those same paths (a docs page links
  ``experiments/results/x.md`` relative to itself, e.g. ``../experiments/results/x.md`` from
  ``docs/methods/``); ``results.md`` must link every results page and notebook, or the build warns (and
  ``--strict`` fails).

The package is found by walking it, so a module that moves is followed.
"""

import contextlib
import importlib
import inspect
import io
import logging
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from mkdocs.structure.files import File

import rag_lab

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(rag_lab.__file__).parent
log = logging.getLogger("mkdocs.hooks.reference")
PAGES: dict[str, str] = {}
OUTSIDE = ["experiments/results/*", "notebooks/*.ipynb"]


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _docs_module():
    """The package's docs module (rag_lab/reporting/docs.py, wherever the package keeps it)."""
    [path] = [p for p in PACKAGE.rglob("docs.py")]
    return importlib.import_module(_module(path))


D = _docs_module()


def _escape(text: str) -> str:
    """Markdown table-cell text: pipes, stars and angle brackets escaped outside `code` spans."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = (
            parts[i].replace("\\", "\\\\").replace("*", "\\*").replace("<", "&lt;").replace(">", "&gt;")
        )
    return "`".join(parts).replace("|", "\\|")


def _value(value: Any) -> str:
    """A default as the yaml would write it, in a code span."""
    text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True, width=10**6)
    text = text.removesuffix("\n...\n").strip()
    return f"`{text}`" if text else "`''`"


def keys_table(keys: list) -> str:
    rows = ["| key | default | type | valid | help |", "| --- | --- | --- | --- | --- |"]
    for k in keys:
        help_text = _escape(k.help) if k.help else "—"
        cells = [f"`{k.name}`", _escape(_value(k.default)), _escape(k.type), _escape(k.valid), help_text]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def header(text: str) -> str:
    """A yaml's leading comment block as markdown: prose lines joined, indented lines (commands) as code."""
    prose, code, out = [], [], []
    for line in text.splitlines():
        if not line.startswith("#") or line.startswith("# @package"):
            if not line.startswith("# @package"):
                break
            continue
        body = line[1:]
        if body.startswith("   "):
            code.append(body[3:])
            continue
        if code:
            out += [" ".join(prose), "```bash\n" + "\n".join(code) + "\n```"]
            prose, code = [], []
        prose.append(body.strip())
    out += [" ".join(prose)] + (["```bash\n" + "\n".join(code) + "\n```"] if code else [])
    return "\n\n".join(_escape(p) if not p.startswith("```") else p for p in out if p) + "\n"


def group_page(group: str) -> str:
    """One component group: each option's header comment, target and keys."""
    chosen = D.defaults().get(group, "(none: +{group}=<option>)")
    out = [
        f"# `{group}`\n",
        f"`conf/{group}/<option>.yaml`, chosen with `{group}=<option>` (default: `{chosen}`).\n",
    ]
    for option in D.group_options(group):
        text = (D.CONF_DIR / group / f"{option}.yaml").read_text()
        target = (yaml.safe_load(text) or {}).get("_target_")
        out.append(f"## `{group}={option}`\n\n{header(text)}")
        out.append(f"Builds `{target}`.\n" if target else "")
        out.append(keys_table(D.option_keys(group, option)))
    return "\n".join(out)


def experiment_page() -> str:
    flat_keys = D.flat_keys

    out = [
        "# `experiment`\n",
        "Deltas over the default config (`# @package _global_`): run one with "
        "`python -m rag_lab.run experiment=<name>`; an experiment with rows runs them as a sweep "
        "(`-m`, `experiment/<name>=<row>,...`).\n",
    ]
    for option in D.group_options("experiment"):
        text = (D.CONF_DIR / "experiment" / f"{option}.yaml").read_text()
        node = yaml.safe_load(text) or {}
        picks = [f"`{k}={v}`" for d in node.get("defaults", []) if isinstance(d, dict) for k, v in d.items()]
        out.append(
            f"## `{option}`\n\n{header(text)}\n```bash\npython -m rag_lab.run experiment={option}\n```\n"
        )
        out.append(f"Groups: {', '.join(picks)}.\n" if picks else "")
        out.append(
            f"Sets: {', '.join(f'`{k}`' for k in sorted(flat_keys(node)))}.\n" if flat_keys(node) else ""
        )
        if (D.CONF_DIR / "experiment" / option).is_dir():
            rows = ", ".join(f"`{r}`" for r in D.group_options(f"experiment/{option}"))
            out.append(f"Rows (`experiment/{option}=<row>`): {rows}.\n")
    return "\n".join(out)


def launcher_page() -> str:
    """``hydra/launcher``: the keys of Hydra's launcher plugins as rag_lab's yaml set them."""
    out = ["# `hydra/launcher`\n", "Where a sweep's jobs run (`-m hydra/launcher=<option>`).\n"]
    for option in D.group_options("hydra/launcher"):
        text = (D.CONF_DIR / "hydra" / "launcher" / f"{option}.yaml").read_text()
        keys = D.target_keys(yaml.safe_load(text) or {}, text)
        out.append(f"## `hydra/launcher={option}`\n\n{header(text)}\n{keys_table(keys)}")
    return "\n".join(out)


def config_pages() -> dict[str, str]:
    """The config reference, paths relative to the reference folder: ``config/index.md`` (the top-level
    configs and the groups) and one page per group."""
    pages = {
        f"config/{g}.md": experiment_page() if g == "experiment" else group_page(g)
        for g in D.component_groups()
    }
    pages["config/hydra-launcher.md"] = launcher_page()
    out = [
        "# Configuration\n",
        "Every run composes `conf/config.yaml`: one option of each group below, then the command line's "
        "overrides (`group=option`, `key=value`). These pages are generated from the config tree and the "
        "code's signatures (`make docs`), so they list what the code accepts.\n",
        "## Groups\n",
        D.config_groups_table(),
        *[f"- [`{p[7:-3]}`]({p[7:]})" for p in sorted(pages)],
        "",
    ]
    for name, schema in D.TOP_LEVEL.items():
        text = (D.CONF_DIR / f"{name}.yaml").read_text()
        out.append(f"## `conf/{name}.yaml`\n\n{keys_table(D.schema_keys(schema, text))}")
    return {"config/index.md": "\n".join(out), **pages}


def _main_modules() -> list[Path]:
    """The package's command modules: those with a ``__main__`` block, the top level's first."""
    found = [p for p in PACKAGE.rglob("*.py") if 'if __name__ == "__main__":' in p.read_text()]
    return sorted(found, key=lambda p: (len(p.relative_to(PACKAGE).parts), str(p)))


def _help(path: Path) -> str | None:
    """A command's ``--help``: Hydra's apps in a process of their own (Hydra finds its config from the
    main module), ``main(argv)`` in this one; None for a main that takes no argv (an internal command)."""
    name, source = _module(path), path.read_text()
    if "@hydra.main" in source:
        done = subprocess.run(
            [sys.executable, "-m", name, "--help"], capture_output=True, text=True, check=True
        )
        return done.stdout
    module = importlib.import_module(name)
    if list(inspect.signature(module.main).parameters)[:1] != ["argv"]:
        return None
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        module.main(["--help"])
    return out.getvalue()


def make_targets() -> str:
    """The Makefile's documented targets (``target: ... ## help``), as ``make help`` lists them."""
    rows = ["| target | what it does |", "| --- | --- |"]
    for match in re.finditer(r"^([\w-]+):.*?## (.*)$", (ROOT / "Makefile").read_text(), re.M):
        rows.append(f"| `make {match[1]}` | {_escape(match[2])} |")
    return "\n".join(rows) + "\n"


def cli_page() -> str:
    out = [
        "# Commands\n",
        "Every command of the package (a module run with `python -m`; `rag-lab <command>` runs the top "
        "level's), with its `--help`, then the Makefile's targets. Generated from the code at each build.\n",
    ]
    for path in _main_modules():
        name = _module(path)
        doc = _docstring(path)
        text = _help(path)
        # the package's own __main__ is the console script (pyproject.toml's [project.scripts])
        heading = "`rag-lab` (`python -m rag_lab`)" if name.endswith(".__main__") else f"`python -m {name}`"
        out.append(f"## {heading}\n\n{_escape(doc.split(chr(10) * 2)[0])}\n")
        out.append(f"```text\n{text.rstrip()}\n```\n" if text else "(internal: started by another command)\n")
    out += ["## Makefile targets\n", "`make help` lists them too.\n", make_targets()]
    return "\n".join(out)


def _docstring(path: Path) -> str:
    import ast

    return ast.get_docstring(ast.parse(path.read_text())) or ""


def api_pages() -> dict[str, str]:
    """One page per package: the package and each of its modules, by mkdocstrings (public members)."""
    pages = {}
    for init in sorted(PACKAGE.rglob("__init__.py")):
        package = _module(init)
        modules = [package] + [
            _module(p) for p in sorted(init.parent.glob("*.py")) if p.name != "__init__.py"
        ]
        body = "\n\n".join(f"::: {m}" for m in modules)
        pages[f"api/{package}.md"] = f"# `{package}`\n\n{body}\n"
    return pages


def on_config(config, **_):
    """Build the generated pages and list them in the nav's "Reference" section."""
    PAGES.clear()
    PAGES.update({"reference/" + k: v for k, v in config_pages().items()})
    PAGES["reference/cli.md"] = cli_page()
    PAGES.update({"reference/" + k: v for k, v in api_pages().items()})
    [section] = [entry for entry in config["nav"] if isinstance(entry, dict) and "Reference" in entry]
    pages = sorted(PAGES)
    section["Reference"] = [
        *section["Reference"],
        {"Configuration": [p for p in pages if p.startswith("reference/config/")]},
        {"Commands": "reference/cli.md"},
        {"API": [{p[len("reference/api/") : -3]: p} for p in pages if p.startswith("reference/api/")]},
    ]
    return config


def on_files(files, config, **_):
    for uri, text in PAGES.items():
        files.append(File.generated(config, uri, content=text))
    for pattern in OUTSIDE:
        for path in sorted(p for p in ROOT.glob(pattern) if p.is_file()):  # not judgements/ (its own folder)
            files.append(File.generated(config, str(path.relative_to(ROOT)), abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, **_):
    """``results.md`` links every results page and notebook (a new one must be added there)."""
    if page.file.src_uri == "results.md":
        for pattern in ("experiments/results/*.md", "notebooks/*.ipynb"):
            for path in sorted(ROOT.glob(pattern)):
                if f"({path.relative_to(ROOT)})" not in markdown:
                    log.warning("results.md does not link %s: add it there", path.relative_to(ROOT))
    return markdown
