"""Results pages that lead with today (``experiments/results/*.md``, issue 73): a page opens with its current
table, then one stamp line (the commit, date and machine it was measured on and the command that remakes
it); what the page showed before sits under ``## History``, newest first. A writer hands :func:`publish`
the page as it is and today's section; the section it replaces moves under History, its headings two
levels down and headed by its own stamp, so a re-run never pushes today's table down.

The stamp is one line a reader and :data:`STAMP` both read::

    **Measured** at commit `1a2b3c4` on 2026-12-08 · Intel(R) Xeon(R) Processor, 2 cores · remake: `make test`

(``**Judged**`` on the claims page, whose runs give the commit.) Writers: ``experiments/benchlib.py``
(``publish``), :mod:`rag_lab.claims`, ``experiments/gpu_check_page.py``. Standard library only: the bench
scripts and the GPU check import it from a bare interpreter. Hand-written: a page layout, which no library
keeps.
"""

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HISTORY = "## History"
HISTORY_LEAD = "What this page showed before, newest first."
STAMP = re.compile(
    r"^\*\*(?P<verb>Measured|Judged)\*\* at commit `(?P<commit>[^`]*)` on (?P<date>[^·]+?) · "
    r"(?P<machine>[^·]+?) · remake: (?P<command>.+)$",
    re.M,
)
FENCE = re.compile(r"^(```|~~~)")


@dataclass(frozen=True)
class Stamp:
    """Where a page's current table came from."""

    commit: str
    date: str
    machine: str
    command: str
    verb: str = "Measured"

    def line(self) -> str:
        """The stamp as the page writes it (one line, :data:`STAMP` reads it back).

        >>> line = Stamp("1a2b3c4", "2026-12-08", "2 cores", "`make bench`").line()
        >>> line
        '**Measured** at commit `1a2b3c4` on 2026-12-08 · 2 cores · remake: `make bench`'
        >>> stamp_of(line) == Stamp("1a2b3c4", "2026-12-08", "2 cores", "`make bench`")
        True
        """
        where = f"at commit `{self.commit}` on {self.date} · {self.machine}"
        return f"**{self.verb}** {where} · remake: {self.command}"

    def heading(self) -> str:
        return f"{self.verb} at commit {self.commit} on {self.date}"


def stamp_of(section: str) -> Stamp | None:
    """The first stamp in ``section`` (None where it has none: a page written before stamps)."""
    found = STAMP.search(section)
    if found is None:
        return None
    return Stamp(*found.group("commit", "date", "machine", "command", "verb"))


def here(command: str, root: Path | None = None) -> Stamp:
    """The stamp of a measurement made now, in this checkout, by ``command`` (put in backticks)."""
    return Stamp(commit(root or Path.cwd()), time.strftime("%Y-%m-%d"), machine(), f"`{command}`")


def commit(root: Path) -> str:
    """The short commit checked out at ``root``, marked where tracked files differ from it."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)

    try:
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode:
            return "unknown (not a git checkout)"
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git)"
    return head.stdout.strip() + (" with uncommitted changes" if dirty else "")


def machine() -> str:
    """The CPU's model name as ``lscpu`` shows it, the cores this process may use, and the GPU where a
    measurement imported torch and sees one."""
    cpu = "unknown CPU"
    info = Path("/proc/cpuinfo")
    if info.exists():
        names = [
            line.split(":", 1)[1].strip()
            for line in info.read_text().splitlines()
            if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out = f"{cpu}, {cores} cores"
    torch = sys.modules.get("torch")  # only where the measurement used it: importing torch costs seconds
    if torch is not None and torch.cuda.is_available():
        out += f", {torch.cuda.get_device_name(0)}"
    return out


def after_first_table(body: str, insert: str) -> str:
    """``body`` with ``insert`` as a paragraph after its first markdown table (at its end where it has none):
    the stamp stands right under the table it dates."""
    lines = body.strip("\n").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return "\n".join(lines) + f"\n\n{insert}\n"
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    rest = "\n".join(lines[end:]).strip("\n")
    return "\n".join(lines[:end]) + f"\n\n{insert}\n" + (f"\n{rest}\n" if rest else "")


def split(page: str) -> tuple[str, str]:
    """A page's current part and its history (what follows the ``## History`` line, its lead line aside)."""
    lines = page.splitlines(keepends=True)
    at = next((i for i, line in enumerate(lines) if line.rstrip() == HISTORY), None)
    if at is None:
        return page, ""
    history = "".join(lines[at + 1 :]).strip("\n")
    if history.startswith(HISTORY_LEAD):
        history = history[len(HISTORY_LEAD) :].strip("\n")
    return "".join(lines[:at]), history


def demoted(current: str, drop: tuple[str, ...] = ()) -> str:
    """A page's current part as a History entry: its title replaced by a heading naming its stamp, every
    other heading two levels down, the sections headed ``## <name>`` for a name in ``drop`` left out (what a
    writer regenerates each time). Code blocks are left as they are (a ``#`` there is a comment)."""
    stamp = stamp_of(current)
    title = f"### {stamp.heading()}" if stamp else "### The page before stamps"
    out, fenced, dropping = [title, ""], False, False
    for i, line in enumerate(current.strip("\n").splitlines()):
        if FENCE.match(line):
            fenced = not fenced
        heading = not fenced and line.startswith("#")
        if heading and line.startswith("## "):
            dropping = line[3:].strip() in drop
        if dropping or (i == 0 and line.startswith("# ")):
            continue
        out.append("##" + line if heading else line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out).strip("\n"))


def publish(old: str | None, current: str, drop: tuple[str, ...] = ()) -> str:
    """The page to write: ``current`` (today's section, its title first) and, under ``## History``, the
    section of ``old`` it replaces (:func:`demoted`, ``drop`` as there) above ``old``'s own history."""
    entries = []
    if old is not None and old.strip():
        before, history = split(old)
        entries = [demoted(before, drop)] + ([history] if history else [])
    page = current.rstrip("\n") + "\n"
    if entries:
        page += f"\n{HISTORY}\n\n{HISTORY_LEAD}\n\n" + "\n\n".join(entries) + "\n"
    return page
