"""The papers' claims, judged on run outputs: ``python -m rag_lab.claims RUNS_DIR [...]`` writes
``claims.md`` (and ``claims.csv``).

Each claim is written in ``conf/claims.yaml`` before the runs: the paper, its kind (``H``: the headline,
against the method's own start; ``M``: the mechanism, the ablation that isolates what is new; one of each per
paper), its words, the experiment whose runs judge it (``experiment.name`` in a run's config.yaml), the
override naming the rows (``by``), the two rows A and B, and one or more tests of A − B on a records.jsonl
field (a test's ``against`` names another B). A test holds when the paired bootstrap over questions (each
draw a question with all its seeds: :func:`rag_lab.eval.stats.paired_bootstrap`) puts the 95% CI of A − B
wholly on the claimed side of ``margin`` (0 by default: a difference at p < 0.05; a negative margin on ">"
is a non-inferiority test, "loses at most |margin|"); it is reversed when the CI is wholly on the other
side, and not shown otherwise. A claim holds when all its tests hold, is reversed when one is reversed, and
is not shown otherwise. What the runs say is the verdict; the spec is not changed after the numbers are seen
(its git history shows when it was written). Our own claim (kind E, issue 74: coverage against method) is one
line on its own seeds: :mod:`rag_lab.reporting.claims_evidence`.

Every line carries its runs' provenance (``provenance.json``, :func:`rag_lab.run.provenance`): the commit
and the code's hash, each row's config hash (seed aside), the LM's fingerprint, the seeds, the split and N.
The table is refused, in one line naming the run or the claim, when:

- a run is not on the spec's judge split and seeds (``judge:``), or has no provenance;
- a run comes from another commit or code than the rest, or was resumed at another version;
- one row pools runs of different configs (seeds aside), or two of its runs share a (seed, question).

``--keep`` carries a claim's lines from an earlier claims.csv only with their provenance, marked kept.
A run whose recorded row hash is not its composed config's is refused too. The judged runs' provenance
and composed configs are committed beside the page (``judgements/<commit>/``), each line's provenance
checked against them; ``--check`` checks the committed claims.csv against them without the runs
(:mod:`rag_lab.reporting.judgements`).

Hand-written: the claim table is ours; the statistics are :mod:`rag_lab.eval.stats`'.
"""

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from rag_lab import CONF_DIR
from rag_lab.core.errors import RagLabError, one_line_errors
from rag_lab.core.records import atomic_write_text
from rag_lab.eval.paired import bootstrap_rows, groups_by
from rag_lab.eval.provenance import JUDGE_SEEDS, JUDGE_SPLIT, check_runs, line_provenance, row_scores
from rag_lab.eval.runs import distinct, find_runs
from rag_lab.eval.table import to_markdown
from rag_lab.reporting import claims_evidence, pages
from rag_lab.reporting.claims_page import BEGIN, END, KINDS, claims_page, headlines, reading, stamp
from rag_lab.reporting.judgements import PROVENANCE, check, check_committed, experiment_of, kept, record

SPEC = CONF_DIR / "claims.yaml"
PERCENT = {"em", "f1", "acc", "judge_acc", "sepr", "ret_precision", "ret_recall"}
SIGNS = (">", "<")


@dataclass(frozen=True)
class Check:
    metric: str
    sign: str = ">"
    # the side of which the CI must lie: 0 (a difference), or e.g. -1.0 with ">" (A loses at most 1 point)
    margin: float = 0.0
    # row B of this test, where it is not the claim's
    against: str | None = None


@dataclass(frozen=True)
class Claim:
    paper: str
    claim: str
    experiment: str
    by: str
    rows: tuple[str, str]
    tests: tuple[Check, ...] = field(default_factory=tuple)
    kind: str = "H"
    # where the paper's design differs from the default LM's role (Stop-RAG's black-box LLM)
    environment: str = ""


@dataclass(frozen=True)
class Spec:
    claims: list[Claim | claims_evidence.SpreadClaim]
    split: str = JUDGE_SPLIT
    seeds: tuple[int, ...] = JUDGE_SEEDS


