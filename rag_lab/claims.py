"""The papers' headlines, judged on run outputs: ``python -m rag_lab.claims RUNS_DIR [...]`` writes
``claims.md`` (and ``claims.csv``).

Each claim is written in ``conf/claims.yaml`` before the runs: the paper, its words, the experiment whose
runs judge it (``experiment.name`` in a run's config.yaml), the override naming the rows (``by``), the two
rows A and B, and one or more tests of A − B on a records.jsonl field. A test holds when the paired bootstrap
over questions (each draw a question with all its seeds: :func:`rag_lab.eval.stats.paired_bootstrap`) puts
the 95% CI of A − B wholly on the claimed side of ``margin`` (0 by default: a difference at p < 0.05; a
negative margin on ">" is a non-inferiority test, "loses at most |margin|"); it is reversed when the CI is
wholly on the other side, and not shown otherwise. A claim holds when all its tests hold, is reversed when
one is reversed, and is not shown otherwise. What the runs say is the verdict; the spec is not changed
after the numbers are seen (its git history shows when it was written).

Hand-written: the claim table is ours; the statistics are :mod:`rag_lab.eval.stats`'.
"""

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from rag_lab import CONF_DIR
from rag_lab.errors import RagLabError, one_line_errors
from rag_lab.eval.paired import bootstrap_rows, groups_by, scores_of
from rag_lab.eval.runs import distinct, find_runs, overrides_of
from rag_lab.eval.table import to_markdown
from rag_lab.records import atomic_write_text

SPEC = CONF_DIR / "claims.yaml"
PERCENT = {"em", "f1", "acc", "judge_acc", "sepr", "ret_precision", "ret_recall"}
SIGNS = (">", "<")
BEGIN, END = "<!-- claims: begin (python -m rag_lab.claims) -->", "<!-- claims: end -->"


@dataclass(frozen=True)
class Check:
    metric: str
    sign: str = ">"
    # the side of which the CI must lie: 0 (a difference), or e.g. -1.0 with ">" (A loses at most 1 point)
    margin: float = 0.0


@dataclass(frozen=True)
class Claim:
    paper: str
    claim: str
    experiment: str
    by: str
    rows: tuple[str, str]
    tests: tuple[Check, ...] = field(default_factory=tuple)


