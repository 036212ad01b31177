"""Autotuning: time candidate configs on the GPU, keep the fastest correct one, and remember it.

A tuning result is keyed by what makes timings transferable: GPU name, SM count, compute
capability, driver and NVRTC versions, package version, the spec and the M bucket. It is stored
as one JSON file per key under ``<cache dir>/tuning/``; later processes read it and time nothing.

The tuner does not build kernels itself: ``build`` hands it a function from a config to a callable
GEMM, so that this module needs nothing above the config layer.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import __version__, cache, compiler, env, timing
from .config import KernelConfig
from .config import m_bucket_for as bucket_of  # (functions below name their argument m_bucket)
from .errors import KernelNotCachedError
from .spec import GemmSpec
from .trial import trial_call

FORMAT = 1
TUNE_REPS = 30   # the measuring protocol's minimum (DESIGN.md)
# A challenger replaces the heuristic's config only if it is this much faster head to head.
CONFIRM_LEAD = 1.01


@dataclass(frozen=True)
class DeviceIdentity:
    """What a timing depends on, beyond the kernel itself."""

    name: str
    num_sms: int
    capability: str
    driver: int
    nvrtc: str

    @classmethod
    def current(cls) -> "DeviceIdentity":
        import cupy

        dev = cupy.cuda.runtime.getDevice()
        props = cupy.cuda.runtime.getDeviceProperties(dev)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        major, minor = compiler.nvrtc_version()
        return cls(name=name, num_sms=int(props["multiProcessorCount"]),
                   capability=f"{props['major']}.{props['minor']}", driver=int(cupy.cuda.runtime.driverGetVersion()),
                   nvrtc=f"{major}.{minor}")


def tuning_key(identity: DeviceIdentity, spec: GemmSpec, m_bucket: int) -> str:
    material = {"format": FORMAT, "device": dataclasses.asdict(identity), "package": __version__,
                "spec": dataclasses.asdict(spec), "m_bucket": m_bucket}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _store_dir() -> Path:
    return env.cache_dir() / "tuning"


def lookup(identity: DeviceIdentity, spec: GemmSpec, m_bucket: int) -> KernelConfig | None:
    """The stored winner for this problem on this device, or None (absent, unreadable or stale, or the disk cache
    turned off: DEEPGEMM_JIT_DISABLE_DISK_CACHE reads and writes nothing on disk)."""
    if env.disk_cache_disabled():
        return None
    path = _store_dir() / f"{tuning_key(identity, spec, m_bucket)}.json"
    try:
        record = json.loads(path.read_text())
        return KernelConfig(**record["config"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged record is as good as none: the heuristic serves, tuning rewrites it


def stored_config(spec: GemmSpec, m_hint: int, arch: str) -> KernelConfig | None:
    """The config a build on the current GPU takes from the store for `spec` at M = m_hint (its M bucket), or None:
    no record, or one that no longer fits the spec (e.g. limits changed since it was tuned). build and warmup ask
    this one question, so a warmup on the GPU compiles the kernels its builds will look up."""
    stored = lookup(DeviceIdentity.current(), spec, bucket_of(spec, m_hint, arch))
    return stored if stored is not None and stored.fits(spec, arch) else None


@dataclass(frozen=True)
class TuneResult:
    config: KernelConfig
    table: list[dict]  # one row per candidate: tag, median_us, err, ok (why not)


def tune(identity: DeviceIdentity, spec: GemmSpec, m_bucket: int, candidates: list[KernelConfig],
         make: Callable[[KernelConfig], Callable], *, reps: int = TUNE_REPS) -> TuneResult:
    """Time every candidate on a fresh random call of M = m_bucket (trial.py: the spec's scales and epilogue
    operands too; protocol of DESIGN.md: warm-up, L2 flushed, interleaved, medians), reject any whose result
    misses the float64 value's bound, and store and return the fastest. The first candidate is the heuristic's
    choice: a faster challenger must then beat it again head to head, by at least 1%, to replace it."""
    if not candidates:
        raise ValueError("no candidate configs to tune")
    trial = trial_call(spec, m_bucket)
    table: list[dict] = []
    runnable: dict[str, Callable[[], object]] = {}
    by_tag: dict[str, KernelConfig] = {}
    not_cached = False  # offline mode left a candidate out: a winner among the rest is not worth keeping
    for cfg in candidates:
        row = {"config": cfg.tag, "median_us": None, "err": None, "ok": False, "why": ""}
        table.append(row)
        try:
            gemm = make(cfg)
            outputs = trial.poisoned_outputs()
            err = trial.error(trial.run(gemm, outputs))
        except Exception as exc:  # a candidate that cannot build or run is skipped, with the reason
            row["why"] = f"{type(exc).__name__}: {exc}"[:300]
            not_cached = not_cached or isinstance(exc, KernelNotCachedError)
            continue
        row["err"] = err
        if not trial.within_bound(err):
            row["why"] = f"error {err:.2e} over the bound {trial.bound:.2e}"
            continue
        row["ok"] = True
        runnable[cfg.tag] = (lambda g=gemm, o=outputs: trial.run(g, o))
        by_tag[cfg.tag] = cfg
    if not runnable:
        raise RuntimeError(f"no candidate config ran correctly for {spec.tag} (M={m_bucket}): {table}")
    timings = timing.time_interleaved(runnable, reps=reps)
    for row in table:
        if row["config"] in timings:
            row["median_us"] = timings[row["config"]].median_us
    best_tag = min(timings, key=lambda tag: timings[tag].median_us)
    first_tag = candidates[0].tag
    if best_tag != first_tag and first_tag in runnable:
        # Confirm a challenger against the heuristic head to head: one pass over many candidates has a
        # spread of a few percent, and replacing the heuristic on noise would make tuning a loss.
        duel = timing.time_interleaved({first_tag: runnable[first_tag], best_tag: runnable[best_tag]},
                                       reps=2 * reps)
        lead = duel[first_tag].median_us / duel[best_tag].median_us
        for row in table:
            if row["config"] in duel:
                row["duel_median_us"] = duel[row["config"]].median_us
        if lead < CONFIRM_LEAD:
            best_tag = first_tag
    best = by_tag[best_tag]
    record = {"format": FORMAT, "device": dataclasses.asdict(identity), "package": __version__,
              "spec": dataclasses.asdict(spec), "m_bucket": m_bucket, "config": dataclasses.asdict(best),
              "tuned_at": time.time(), "candidates": table}
    if not_cached or env.disk_cache_disabled():
        # Stored, a pick among the cached candidates only would stop every later process from tuning for good.
        return TuneResult(config=best, table=table)
    directory = _store_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        cache._atomic_write(directory / f"{tuning_key(identity, spec, m_bucket)}.json",
                            json.dumps(record, indent=1).encode())
    except OSError:
        pass  # an unwritable cache only loses the memory of the result, not the result
    return TuneResult(config=best, table=table)