def read_spec(path: Path = SPEC) -> Spec:
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
    judge = loaded.get("judge") or {}
    split, seeds = judge.get("split"), tuple(judge.get("seeds") or ())
    if (split, seeds) != (JUDGE_SPLIT, JUDGE_SEEDS):
        raise RagLabError(
            f"{path}: field 'judge' must be split {JUDGE_SPLIT}, seeds {list(JUDGE_SEEDS)} (the split and"
            f" seeds only make claims runs: rag_lab.eval.provenance), got split {split}, seeds {list(seeds)}"
        )
    claims = []
    for i, entry in enumerate(entries, 1):
        where = f"{path}: claim {i}"
        if entry.get("kind") == claims_evidence.KIND:
            claims.append(claims_evidence.read_claim(entry, where))
            continue
        missing = [
            k for k in ("paper", "kind", "claim", "experiment", "by", "rows", "tests") if k not in entry
        ]
        if missing:
            raise RagLabError(f"{where}: missing field '{missing[0]}'")
        if entry["kind"] not in KINDS:
            raise RagLabError(
                f"{where}: field 'kind' is {entry['kind']!r}, not H (headline) or M (mechanism)"
                " or E (evidence)"
            )
        if len(entry["rows"]) != 2:
            raise RagLabError(f"{where}: field 'rows' needs two rows (A, B), got {entry['rows']}")
        tests = []
        for t in entry["tests"]:
            if t.get("sign", ">") not in SIGNS:
                raise RagLabError(f"{where}: tests: sign {t.get('sign')!r} is not one of {', '.join(SIGNS)}")
            against = None if t.get("against") is None else str(t["against"])
            tests.append(Check(str(t["metric"]), t.get("sign", ">"), float(t.get("margin", 0.0)), against))
        rows = (str(entry["rows"][0]), str(entry["rows"][1]))
        claims.append(
            Claim(
                entry["paper"],
                entry["claim"],
                entry["experiment"],
                entry["by"],
                rows,
                tuple(tests),
                entry["kind"],
                entry.get("environment") or "",
            )
        )
    for paper in dict.fromkeys(c.paper for c in claims if c.kind in KINDS):
        kinds = [c.kind for c in claims if c.paper == paper]
        for kind, name in KINDS.items():
            if kinds.count(kind) != 1:
                raise RagLabError(f"{path}: {paper} has {kinds.count(kind)} {name} ({kind}) claims, not one")
    return Spec(claims, split, seeds)


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


def judge(spec: Spec | list[Claim], runs: list[Path], judgements: Path | None = None) -> pd.DataFrame:
    """One row per test of each claim: the rows, the metric, A − B [95% CI], p, the seeds' own Δs,
    questions, the runs' provenance, the test's verdict and the claim's. ``judgements``: where the judged
    runs' provenance is committed (:mod:`rag_lab.reporting.judgements`), the table checked against it."""
    spec = spec if isinstance(spec, Spec) else Spec(list(spec))
    wanted = {c.experiment for c in spec.claims}
    by_experiment: dict[str, list[Path]] = {}
    for run in distinct(runs):
        by_experiment.setdefault(experiment_of(run) or "?", []).append(run)
    found: dict[Path, dict] = {}
    for name in wanted:  # each experiment's runs one version, on its claims' seeds (an E claim has its own)
        if judged := by_experiment.get(name):
            found |= check_runs(judged, spec.split, claims_evidence.seeds_for(spec.claims, name, spec.seeds))
    out = []
    for claim in spec.claims:
        if claim.kind == claims_evidence.KIND:
            out.append(
                claims_evidence.judge_claim(claim, by_experiment.get(claim.experiment, []), found, PERCENT)
            )
            continue
        groups = groups_by(by_experiment.get(claim.experiment, []), claim.by)
        results = []
        for test in claim.tests:
            b_row = test.against or claim.rows[1]
            a, b = groups.get(claim.rows[0], []), groups.get(b_row, [])
            row = {
                "paper": claim.paper,
                "kind": claim.kind,
                "claim": claim.claim,
                "rows": f"{claim.rows[0]} − {b_row}",
                "environment": claim.environment or "default LM and world of make demo",
            }
            row["metric"] = test.metric + (f" (margin {test.margin:+g})" if test.margin else "")
            scale = 100.0 if test.metric in PERCENT else 1.0
            # p against the margin: the test a non-inferiority claim makes (0 for the others)
            null = test.margin / scale
            done = []
            if a and b:
                mine, theirs = row_scores(claim.rows[0], a, found), row_scores(b_row, b, found)
                done = bootstrap_rows(mine, theirs, (test.metric,), null=null)
            if not done:
                have = ", ".join(v for v in groups if v != "?") or "none"
                row |= {"verdict": "no runs", "note": f"{claim.experiment} has {claim.by}: {have}"}
            else:
                r = done[0]
                low, high = scale * r["ci_low"], scale * r["ci_high"]
                row |= {"delta": scale * r["delta"], "ci_low": low, "ci_high": high, "p": r["p_value"]}
                prov = line_provenance(a, b, found)  # the seeds both rows ran: the bootstrap's order
                row |= {"seeds": prov.pop("seeds"), "questions": r["n"]}
                deltas = r["seed_deltas"].split(" / ")
                row["seed deltas"] = " / ".join(
                    f"{s}: {scale * float(d):+.2f}" for s, d in zip(row["seeds"].split(), deltas, strict=True)
                )
                row |= prov
                row["verdict"] = verdict(low, high, test)
            results.append(row)
        verdicts = {r["verdict"] for r in results}
        overall = next((v for v in ("no runs", "reversed", "not shown") if v in verdicts), "holds")
        out += [r | {"claim verdict": overall} for r in results]
    if judgements is not None and found:
        check(record(found, judgements), pd.DataFrame(out), spec.claims, spec.split, spec.seeds)
    return pd.DataFrame(out)