def read_spec(path: Path = SPEC) -> list[Claim]:
    """The claims of ``path``; a malformed entry is one line naming the file, the claim and the field."""
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise RagLabError(f"{path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise RagLabError(f"{where}: malformed yaml ({str(e).splitlines()[0]})") from None
    entries = loaded.get("claims") if isinstance(loaded, dict) else None
    if not isinstance(entries, list) or not entries:
        raise RagLabError(f"{path}: not a claims spec (a non-empty 'claims' list at the top)")
    claims = []
    for i, entry in enumerate(entries, 1):
        where = f"{path}: claim {i}"
        missing = [k for k in ("paper", "claim", "experiment", "by", "rows", "tests") if k not in entry]
        if missing:
            raise RagLabError(f"{where}: missing field '{missing[0]}'")
        if len(entry["rows"]) != 2:
            raise RagLabError(f"{where}: field 'rows' needs two rows (A, B), got {entry['rows']}")
        tests = []
        for t in entry["tests"]:
            if t.get("sign", ">") not in SIGNS:
                raise RagLabError(f"{where}: tests: sign {t.get('sign')!r} is not one of {', '.join(SIGNS)}")
            tests.append(Check(str(t["metric"]), t.get("sign", ">"), float(t.get("margin", 0.0))))
        rows = (str(entry["rows"][0]), str(entry["rows"][1]))
        claims.append(
            Claim(entry["paper"], entry["claim"], entry["experiment"], entry["by"], rows, tuple(tests))
        )
    return claims


def experiment_of(run: Path) -> str | None:
    """The ``experiment.name`` of a run's resolved config (None where it has none)."""
    path = run / "config.yaml"
    config = yaml.safe_load(path.read_text()) if path.exists() else None
    return ((config or {}).get("experiment") or {}).get("name")


def verdict(low: float, high: float, test: Check) -> str:
    """holds / reversed / not shown for a CI [low, high] of A − B (in the metric's unit).

    >>> verdict(0.5, 3.0, Check("acc")), verdict(-3.0, -0.5, Check("acc")), verdict(-0.5, 3.0, Check("acc"))
    ('holds', 'reversed', 'not shown')
    >>> verdict(-0.8, 0.4, Check("acc", ">", -1.0)), verdict(-2.0, -0.4, Check("rc", "<"))
    ('holds', 'holds')
    """
    if test.sign == "<":
        low, high, margin = -high, -low, -test.margin
    else:
        margin = test.margin
    if low > margin:
        return "holds"
    if high < margin:
        return "reversed"
    return "not shown"


def judge(claims: list[Claim], runs: list[Path]) -> pd.DataFrame:
    """One row per test of each claim: the rows, the metric, A − B [95% CI], p, seeds, questions, the test's
    verdict and the claim's."""
    by_experiment: dict[str, list[Path]] = {}
    for run in distinct(runs):
        by_experiment.setdefault(experiment_of(run) or "?", []).append(run)
    out = []
    for claim in claims:
        found = by_experiment.get(claim.experiment, [])
        groups = groups_by(found, claim.by)
        a, b = (groups.get(r, []) for r in claim.rows)
        results = []
        for test in claim.tests:
            row = {"paper": claim.paper, "claim": claim.claim, "rows": f"{claim.rows[0]} − {claim.rows[1]}"}
            row["metric"] = test.metric + (f" (margin {test.margin:+g})" if test.margin else "")
            scale = 100.0 if test.metric in PERCENT else 1.0
            # p against the margin: the test a non-inferiority claim makes (0 for the others)
            null = test.margin / scale
            done = bootstrap_rows(scores_of(a), scores_of(b), (test.metric,), null=null) if a and b else []
            if not done:
                have = ", ".join(v for v in groups if v != "?") or "none"
                row |= {"verdict": "no runs", "note": f"{claim.experiment} has {claim.by}: {have}"}
            else:
                r = done[0]
                low, high = scale * r["ci_low"], scale * r["ci_high"]
                row |= {"delta": scale * r["delta"], "ci_low": low, "ci_high": high, "p": r["p_value"]}
                row |= {"seeds": len({overrides_of(x).get("seed", "0") for x in a}), "questions": r["n"]}
                row["verdict"] = verdict(low, high, test)
            results.append(row)
        verdicts = {r["verdict"] for r in results}
        overall = next((v for v in ("no runs", "reversed", "not shown") if v in verdicts), "holds")
        out += [r | {"claim verdict": overall} for r in results]
    return pd.DataFrame(out)


def render(table: pd.DataFrame) -> str:
    """The claims as markdown: one line per test, Δ [95% CI] and p, the verdicts."""
    shown = pd.DataFrame(
        {
            "paper": table["paper"],
            "claim": table["claim"],
            "A − B": table["rows"],
            "metric": table["metric"],
            "Δ [95% CI]": [
                f"{r.delta:+.2f} [{r.ci_low:+.2f}, {r.ci_high:+.2f}]"
                if hasattr(r, "delta") and r.delta == r.delta
                else "—"
                for r in table.itertuples()
            ],
            "p": [_p(getattr(r, "p", float("nan"))) for r in table.itertuples()],
            "seeds": [_int(getattr(r, "seeds", None)) for r in table.itertuples()],
            "N": [_int(getattr(r, "questions", None)) for r in table.itertuples()],
            "test": table["verdict"],
            "claim verdict": table["claim verdict"],
        }
    )
    held = table.drop_duplicates("claim")["claim verdict"].value_counts()
    summary = ", ".join(f"{n} {v}" for v, n in held.items())
    return (
        f"{BEGIN}\n{to_markdown(shown)}\nClaims: {summary}. {headlines(table)} Δ is A − B (percentage points"
        " for EM / F1 / Acc / SEPR), its 95% CI and p from a paired bootstrap over questions, each draw a"
        " question with all its seeds; p is two-sided, against 0 or, for a test with a margin, against the"
        f" margin (rag_lab/claims.py; the claims: conf/claims.yaml).{_sources(table)}"
        f"\n{END}\n"
    )


def _sources(table: pd.DataFrame) -> str:
    """The sentence naming the claims whose lines come from an earlier table (``--keep``), if any."""
    if "source" not in table or table["source"].isna().all():
        return ""
    earlier = table.dropna(subset=["source"]).drop_duplicates("claim")
    files = ", ".join(sorted(set(earlier["source"])))
    return (
        f" Not run again, kept from the earlier table ({files}; its git history dates it): "
        + "; ".join(f"{r.paper}, {r.rows}" for r in earlier.itertuples())
        + "."
    )


def headlines(table: pd.DataFrame) -> str:
    """Each paper's headline is its first claim in the spec; the sentence naming those that hold.

    >>> t = pd.DataFrame({"paper": list("AABCC"), "claim verdict": ["holds", "not shown", "reversed",
    ...                   "not shown", "holds"]})
    >>> headlines(t)
    "Papers whose headline (the paper's first claim) holds: 1 of 3 (A)."
    """
    first = table.drop_duplicates("paper", keep="first")
    held = list(first.loc[first["claim verdict"] == "holds", "paper"])
    return f"Papers whose headline (the paper's first claim) holds: {len(held)} of {len(first)}" + (
        f" ({', '.join(held)})." if held else "."
    )


def _p(p) -> str:
    if p is None or p != p:
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _int(value) -> str:
    return "—" if value is None or value != value else str(int(value))


def kept(table: pd.DataFrame, earlier: Path) -> pd.DataFrame:
    """``table`` with each claim that has no runs taken from ``earlier`` (a claims.csv), where that table
    judged it; its lines' ``source`` names the file. A claim is matched on its words, rows and metrics."""
    try:
        old = pd.read_csv(earlier)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise RagLabError(f"{earlier}: cannot read the earlier claims table ({e})") from None
    missing = {"claim", "rows", "metric", "verdict"} - set(old.columns)
    if missing:
        raise RagLabError(f"{earlier}: not a claims table (no column {', '.join(sorted(missing))})")
    old = old[old["verdict"] != "no runs"]
    out = []
    for _, lines in table.groupby(["claim", "rows"], sort=False):
        if (lines["verdict"] == "no runs").all():
            before = old.merge(lines[["claim", "rows", "metric"]], on=["claim", "rows", "metric"])
            if len(before) == len(lines):
                first = before.get("source", pd.Series(None, index=before.index)).astype(object)
                lines = before.assign(source=first.fillna(str(earlier)))
        out.append(lines)
    return pd.concat(out, ignore_index=True)


def write_claims(
    dirs: list[Path], out: Path, spec: Path = SPEC, readme: Path | None = None, keep: Path | None = None
) -> str:
    """claims.md (the generated block replaced, the text around it kept) and claims.csv; the block, which
    also replaces ``readme``'s (between the same markers) when given. ``keep``: an earlier claims.csv whose
    lines stand for the claims that have no runs here."""
    runs = find_runs(dirs)
    if not runs:
        raise RagLabError(f"no run (a directory with metrics.json) under {', '.join(map(str, dirs))}")
    table = judge(read_spec(spec), runs)
    if keep is not None:
        table = kept(table, keep)
    block = render(table)
    old = (
        out.read_text()
        if out.exists()
        else f"# The papers' headlines on the embedded default\n\n{BEGIN}\n{END}\n"
    )
    if BEGIN in old and END in old:
        text = old[: old.index(BEGIN)] + block + old[old.index(END) + len(END) + 1 :]
    else:
        text = old.rstrip("\n") + "\n\n" + block
    atomic_write_text(out, text)
    atomic_write_text(out.with_suffix(".csv"), table.to_csv(index=False))
    if readme is not None:
        page = readme.read_text()
        if BEGIN not in page or END not in page:
            raise RagLabError(f"{readme}: no claims block ({BEGIN} ... {END}) to replace")
        atomic_write_text(readme, page[: page.index(BEGIN)] + block + page[page.index(END) + len(END) + 1 :])
    return block


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rag_lab.claims", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="folders holding the claims' runs (sweep dirs)")
    parser.add_argument("--spec", type=Path, default=SPEC, help="the claims (default: conf/claims.yaml)")
    parser.add_argument("--out", type=Path, default=Path("experiments/results/claims.md"))
    parser.add_argument("--readme", type=Path, help="a page whose claims block is replaced too (README.md)")
    parser.add_argument("--keep", type=Path, help="an earlier claims.csv, for the claims without runs here")
    args = parser.parse_args(argv)
    with one_line_errors():
        sys.stdout.write(write_claims(args.dirs, args.out, args.spec, args.readme, args.keep))


if __name__ == "__main__":
    main()
