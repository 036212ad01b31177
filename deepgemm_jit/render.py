"""Jinja2 rendering of kernel sources, and the headers each source includes.

The one ``jinja2.Environment`` of the package lives here. A render produces the
source text plus every ``dgjit/...`` header it includes (transitively), by
name and content: NVRTC receives the headers in memory (no ``-I`` path), and the
cache key hashes exactly these bytes, so editing a header invalidates the
kernels that include it and nothing else.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2

from . import dtypes, env

_INCLUDE = re.compile(r'[ \t]*#[ \t]*include[ \t]+"(dgjit/[^"]+)"')


def _includes(text: str) -> list[str]:
    """The dgjit headers `text` includes. Only lines mentioning "include" are matched: a MULTILINE regex over
    the whole text tried every line start and cost ~1.8 ms per 145 KB of headers, a third of a warm load."""
    return [m.group(1) for line in text.splitlines() if "include" in line for m in [_INCLUDE.match(line)] if m]


def templates_dir() -> Path:
    """`templates/` shipped inside the wheel, or at the top of a source checkout, unless
    DEEPGEMM_JIT_TEMPLATES_DIR names another copy (kernel experiments)."""
    override = env.templates_dir_override()
    if override is not None:
        if not (override / "include" / "dgjit").is_dir():
            raise FileNotFoundError(f"DEEPGEMM_JIT_TEMPLATES_DIR={override} has no include/dgjit/")
        return override
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "templates"):
        if (candidate / "include" / "dgjit").is_dir():
            return candidate
    raise FileNotFoundError(
        f"deepgemm-jit templates not found next to {here}; the installation is incomplete")


def _cpp_bool(value: object) -> str:
    if not isinstance(value, bool):
        raise TypeError(f"cpp_bool expects a bool, got {value!r}")
    return "true" if value else "false"


def _cpp_storage(dtype_name: str) -> str:
    return dtypes.get(dtype_name).cpp_storage


class _TemplateBytecodeCache(jinja2.FileSystemBytecodeCache):
    """Jinja's compiled templates on disk beside the kernels (keyed by template source, so an edited
    template is recompiled): saves 5-9 ms per template in every new process. A cache directory that
    cannot be used only costs that time again."""

    def load_bytecode(self, bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except (OSError, ValueError, EOFError):
            pass

    def dump_bytecode(self, bucket) -> None:
        try:
            Path(self.directory).mkdir(parents=True, exist_ok=True)
            super().dump_bytecode(bucket)
        except OSError:
            pass


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    if env.disk_cache_disabled():
        return None
    return _TemplateBytecodeCache(str(env.cache_dir() / "jinja"))


@functools.lru_cache(maxsize=None)
def _environment(root: str) -> jinja2.Environment:
    env_ = jinja2.Environment(
        loader=jinja2.FileSystemLoader(root),
        bytecode_cache=_bytecode_cache(),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env_.filters["cpp_bool"] = _cpp_bool
    env_.filters["cpp_storage"] = _cpp_storage
    return env_


@dataclass(frozen=True)
class RenderedSource:
    name: str                          # file name given to NVRTC, e.g. "gemm_sm80.cu"
    source: str
    headers: tuple[tuple[str, str], ...]  # (include name, contents), sorted by name
    entry: str                         # the extern "C" kernel name


@functools.lru_cache(maxsize=256)
def _read_header(path: str, mtime_ns: int, size: int) -> tuple[str, tuple[str, ...]]:
    """(contents, the dgjit headers it includes). Keyed by modification time and size so that an
    edited header is read again; the cache key itself always hashes the contents."""
    text = Path(path).read_text(encoding="utf-8")
    return text, tuple(_includes(text))


def collect_headers(source: str, include_root: Path) -> tuple[tuple[str, str], ...]:
    """Every ``#include "dgjit/..."`` reachable from `source`, with contents."""
    found: dict[str, str] = {}
    pending = _includes(source)
    while pending:
        name = pending.pop()
        if name in found:
            continue
        path = include_root / name
        try:
            st = path.stat()
        except FileNotFoundError:
            raise FileNotFoundError(f"kernel header {name!r} not found under {include_root}") from None
        text, includes = _read_header(str(path), st.st_mtime_ns, st.st_size)
        found[name] = text
        pending.extend(includes)
    return tuple(sorted(found.items()))


@functools.lru_cache(maxsize=16)
def _source_files(root: str) -> tuple[str, ...]:
    """The files source_digest() covers for one templates root (listed once per process: adding a file to
    the templates is not an edit a running process needs to see; editing one is, through its stat)."""
    templates = Path(root)
    package = Path(__file__).resolve().parent
    files = [p for pattern in ("*.j2", "include/dgjit/*") for p in templates.glob(pattern)]
    files += [package / name for name in _RENDERING_MODULES]
    return tuple(sorted(str(p) for p in files if p.is_file()))


# The package's modules whose code shapes a rendered source beyond the fields of the render context: the
# filters here, the spec/config/epilogue properties templates read, dtype tables, the template choice.
_RENDERING_MODULES = ("render.py", "spec.py", "config.py", "epilogue.py", "dtypes.py", "jit.py")


@functools.lru_cache(maxsize=64)
def _files_digest(signature: tuple[tuple[str, int, int], ...]) -> str:
    """SHA-256 over the names (parent directory and file name, never absolute paths) and contents of the files
    `signature` lists as (path, mtime_ns, size): the memo key, so an edited file is read again; the digest
    itself hashes contents only."""
    h = hashlib.sha256()
    for name, _, _ in signature:
        path = Path(name)
        h.update(f"{path.parent.name}/{path.name}".encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def source_digest() -> str:
    """A digest of everything besides the render context that a kernel's rendered source depends on: the
    templates and headers under ``templates_dir()`` and the package modules that shape rendering
    (``_RENDERING_MODULES``: filters, spec/config/epilogue properties, dtype tables). The render index of the disk cache keys on it; a change to any of these files changes it."""
    signature = []
    for name in _source_files(str(templates_dir())):
        st = os.stat(name)
        signature.append((name, st.st_mtime_ns, st.st_size))
    return _files_digest(tuple(signature))


def render(template: str, entry: str, **context) -> RenderedSource:
    root = templates_dir()
    source = _environment(str(root)).get_template(template).render(entry=entry, **context)
    name = template[:-3] if template.endswith(".j2") else template
    return RenderedSource(name=name, source=source, headers=collect_headers(source, root / "include"),
                          entry=entry)
