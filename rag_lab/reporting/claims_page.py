"""The claims page (``experiments/results/claims.md``, written by :mod:`rag_lab.claims`): the judged table
first, its stamp (the runs' commit and dates, the machine, ``make claims``), then "Reading the claims
table", then the notes written by hand about this judgement; an earlier judgement moves under History
(:mod:`rag_lab.reporting.pages`). The same runs rendered again replace the table, the stamp and the
reading in place and keep the notes. Hand-written: a page layout, which no library keeps.
"""

import re
import textwrap

import pandas as pd

from rag_lab.eval.provenance import JUDGE_SEEDS, JUDGE_SPLIT
from rag_lab.reporting import pages

BEGIN, END = "<!-- claims: begin (python -m rag_lab.claims) -->", "<!-- claims: end -->"
TITLE = "# The papers' claims on the embedded default"
# the papers' two kinds of claim, one of each a paper (our own, E, is rag_lab.reporting.claims_evidence's)
KINDS = {"H": "headline", "M": "mechanism"}
READING = "Reading the claims table"

COLUMNS = """One line a test; a claim has one test or more (`conf/claims.yaml`, written before any run of the
judge split and not changed after).

- **kind**: H, the paper's headline (the trained method against its own start, the same loop before
  training, on the same LM); M, its mechanism (the ablation that isolates what the paper adds). One of each
  a paper. E, our own claim (issue 74), on seeds of its own: its A − B is S_cov − S_meth, the spread of the
  methods' mean Acc across coverage levels minus the spread across methods at full coverage (in brackets
  after its Δ; each seed's own in brackets after its Δ per seed), its CI from the same bootstrap over
  questions, each draw a question with every run's answer to it.
- **A − B** and **metric**: every test is on row A minus row B for one `records.jsonl` field: `acc`, `em`,
  `sepr` in percentage points, `retrieval_count` in searches a question, `n_steps` in steps. "(margin -1)"
  asks A to lose at most 1 point (non-inferiority), not to gain.
- **Δ [95% CI]** and **p**: the mean of A − B and its 95% interval from a paired bootstrap over questions,
  each draw a question with all its seeds (the unit is the question, not the (seed, question) pair); p is
  two-sided, against 0 or the margin.
- **Δ per seed**: each judge seed's own A − B, the seed spread beside the CI; **N**: the questions, each
  run on every seed.
- **test**: this line's verdict: holds when the whole CI lies on the claimed side (of 0, or of the
  margin), reversed when it lies wholly on the other side, not shown when it crosses.
- **claim verdict**: the claim's, over all its tests, repeated on each of its lines: holds when every test
  holds, reversed when any test is reversed, not shown otherwise.

**A "holds" in the test column beside another word in the claim column** is one test of a claim with
several: that test went the claimed way and another did not, and a claim holds only with all its tests."""

DEMO = """**A trained row that rises in `make demo` and is "not shown" here** is two measurements, not a
contradiction. `make demo` (`compare_synth.md`) is one seed on the test split, the split the settings were
probed on: a probe. A claim is judged once, on seeds {seeds} and the {split} split (questions no probe, demo
or test ran), on the metric its paper reports; an effect of a point or two that the demo's interval puts
above 0 can have an interval here that reaches 0. The verdict is the judgement's."""


def reading(table: pd.DataFrame) -> str:
    """The "Reading the claims table" section: what each column means, and the lines of ``table``
    (:func:`rag_lab.claims.judge`) whose test verdict is not their claim's, each claim with its tests."""
    mixed = []
    for (paper, kind, _), lines in table.groupby(["paper", "kind", "claim"], sort=False):
        if (lines["verdict"] != lines["claim verdict"]).any():
            tests = ", ".join(f"{m} {v}" for m, v in zip(lines["metric"], lines["verdict"], strict=True))
            mixed.append(f"{paper} ({kind}): {tests}, so {lines['claim verdict'].iloc[0]}")
    last = COLUMNS.rsplit("\n\n", 1)
    if mixed:  # the paragraph on mixed verdicts, with this table's cases, wrapped as the page's prose is
        last[1] = textwrap.fill(
            f"{last[1]} Here: {'; '.join(mixed)}.".replace("\n", " "), 110, break_on_hyphens=False
        )
    demo = DEMO.format(seeds=f"{JUDGE_SEEDS[0]}-{JUDGE_SEEDS[-1]}", split=JUDGE_SPLIT)
    return f"## {READING}\n\n{last[0]}\n\n{last[1]}\n\n{demo}\n"


