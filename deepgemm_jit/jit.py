"""(spec, config, arch) -> compiled kernel, rendering and compiling at most once.

Order of look-ups: the in-process memo, then the disk cache, then NVRTC (under
the cache's cross-process lock). ``build_artifact`` is the disk-cache-then-NVRTC step for any rendered
source (the GEMMs here, the quantization kernels in ``quantization.py``) and ``Memo`` the memo in front of
it, so that every kernel family follows the same cache rules; ``KernelFamily`` puts the two together for the
families with a template of their own (gemv, gemv_kn, copies, quantization, fp32x3).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Generic, Hashable, TypeVar

from . import __version__, cache, compiler, env
from . import render as render_mod
from .config import KernelConfig
from .errors import KernelNotCachedError
from .render import RenderedSource, render
from .sm90_tiles import sm90_quant_cluster
from .spec import GemmSpec

_INDEX_FORMAT = 1  # bump when what render_id / the index digest covers changes
_TEMPLATES = {"sm80": ("gemm_sm80.cu.j2", "dgjit_gemm_sm80"),
              "sm90": ("gemm_sm90.cu.j2", "dgjit_gemm_sm90")}


@dataclass(frozen=True)
class BuiltKernel:
    """One rendered source compiled for one arch, as the disk cache holds it (any kernel family; each family's
    artifact adds what it was built for)."""
    key: str
    entry: str
    cubin: bytes
    meta: dict
    compiled_now: bool  # this process ran NVRTC for it (False: memo or disk)


@dataclass(frozen=True)
class KernelArtifact(BuiltKernel):
    spec: GemmSpec
    config: KernelConfig
    arch: str

    @property
    def cubin_path(self) -> str | None:
        """The cubin's file in the disk cache, or None where it is not there (the cache off or unusable: the
        kernel then lives in this process's memory only)."""
        c = cache.default_cache()
        if c is None:
            return None
        path = c.cubin_path(self.key)
        return str(path) if path.is_file() else None


Artifact = TypeVar("Artifact")


class Memo(Generic[Artifact]):
    """The in-process memo of one kernel family: key -> artifact (a dataclass with ``compiled_now``), built
    at most once per process and templates directory; the stored copy says ``compiled_now=False`` (only the call
    that built it reports what the build did)."""

    def __init__(self) -> None:
        self._items: dict[Hashable, Artifact] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], Artifact]) -> Artifact:
        # The templates a kernel renders from are part of what it is: a process that points
        # DEEPGEMM_JIT_TEMPLATES_DIR at another copy (A/B experiments, scripts/exp_*.py) gets that copy's kernels.
        key = (key, env.templates_dir_override())
        hit = self._items.get(key)
        if hit is not None:
            return hit
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                return hit
            artifact = build()
            self._items[key] = dataclasses.replace(artifact, compiled_now=False)
            return artifact

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


class KernelFamily(Generic[Artifact]):
    """A kernel family with a template of its own (decode, copies, quantization, the 3xTF32 split): a spec (frozen
    dataclass with ``entry`` and ``tag``) renders `template`, builds through ``build_artifact`` and is memoized per
    process and templates directory. `artifact` is the family's BuiltKernel subclass, made with the spec and arch;
    its metadata records the spec under `meta_key` (and `extra_meta`); `check` runs on each newly built artifact
    (e.g. the module's mirror of the kernel's exported sizes)."""

    def __init__(self, template: str, artifact: type, meta_key: str, extra_meta: dict | None = None,
                 check: Callable[[Artifact], None] | None = None) -> None:
        self.template, self.artifact, self.meta_key = template, artifact, meta_key
        self.extra_meta, self.check = extra_meta or {}, check
        self._memo: Memo[Artifact] = Memo()

    def render(self, spec) -> RenderedSource:
        return render(self.template, spec.entry, spec=spec, tag=spec.tag)

    def get(self, spec, arch: str) -> Artifact:
        """The kernel of `spec` for `arch`: from the in-process memo, the disk cache, or NVRTC (once)."""
        return self._memo.get((spec, arch), lambda: self._build(spec, arch))

    def clear(self) -> None:
        self._memo.clear()

    def memoized(self) -> int:
        """Kernels in the in-process memo (tests: what a call built)."""
        return len(self._memo._items)

    def _build(self, spec, arch: str) -> Artifact:
        built = build_artifact(self.render(spec), arch, spec_tag=spec.tag,
                               meta={self.meta_key: dataclasses.asdict(spec), **self.extra_meta})
        artifact = self.artifact(**vars(built), spec=spec, arch=arch)
        if self.check is not None:
            self.check(artifact)
        return artifact


_memo: Memo[KernelArtifact] = Memo()


def render_kernel(spec: GemmSpec, config: KernelConfig) -> RenderedSource:
    template, entry = _TEMPLATES[config.family]
    cluster_n = sm90_quant_cluster(spec, config.block_n) if config.family == "sm90" else 1
    return render(template, entry, spec=spec, cfg=config, cluster_n=cluster_n, tag=f"{spec.tag}_{config.tag}")


def get_kernel(spec: GemmSpec, config: KernelConfig, arch: str) -> KernelArtifact:
    return _memo.get((spec, config, arch), lambda: _build(spec, config, arch))


