"""A GPU's bytes, phase by phase, as lines of a ledger; the peak over the phases; the bound it must stay
under.

One :class:`Phase` is one stretch of a trainer's work with its own peak (the rollouts with the generation
engine awake, one optimizer step, a checkpoint's gathers); its lines say what holds the bytes at that peak,
and they add up to it. A :class:`Ledger` is every phase of every trainer a run takes, on one GPU (rank 0:
under FSDP every rank holds the same shares); its peak is the largest phase's, and a ledger over its bound
names the phase and the phase's largest line (:meth:`Ledger.over`).

Hand-written: the bookkeeping and its rendering only; the bytes come from torch's trackers
(:mod:`rag_lab.train.memory.measure`).
"""

from dataclasses import dataclass, field

GIB = 2**30

# The ledger's lines, in the order they print. A phase lacks the lines it does not hold.
LINES = (
    "policy shards",
    "gradients",
    "optimizer state",
    "reference",
    "critic",
    "value head",
    "frozen models",
    "generation engine",
    "activations",
    "temporaries / all-gather",
    "retriever / encoders",
)


def gib(n: float) -> str:
    """Bytes in GiB, two decimals.

    >>> gib(3 * GIB / 2), gib(0)
    ('1.50', '0.00')
    """
    return f"{n / GIB:.2f}"


@dataclass
class Phase:
    """One phase of one trainer: its lines at its peak (bytes), which add up to :attr:`total`."""

    trainer: str
    name: str
    lines: dict[str, int] = field(default_factory=dict)
    # what the phase holds that its lines do not say (an engine asleep, an assumption)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.lines = {name: size for name, size in self.lines.items() if size}  # a line holding nothing: none
        unknown = set(self.lines) - set(LINES)
        if unknown:
            raise ValueError(f"not a line of the ledger: {', '.join(sorted(unknown))}")

    @property
    def total(self) -> int:
        return sum(self.lines.values())

    def largest(self) -> tuple[str, int]:
        """The line holding the most bytes (the first in :data:`LINES` order on a tie).

        >>> Phase("SFT", "update", {"gradients": 2, "activations": 5, "policy shards": 5}).largest()
        ('policy shards', 5)
        """
        ordered = [(name, self.lines[name]) for name in LINES if name in self.lines]
        return max(ordered, key=lambda item: item[1], default=("nothing", 0))


@dataclass
class Ledger:
    """Every phase of a run's trainers on one GPU of ``world`` ranks, and the GPU's memory in bytes."""

    title: str
    world: int
    gpu_bytes: int
    headroom: float
    phases: list[Phase] = field(default_factory=list)

    @property
    def bound(self) -> int:
        """The most a phase may hold: the GPU's memory less the headroom."""
        return int(self.gpu_bytes * (1 - self.headroom))

    @property
    def peak(self) -> Phase:
        """The phase of the largest total (the first such)."""
        if not self.phases:
            raise ValueError(f"{self.title}: no phase planned")
        return max(self.phases, key=lambda p: p.total)

    def over(self) -> str | None:
        """Why the plan exceeds its bound, in one line (the peak's phase and largest line); None when it
        fits.

        >>> ledger = Ledger("dapo", 8, 80 * GIB, 0.1, [Phase("GRPO", "update", {"activations": 75 * GIB})])
        >>> for part in ledger.over().split("; "):
        ...     print(part)
        the GRPO update phase peaks at 75.00 GiB a GPU, over 72.00 GiB (90% of 80.00 GiB)
        its largest line: activations 75.00 GiB
        """
        peak = self.peak
        if peak.total <= self.bound:
            return None
        line, size = peak.largest()
        share = round(100 * (1 - self.headroom))
        return (
            f"the {peak.trainer} {peak.name} phase peaks at {gib(peak.total)} GiB a GPU, over "
            f"{gib(self.bound)} GiB ({share}% of {gib(self.gpu_bytes)} GiB); its largest line: {line} "
            f"{gib(size)} GiB"
        )

    def columns(self) -> list[str]:
        """The lines any phase holds, in :data:`LINES` order."""
        return [name for name in LINES if any(name in p.lines for p in self.phases)]

    def rows(self) -> list[list[str]]:
        """One row a phase: trainer, phase, each line (GiB), the total."""
        return [
            [
                p.trainer,
                p.name,
                *(gib(p.lines[c]) if c in p.lines else "" for c in self.columns()),
                gib(p.total),
            ]
            for p in self.phases
        ]

    def text(self) -> str:
        """The ledger as a plain table, then its peak and verdict."""
        head = ["trainer", "phase", *self.columns(), "total"]
        rows = [head, *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        return "\n".join([self.headline(), "", *lines, *([""] + self.notes() if self.notes() else [])])

    def headline(self) -> str:
        peak = self.peak
        verdict = "fits" if peak.total <= self.bound else "EXCEEDS"
        return (
            f"{self.title}: {self.world} GPU(s), peak {gib(peak.total)} GiB a GPU in the {peak.trainer} "
            f"{peak.name} phase; bound {gib(self.bound)} GiB of {gib(self.gpu_bytes)}: "
            f"{verdict}"
        )

    def notes(self) -> list[str]:
        return [f"- {p.trainer} {p.name}: {note}" for p in self.phases for note in p.notes]

    def markdown(self) -> str:
        """The ledger as a markdown table (GiB), the peak's row in bold, its notes below."""
        head = ["trainer", "phase", *self.columns(), "total"]
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        peak = self.phases.index(self.peak)
        for i, row in enumerate(self.rows()):
            cells = [f"**{c}**" if i == peak and c else c for c in row]
            out.append("| " + " | ".join(cells) + " |")
        return "\n".join(out + ([""] + self.notes() if self.notes() else []))