def headlines(table: pd.DataFrame) -> str:
    """The sentence counting the papers whose headline (H) and whose mechanism (M) hold, then our own
    claim's verdict (E) where the table has it.

    >>> t = pd.DataFrame({"paper": list("AABBCC"), "kind": list("HMHMHM"),
    ...                   "claim verdict": ["holds", "not shown", "reversed", "holds", "not shown", "holds"]})
    >>> headlines(t)
    'Headlines (H) that hold: 1 of 3 (A). Mechanisms (M) that hold: 2 of 3 (B, C).'
    """
    out = []
    for kind, name in KINDS.items():
        lines = table[table["kind"] == kind].drop_duplicates("paper")
        held = list(lines.loc[lines["claim verdict"] == "holds", "paper"])
        out.append(
            f"{name.capitalize()}s ({kind}) that hold: {len(held)} of {len(lines)}"
            + (f" ({', '.join(held)})." if held else ".")
        )
    for verdict in table.loc[table["kind"] == "E", "claim verdict"].drop_duplicates():
        out.append(f"Our own claim (E): {verdict}.")
    return " ".join(out)


def stamp(table: pd.DataFrame, machine: str) -> pages.Stamp:
    """The page's stamp: the runs' commits and start dates (provenance.json), ``machine``, ``make claims``
    (and ``make claims-evidence`` where the table has our own claim, E)."""
    commits = " and ".join(dict.fromkeys(str(c)[:7] for c in table.get("commit", pd.Series()).dropna()))
    started = sorted(
        {s[:10] for line in table.get("started", pd.Series()).dropna() for s in str(line).split()}
    )
    dates = " to ".join(dict.fromkeys([started[0], started[-1]])) if started else "an unrecorded date"
    remake = "`make claims`" + (", `make claims-evidence`" if "E" in set(table.get("kind", ())) else "")
    return pages.Stamp(commits or "unknown", dates, machine, remake, "Judged")


def claims_page(old: str | None, block: str, stamp: pages.Stamp, section: str) -> str:
    """The page to write. ``old``'s current part judged at the same commit: ``block``, ``stamp`` and the
    reading ``section`` replace theirs, the rest stays. Otherwise a new page leads (title, block, stamp,
    section) and ``old``'s current part goes under History, its markers and reading left out."""
    before, _ = pages.split(old or "")
    last = pages.stamp_of(before)
    if last is not None and last.commit == stamp.commit and BEGIN in before and END in before:
        page = old[: old.index(BEGIN)] + block + old[old.index(END) + len(END) + 1 :]
        page = pages.STAMP.sub(lambda _: stamp.line(), page, count=1)
        return _sub_section(page, section)
    unmarked = (
        None if old is None else re.sub(rf"^({re.escape(BEGIN)}|{re.escape(END)})\n", "", old, flags=re.M)
    )
    return pages.publish(unmarked, f"{TITLE}\n\n{block}\n{stamp.line()}\n\n{section}", drop=(READING,))


def _sub_section(page: str, section: str) -> str:
    """``page`` with its "## Reading the claims table" section (up to the next ``## `` heading) replaced by
    ``section``; added after the stamp where the page has none."""
    found = re.search(rf"^## {READING}\n.*?(?=^## |\Z)", page, flags=re.M | re.S)
    if found:
        rest = page[found.end() :].lstrip("\n")
        return page[: found.start()] + section + ("\n" + rest if rest else "")
    line = pages.STAMP.search(page)
    return page[: line.end()] + "\n\n" + section + page[line.end() :]
