"""(spec, config, arch) -> compiled kernel, rendering and compiling at most once.

Order of look-ups: the in-process memo, then the disk cache, then NVRTC (under
the cache's cross-process lock).
"""
from __future__ import annotations

import dataclasses
import sys
import threading
import time
from dataclasses import dataclass

from . import __version__, cache, compiler, env
from .config import KernelConfig
from .errors import KernelNotCachedError
from .render import RenderedSource, render
from .spec import GemmSpec

_TEMPLATES = {"sm80": ("gemm_sm80.cu.j2", "dgjit_gemm_sm80"),
              "sm90": ("gemm_sm90.cu.j2", "dgjit_gemm_sm90")}


@dataclass(frozen=True)
class KernelArtifact:
    spec: GemmSpec
    config: KernelConfig
    arch: str
    key: str
    entry: str
    cubin: bytes
    meta: dict
    compiled_now: bool  # this process ran NVRTC for it (False: memo or disk)

    @property
    def cubin_path(self) -> str | None:
        c = cache.default_cache()
        return str(c.cubin_path(self.key)) if c is not None else None


_memo: dict[tuple, KernelArtifact] = {}
_memo_lock = threading.Lock()


def render_kernel(spec: GemmSpec, config: KernelConfig) -> RenderedSource:
    template, entry = _TEMPLATES[config.family]
    return render(template, entry, spec=spec, cfg=config, tag=f"{spec.tag}_{config.tag}")


def get_kernel(spec: GemmSpec, config: KernelConfig, arch: str) -> KernelArtifact:
    memo_key = (spec, config, arch)
    hit = _memo.get(memo_key)
    if hit is not None:
        return hit
    with _memo_lock:
        hit = _memo.get(memo_key)
        if hit is not None:
            return hit
        artifact = _build(spec, config, arch)
        _memo[memo_key] = dataclasses.replace(artifact, compiled_now=False)
        return artifact


def _build(spec: GemmSpec, config: KernelConfig, arch: str) -> KernelArtifact:
    config.check_for(spec, arch)
    rendered = render_kernel(spec, config)
    options = compiler.compile_options(arch)
    nvrtc_version = compiler.nvrtc_version()
    key = cache.kernel_key(source=rendered.source, headers=rendered.headers, options=options,
                           nvrtc_version=nvrtc_version, arch=arch, package_version=__version__)

    def build() -> tuple[bytes, dict]:
        start = time.perf_counter()
        result = compiler.compile_cubin(rendered, arch)
        seconds = time.perf_counter() - start
        if env.verbose():
            print(f"deepgemm-jit: compiled {spec.tag} {config.tag} for {arch} in {seconds:.2f} s",
                  file=sys.stderr)
        meta = {
            "name": f"{spec.tag}_{config.tag}",
            "entry": rendered.entry,
            "arch": arch,
            "spec": dataclasses.asdict(spec),
            "config": dataclasses.asdict(config),
            "package_version": __version__,
            "nvrtc_version": list(nvrtc_version),
            "options": list(options),
            "compile_seconds": round(seconds, 4),
            "registers": result.registers,
            "stack_bytes": result.stack_bytes,
            "spill_store_bytes": result.spill_store_bytes,
            "spill_load_bytes": result.spill_load_bytes,
            "static_smem_bytes": result.static_smem_bytes,
            "dynamic_smem_bytes": config.smem_bytes(spec),
            "num_threads": config.num_threads,
            "log": result.log,
        }
        return result.cubin, meta

    store = cache.default_cache()
    missing = None
    if env.offline():
        def missing() -> Exception:
            return KernelNotCachedError(
                f"DEEPGEMM_JIT_OFFLINE=1 and kernel {spec.tag} {config.tag} for {arch} is not in the cache "
                f"({store.root if store is not None else 'disk cache disabled'})",
                spec_tag=spec.tag, config_tag=config.tag, arch=arch,
                cache_dir=str(store.root) if store is not None else None)
    entry, compiled_now = cache.get_or_build(store, key, build, missing)
    if env.verbose() and not compiled_now:
        print(f"deepgemm-jit: loaded {spec.tag} {config.tag} for {arch} from the cache", file=sys.stderr)
    return KernelArtifact(spec=spec, config=config, arch=arch, key=key, entry=rendered.entry,
                          cubin=entry.cubin, meta=entry.meta, compiled_now=compiled_now)


def clear_memo() -> None:
    with _memo_lock:
        _memo.clear()
