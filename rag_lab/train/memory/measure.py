"""A phase's peak, read by torch's own trackers, as the ledger's lines.

``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` follows an FSDP2 root (its shards, the gathered
layers, gradients, the optimizer's state) and every tensor made while it is on, by category;
``mem_tracker.MemTracker`` does the same for a model that is not sharded (an encoder). At the phase's peak
their categories become lines (:data:`CATEGORIES`); the shards of the trained root split into its roles (the
policy, a separate critic, the value head: their bytes are exact), and what lives outside the root (a sharded
reference, an engine's reservation, encoders) adds its own lines.

Hand-written: the mapping of categories to lines only.
"""

import contextlib
from collections.abc import Iterator

from torch import nn

from rag_lab.train.memory.fake import python_functions

# tracker categories (FSDPMemTracker's and MemTracker's names) -> ledger lines
CATEGORIES = {
    "Sharded Param": "policy shards",
    "Parameter": "policy shards",
    "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients",
    "Gradient": "gradients",
    "OptState": "optimizer state",
    "Optstate": "optimizer state",
    "Activation": "activations",
    "Unsharded Param": "temporaries / all-gather",
    "All Gather": "temporaries / all-gather",
    "Reduce Scatter": "temporaries / all-gather",
    "Temp": "temporaries / all-gather",
    "Inputs": "temporaries / all-gather",
    # the tracked model's own buffers (rotary frequencies: FSDP does not shard buffers)
    "Buffer": "policy shards",
    "Other": "temporaries / all-gather",
}


class Tracked:
    """One phase under a tracker: ``forward`` before each pass of the root (the tracker follows one pass at a
    time), :meth:`lines` after."""

    def __init__(self, tracker, root: nn.Module):
        self.tracker = tracker
        self.root = root

    def forward(self) -> None:
        """Before a pass of the root: the tracker's per-module records cleared (its peak stays), and a record
        made for each FSDP unit below the root. FSDPMemTracker makes one when a unit's forward runs, and its
        backward hook expects it; a unit of several modules whose first one's forward gathers them all (the
        final norm and the output head, which TRL's fused head reads without calling) has none otherwise."""
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPModMemStats
        from torch.distributed.fsdp import FSDPModule

        self.tracker.reset_mod_stats()
        if isinstance(self.tracker, FSDPMemTracker):
            for name, module in self.root.named_modules():
                if isinstance(module, FSDPModule) and module is not self.root:
                    self.tracker.memory_tracking[module] = _FSDPModMemStats(f"planned.{name}")

    def begin(self) -> None:
        """A new phase: the peak starts again from what is held now (as the tracker starts it on entry). One
        tracker follows all of a trainer's phases: FSDPMemTracker's hooks do not survive a second tracker on
        the same model after a forward."""
        snapshot = self.tracker.get_tracker_snapshot("current")
        self.tracker._peak_mem_snap = snapshot
        self.tracker._peak_mem = {dev: snap.get("Total", 0) for dev, snap in snapshot.items()}

    def lines(
        self, roles: dict[str, int] | None = None, outside: dict[str, int] | None = None, passes: bool = True
    ) -> dict[str, int]:
        """The peak's lines; ``roles``: bytes of the root's shards that are not the policy's (a critic, a
        value head), moved off its line; ``outside``: lines of what the tracker does not see, added;
        ``passes``: whether the phase ran forward passes (else what it made are gathers: temporaries, not
        activations)."""
        snapshot = self.tracker.get_tracker_snapshot("peak")
        peak = max(snapshot.values(), key=lambda s: s.get("Total", 0), default={})
        lines: dict[str, int] = {}
        for category, size in peak.items():
            name = getattr(category, "value", category)
            if name != "Total" and size:
                line = CATEGORIES[name]
                lines[line] = lines.get(line, 0) + size
        if not passes and "activations" in lines:
            lines["temporaries / all-gather"] = lines.get("temporaries / all-gather", 0) + lines.pop(
                "activations"
            )
        for role, size in (roles or {}).items():
            if size:
                lines["policy shards"] = lines.get("policy shards", 0) - size
                lines[role] = lines.get(role, 0) + size
        for line, size in (outside or {}).items():
            if size:
                lines[line] = lines.get(line, 0) + size
        return {k: v for k, v in lines.items() if v}


@contextlib.contextmanager
def tracking(root: nn.Module, optimizer=None) -> Iterator[Tracked]:
    """A phase of ``root`` (sharded: FSDPMemTracker; not: MemTracker) and its ``optimizer``."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.fsdp import FSDPModule

    frozen = []
    if isinstance(root, FSDPModule):
        tracker = FSDPMemTracker(mod=root, optm=optimizer)
    else:
        # MemTracker hooks every parameter's gradient, which a frozen one refuses; none is made without
        # gradient
        frozen = [p for p in root.parameters() if not p.requires_grad]
        for p in frozen:
            p.requires_grad_(True)
        tracker = MemTracker()
        tracker.track_external(root, optimizer)
    try:
        with tracker, python_functions():
            yield Tracked(tracker, root)
    finally:
        for p in frozen:
            p.requires_grad_(False)