def _build(spec: GemmSpec, config: KernelConfig, arch: str) -> KernelArtifact:
    config.check_for(spec, arch)
    template, entry = _TEMPLATES[config.family]
    # What render_kernel's output is a function of, besides the files source_digest() covers.
    render_id = f"{template}|{entry}|{spec!r}|{config!r}"
    built = build_artifact(lambda: render_kernel(spec, config), arch, spec_tag=spec.tag, config_tag=config.tag,
                           render_id=render_id,
                           meta=lambda: {"spec": dataclasses.asdict(spec), "config": dataclasses.asdict(config),
                                         "dynamic_smem_bytes": config.smem_bytes(spec),
                                         "num_threads": config.num_threads})
    return KernelArtifact(**vars(built), spec=spec, config=config, arch=arch)


def build_artifact(rendered: RenderedSource | Callable[[], RenderedSource], arch: str, *, spec_tag: str,
                   config_tag: str = "", meta: dict | Callable[[], dict], render_id: str | None = None
                   ) -> BuiltKernel:
    """`rendered` compiled for `arch`: from the disk cache, else by NVRTC (once across processes) into it.

    The cache key hashes what determines the cubin and nothing else (``cache.kernel_key``: the source, its
    headers, the compile options, NVRTC's version, the arch, the package version), so one source has one key
    whichever family renders it. `spec_tag` and `config_tag` (empty for kernels without a config) name the
    kernel in messages and in the metadata (``name``: the tags joined by ``_``); `meta` is what the
    metadata records about it besides the compile facts (its spec, its launch sizes; a callable is called only
    when the kernel is compiled). With
    DEEPGEMM_JIT_OFFLINE=1 a kernel missing from the cache raises KernelNotCachedError (the caller adds
    the warmup line, which it alone knows). With `render_id` (a string naming the render context completely,
    e.g. template, entry and the reprs of spec and config) `rendered` may be a callable: a kernel found
    through the cache's render index is then loaded without rendering at all.

    Example::

        built = build_artifact(render("quantize.cu.j2", "dgjit_quantize", spec=spec, tag=spec.tag), "sm_90a",
                               spec_tag=spec.tag, meta={"quant_spec": dataclasses.asdict(spec)})
    """
    label = f"{spec_tag} {config_tag}" if config_tag else spec_tag
    options = compiler.compile_options(arch)
    nvrtc_version = compiler.nvrtc_version()
    store = cache.default_cache()
    # Render index: with `render_id` (the render context; `rendered` may then be a callable that renders), a
    # kernel this cache has seen rendered from the same files loads without rendering (cache.py's rules).
    render_digest = None
    if render_id is not None and store is not None and render_mod.rendering_code_is_current():
        def digest() -> str:
            return hashlib.sha256(json.dumps(
                [_INDEX_FORMAT, render_id, render_mod.source_digest(store), list(options), list(nvrtc_version),
                 arch, __version__]).encode()).hexdigest()

        render_digest = digest()
        indexed = store.index_get(render_digest)
        entry = store.load(indexed, repair=False) if indexed is not None else None  # (repaired under the lock)
        if entry is not None and isinstance(entry.meta.get("entry"), str):
            if env.verbose():
                print(f"deepgemm-jit: loaded {label} for {arch} from the cache", file=sys.stderr)
            return BuiltKernel(key=indexed, entry=entry.meta["entry"], cubin=entry.cubin, meta=entry.meta,
                               compiled_now=False)
    if callable(rendered):
        rendered = rendered()
        if render_digest is not None and digest() != render_digest:
            render_digest = None  # a file changed while rendering: the index must not map the old files to it
    key = cache.kernel_key(source=rendered.source, headers=rendered.headers, options=options,
                           nvrtc_version=nvrtc_version, arch=arch, package_version=__version__)

    def build() -> tuple[bytes, dict]:
        start = time.perf_counter()
        result = compiler.compile_cubin(rendered, arch)
        seconds = time.perf_counter() - start
        if env.verbose():
            print(f"deepgemm-jit: compiled {label} for {arch} in {seconds:.2f} s", file=sys.stderr)
        return result.cubin, {
            "name": f"{spec_tag}_{config_tag}" if config_tag else spec_tag,
            "entry": rendered.entry,
            "arch": arch,
            **(meta() if callable(meta) else meta),
            "package_version": __version__,
            "nvrtc_version": list(nvrtc_version),
            "options": list(options),
            "compile_seconds": round(seconds, 4),
            "registers": result.registers,
            "stack_bytes": result.stack_bytes,
            "spill_store_bytes": result.spill_store_bytes,
            "spill_load_bytes": result.spill_load_bytes,
            "static_smem_bytes": result.static_smem_bytes,
            "log": result.log,
        }

    def missing() -> Exception:  # offline: building is forbidden, an absent entry raises this
        where = str(store.root) if store is not None else None
        return KernelNotCachedError(
            f"DEEPGEMM_JIT_OFFLINE=1 and kernel {label} for {arch} is not in the cache "
            f"({where or 'disk cache disabled'})", spec_tag=spec_tag, config_tag=config_tag, arch=arch,
            cache_dir=where)

    entry, compiled_now = cache.get_or_build(store, key, build, missing if env.offline() else None)
    if render_digest is not None:
        store.index_put(render_digest, key)
    if env.verbose() and not compiled_now:
        print(f"deepgemm-jit: loaded {label} for {arch} from the cache", file=sys.stderr)
    return BuiltKernel(key=key, entry=rendered.entry, cubin=entry.cubin, meta=entry.meta, compiled_now=compiled_now)


def clear_memo() -> None:
    _memo.clear()
