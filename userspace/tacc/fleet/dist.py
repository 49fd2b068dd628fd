"""Per-capture analysis of many captures on Dask distributed, then the cross rules.

``--scheduler``: ``local`` (a ``LocalCluster`` on 127.0.0.1, one single-threaded worker
process per ``--workers``), ``tcp://HOST:PORT`` (a running scheduler: its workers need
tacc installed and the captures at the same paths) or ``serial`` (in this process, no
Dask).  Each task opens one capture by path and returns its findings.json document, so
only paths and small documents cross the network.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tacc.errors import TaccError, UsageError

from .deps import require

SCHEDULER_HELP = "local | serial | tcp://HOST:PORT (tls:// too)"
# how long a tcp:// or tls:// scheduler may take to answer before analyze gives up
CONNECT_TIMEOUT = "5s"
FLEET_SCHEMA = "tacc-fleet-findings"
FLEET_VERSION = 1


def analyze_one(path: str, thresholds: dict[str, Any], rules: list[str] | None
                ) -> dict[str, Any]:
    """One capture's findings.json document (runs on a worker)."""
    from tacc.analyze.engine import analyze, to_json
    from tacc.analyze.rules import RULES, Thresholds
    from tacc.capture import open_capture

    th = Thresholds(**thresholds)
    cap = open_capture(path)
    per = [r for r in rules if r in RULES] if rules else None
    if rules and not per:
        return to_json(cap, [], th)
    return to_json(cap, analyze(cap, th, per), th)


def check_scheduler(spec: str) -> str:
    scheme, _, addr = spec.partition("://")
    if spec in ("local", "serial") or (scheme in ("tcp", "tls") and ":" in addr):
        return spec
    raise UsageError(f"analyze: --scheduler {spec}: not a scheduler ({SCHEDULER_HELP})")


@contextmanager
def client(spec: str, workers: int) -> Iterator[Any]:
    """A Dask client on ``spec`` (a LocalCluster for ``local``, closed afterwards)."""
    dask = require("dask")
    distributed = require("distributed")
    if spec == "local":
        # the workers' statistical profiler samples every thread each 10 ms: on 2 shared
        # cores it cost ~1/3 of a task's time (tools/bench/bench_fleet.py)
        dask.config.set({"distributed.worker.profile.enabled": False})
        cluster = distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address=None, silence_logs=logging.ERROR)
        try:
            with distributed.Client(cluster) as c:
                yield c
        finally:
            cluster.close()
        return
    try:
        c = distributed.Client(spec, timeout=CONNECT_TIMEOUT)
    except (OSError, TimeoutError) as exc:
        raise TaccError(f"analyze: cannot reach the Dask scheduler {spec}: "
                           f"{' '.join(str(exc).split())}") from None
    try:
        yield c
    finally:
        c.close()


def analyze_many(paths: list[Path], thresholds: dict[str, Any], rules: list[str] | None,
                 scheduler: str = "local", workers: int = 0) -> list[dict[str, Any]]:
    """findings.json documents of ``paths`` (in order), computed on ``scheduler``."""
    args = [str(p.resolve()) for p in paths]
    if scheduler == "serial":
        return [analyze_one(p, thresholds, rules) for p in args]
    n = workers or max(1, min(len(args), os.cpu_count() or 1))
    with client(scheduler, n) as c:
        futs = c.map(analyze_one, args, thresholds=thresholds, rules=rules, pure=False)
        return list(c.gather(futs))


def fleet_doc(paths: list[Path], docs: list[dict[str, Any]], thresholds: dict[str, Any],
              rules: list[str] | None, scheduler: str) -> dict[str, Any]:
    """The per-capture documents and the cross rules' findings over them."""
    from tacc import __version__
    from tacc.analyze.cross import run_cross
    from tacc.analyze.rules import Thresholds

    names, cross = run_cross(paths, docs, Thresholds(**thresholds), rules)
    return {"schema": FLEET_SCHEMA, "version": FLEET_VERSION,
            "generator": f"tacc {__version__}", "scheduler": scheduler,
            "captures": docs,
            "cross": {"rules": names, "findings": [f.to_json() for f in cross]}}
