"""The analysis rules, one per module with its thresholds beside it (docs/analysis.md
documents each rule and its thresholds); :data:`RULES` names them."""

from __future__ import annotations

from dataclasses import dataclass

from tacc.analyze.rules import (
    host_memory,
    idle_gaps,
    imbalance,
    iommu_churn,
    kv_roundtrip,
    launch_bound,
    link_degraded,
    link_saturation,
    load_serialised,
    memory_bound,
    precision,
    redundant_upload,
    serialized_copies,
    small_transfers,
    tlb_thrash,
    vf_contention,
)
from tacc.analyze.rules.base import CommonThresholds, Finding, Rule
from tacc.analyze.rules.host_memory import HostMemoryThresholds
from tacc.analyze.rules.idle_gaps import IdleGapsThresholds
from tacc.analyze.rules.imbalance import ImbalanceThresholds
from tacc.analyze.rules.iommu_churn import IommuChurnThresholds
from tacc.analyze.rules.launch_bound import LaunchBoundThresholds
from tacc.analyze.rules.link_saturation import LinkSaturationThresholds
from tacc.analyze.rules.load_serialised import LoadSerialisedThresholds
from tacc.analyze.rules.memory_bound import MemoryBoundThresholds
from tacc.analyze.rules.precision import PrecisionThresholds
from tacc.analyze.rules.redundant_upload import RedundantUploadThresholds
from tacc.analyze.rules.serialized_copies import SerializedCopiesThresholds
from tacc.analyze.rules.small_transfers import SmallTransfersThresholds
from tacc.analyze.rules.tlb_thrash import TlbThrashThresholds
from tacc.analyze.rules.vf_contention import VfContentionThresholds

# name -> rule, in the order the engine runs them
RULES: dict[str, Rule] = {
    "link_saturation": link_saturation.link_saturation,
    "h2d_d2h_imbalance": imbalance.imbalance,
    "vf_contention": vf_contention.vf_contention,
    "small_transfers": small_transfers.small_transfers,
    "host_memory": host_memory.host_memory,
    "iommu_churn": iommu_churn.iommu_churn,
    "tlb_thrash": tlb_thrash.tlb_thrash,
    "serialized_copies": serialized_copies.serialized_copies,
    "load_serialised": load_serialised.load_serialised,
    "idle_gaps": idle_gaps.idle_gaps,
    "link_degraded": link_degraded.link_degraded,
    "launch_bound": launch_bound.launch_bound,
    "redundant_upload": redundant_upload.redundant_upload,
    "kv_roundtrip": kv_roundtrip.kv_roundtrip,
    "memory_bound": memory_bound.memory_bound,
    "precision": precision.precision,
}


@dataclass
class Thresholds(
    LoadSerialisedThresholds,
    PrecisionThresholds,
    MemoryBoundThresholds,
    RedundantUploadThresholds,
    LaunchBoundThresholds,
    IdleGapsThresholds,
    SerializedCopiesThresholds,
    TlbThrashThresholds,
    IommuChurnThresholds,
    HostMemoryThresholds,
    SmallTransfersThresholds,
    VfContentionThresholds,
    ImbalanceThresholds,
    LinkSaturationThresholds,
    CommonThresholds,
):
    """Every rule's thresholds, one object: the fields in the order of the rules (the
    common ones first), as findings.json lists them."""


__all__ = ["RULES", "Finding", "Rule", "Thresholds"]
