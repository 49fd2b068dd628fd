"""Cross-capture (cross-node) rules: run once over a fleet, after the per-capture rules.

A rule takes the :class:`FleetView` (the captures' paths, their per-capture findings
documents, and the captures themselves, opened on demand) and returns findings whose
``node`` says where they are (``"node0,node1"`` for a finding between nodes).  Register
one with ``@cross_rule("name")``; ``tacc analyze CAPTURE...`` runs every registered rule
(``--rule`` selects among per-capture and cross rules alike).  A merged multi-node view
(aligned clocks, one timeline) plugs in as ``FleetView.merged``, built on first use by
the builder set with :func:`set_merger`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from tacc.capture import Capture, open_capture

from .rules import Finding, Thresholds


@dataclass
class FleetView:
    paths: list[Path]
    docs: list[dict[str, Any]]  # per-capture findings.json documents, in path order
    _merger: Callable[[list[Capture]], Any] | None = field(default=None, repr=False)

    @cached_property
    def captures(self) -> list[Capture]:
        return [open_capture(p) for p in self.paths]

    @cached_property
    def merged(self) -> Any:
        """The captures merged onto one timeline (None until a merger is plugged in)."""
        return self._merger(self.captures) if self._merger else None


CrossRule = Callable[[FleetView, Thresholds], list[Finding]]
CROSS_RULES: dict[str, CrossRule] = {}
_MERGER: list[Callable[[list[Capture]], Any]] = []


def cross_rule(name: str) -> Callable[[CrossRule], CrossRule]:
    def deco(fn: CrossRule) -> CrossRule:
        CROSS_RULES[name] = fn
        return fn

    return deco


def set_merger(fn: Callable[[list[Capture]], Any]) -> None:
    """Plug in the builder of the merged multi-node view (``FleetView.merged``)."""
    _MERGER[:] = [fn]


def run_cross(paths: list[Path], docs: list[dict[str, Any]], th: Thresholds,
              rules: list[str] | None = None) -> tuple[list[str], list[Finding]]:
    """(names of the cross rules run, their findings) over the fleet."""
    view = FleetView(paths, docs, _MERGER[0] if _MERGER else None)
    names = [n for n in CROSS_RULES if not rules or n in rules]
    out: list[Finding] = []
    for n in names:
        out.extend(CROSS_RULES[n](view, th))
    for i, f in enumerate(out):
        f.id = f.id or f"fleet-{i + 1}-{f.rule}"
    return names, out