def render(table: pd.DataFrame) -> str:
    """The claims as markdown: one line per test, Δ [95% CI], p and the seeds' own Δs, the verdicts; then
    each line's provenance."""
    shown = pd.DataFrame(
        {
            "paper": table["paper"],
            "kind": table["kind"],
            "claim": table["claim"],
            "A − B": table["rows"],
            "metric": table["metric"],
            "Δ [95% CI]": [
                f"{r.delta:+.2f} [{r.ci_low:+.2f}, {r.ci_high:+.2f}]{claims_evidence.spread_cell(r)}"
                if hasattr(r, "delta") and r.delta == r.delta
                else "—"
                for r in table.itertuples()
            ],
            "p": [_p(getattr(r, "p", float("nan"))) for r in table.itertuples()],
            "Δ per seed": [_text(r.get("seed deltas")) for _, r in table.iterrows()],
            "N": [_int(getattr(r, "questions", None)) for r in table.itertuples()],
            "test": table["verdict"],
            "claim verdict": table["claim verdict"],
        }
    )
    provenance = pd.DataFrame(
        {
            "paper": table["paper"],
            "kind": table["kind"],
            "A − B": table["rows"],
            "environment": table.get("environment", pd.Series("", index=table.index)),
            **{k: [_text(r.get(k)) for _, r in table.iterrows()] for k in PROVENANCE},
            "kept": [_text(r.get("source")) or "—" for _, r in table.iterrows()],
        }
    ).drop_duplicates(subset=["paper", "kind", "A − B"])
    held = table.drop_duplicates(["paper", "kind", "claim"])["claim verdict"].value_counts()
    summary = ", ".join(f"{n} {v}" for v, n in held.items())
    return (
        f"{BEGIN}\n{to_markdown(shown)}\nClaims: {summary}. {headlines(table)} Δ is A − B (percentage"
        " points for EM / F1 / Acc / SEPR), its 95% CI and p from a paired bootstrap over questions, each"
        " draw a question with all its seeds; p is two-sided, against 0 or, for a test with a margin,"
        " against the margin; beside it each seed's own Δ (rag_lab/claims.py; the claims:"
        " conf/claims.yaml).\n\nProvenance of each line (the runs' provenance.json: commit, code hash, each"
        " row's config hash with the seed aside, the LM's fingerprint, split, seeds; kept: the earlier table"
        f" a line was kept from):\n\n{to_markdown(provenance)}\n{END}\n"
    )


def _text(value) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


def _p(p) -> str:
    if p is None or p != p:
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _int(value) -> str:
    return "—" if value is None or pd.isna(value) else str(int(value))


def write_claims(
    dirs: list[Path], out: Path, spec: Path = SPEC, readme: Path | None = None, keep: Path | None = None
) -> str:
    """claims.md and claims.csv; the block, which also replaces ``readme``'s (between the same markers)
    when given. The page leads with the block, its stamp (the runs' commit and dates, this machine:
    ``make claims`` judges and writes on one) and "Reading the claims table"; the runs of another commit
    than the page's move its judgement under History, the same runs replace it in place
    (:func:`rag_lab.reporting.claims_page.claims_page`). ``keep``: an earlier claims.csv whose lines stand
    for the claims that have no runs here. The judged runs' provenance goes to ``judgements/`` beside
    ``out`` (:func:`judge`)."""
    runs = find_runs(dirs)
    if not runs:
        raise RagLabError(f"no run (a directory with metrics.json) under {', '.join(map(str, dirs))}")
    table = judge(read_spec(spec), runs, judgements_of(out))
    if keep is not None:
        table = kept(table, keep)
    block = render(table)
    old = out.read_text() if out.exists() else None
    atomic_write_text(out, claims_page(old, block, stamp(table, pages.machine()), reading(table)))
    atomic_write_text(out.with_suffix(".csv"), table.to_csv(index=False))
    if readme is not None:
        page = readme.read_text()
        if BEGIN not in page or END not in page:
            raise RagLabError(f"{readme}: no claims block ({BEGIN} ... {END}) to replace")
        atomic_write_text(readme, page[: page.index(BEGIN)] + block + page[page.index(END) + len(END) + 1 :])
    return block


def judgements_of(out: Path) -> Path:
    """Where the judgements' provenance is committed: ``judgements/`` beside the claims page."""
    return out.parent / "judgements"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rag_lab.claims", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="folders holding the claims' runs (sweep dirs)")
    parser.add_argument("--spec", type=Path, default=SPEC, help="the claims (default: conf/claims.yaml)")
    parser.add_argument("--out", type=Path, default=Path("experiments/results/claims.md"))
    parser.add_argument("--readme", type=Path, help="a page whose claims block is replaced too (README.md)")
    parser.add_argument(
        "--keep", type=Path, help="an earlier claims.csv whose lines stand for claims without runs"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="check --out's claims.csv against the committed provenance; no runs",
    )
    args = parser.parse_args(argv)
    if not args.dirs and not args.check:
        parser.error("the runs' folders are required (or --check)")
    with one_line_errors():
        if args.check:
            found = read_spec(args.spec)
            where = judgements_of(args.out)
            print(
                check_committed(args.out.with_suffix(".csv"), where, found.claims, found.split, found.seeds)
            )
        else:
            sys.stdout.write(write_claims(args.dirs, args.out, args.spec, args.readme, args.keep))


if __name__ == "__main__":
    main()
