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
import posixpath
import re
import time
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
    return _installed_templates_dir()


def _package_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


@functools.lru_cache(maxsize=None)
def _installed_templates_dir() -> Path:
    """Found once per process (probing cost ~0.15 ms a call); symlinks are resolved only when the templates
    are not found beside the package's path as imported (each resolved component costs a system call)."""
    def beside(package: str) -> str | None:
        for candidate in (os.path.join(package, "templates"), os.path.join(os.path.dirname(package), "templates")):
            if os.path.isdir(os.path.join(candidate, "include", "dgjit")):
                return candidate
        return None

    here = _package_dir()
    found = beside(here) or beside(os.path.realpath(here))
    if found is not None:
        return Path(found)
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
        except Exception:  # unreadable, truncated or damaged (pickle raises UnpicklingError): render from source
            bucket.reset()

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


class _Loader(jinja2.FileSystemLoader):
    """FileSystemLoader whose up-to-date check is the file's whole stat signature (_stat_signature: device, inode,
    size, mtime, ctime), not its mtime alone: an edit that puts mtime back (os.utime, cp -p, rsync -a, an archive)
    or lands in the same timestamp tick must be rendered, else source_digest (which hashes the new file) would
    index the old template's key for the new files. A template changed within _RACY_NS is reloaded every time."""

    def get_source(self, environment, template):
        # The file's signature is taken before super() reads it: an edit in between fails the next check.
        pieces = jinja2.loaders.split_template_path(template)
        paths = [posixpath.join(base, *pieces) for base in self.searchpath]
        path = next((os.path.normpath(p) for p in paths if os.path.isfile(p)), None)
        signature, settled = _stat_signature(path) if path is not None else (None, False)
        source, filename, _ = super().get_source(environment, template)

        def uptodate() -> bool:
            try:
                return settled and filename == path and _stat_signature(filename)[0] == signature
            except OSError:
                return False

        return source, filename, uptodate


@functools.lru_cache(maxsize=None)
def _environment(root: str) -> jinja2.Environment:
    env_ = jinja2.Environment(
        loader=_Loader(root),
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


# A file whose modification (mtime) or inode change (ctime) is this recent may still change within the same
# timestamp tick without its stat changing (git's "racily clean" entries): its contents are never memoized.
_RACY_NS = 2_000_000_000


def _stat_signature(path: str) -> tuple[tuple[int, ...], bool]:
    """((device, inode, size, mtime_ns, ctime_ns), settled) of `path`. The signature decides when a memoized
    read or hash of the file is reused: an edit changes ctime even when the editor (or os.utime) puts mtime
    and size back, and a copy or re-install changes the inode. `settled`: older than _RACY_NS, so memoizable."""
    now = time.time_ns()
    st = os.stat(path)
    return ((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns),
            max(st.st_mtime_ns, st.st_ctime_ns) <= now - _RACY_NS)


def _parse_header(text: str) -> tuple[str, tuple[str, ...]]:
    return text, tuple(_includes(text))


@functools.lru_cache(maxsize=256)
def _read_header(path: str, signature: tuple[int, ...]) -> tuple[str, tuple[str, ...]]:
    """(contents, the dgjit headers it includes), memoized by stat signature so that an edited header is read
    again; the cache key itself always hashes the contents."""
    return _parse_header(Path(path).read_text(encoding="utf-8"))


def collect_headers(source: str, include_root: Path) -> tuple[tuple[str, str], ...]:
    """Every ``#include "dgjit/..."`` reachable from `source`, with contents."""
    found: dict[str, str] = {}
    pending = _includes(source)
    while pending:
        name = pending.pop()
        if name in found:
            continue
        if "/" in name[len("dgjit/"):]:  # source_digest (the render index) lists include/dgjit/ only, not below it
            raise ValueError(f"kernel header {name!r}: headers sit directly in include/dgjit/ (source_digest does not "
                             "cover subfolders, so edits there would not invalidate the render index)")
        path = include_root / name
        try:
            signature, settled = _stat_signature(str(path))
        except FileNotFoundError:
            raise FileNotFoundError(f"kernel header {name!r} not found under {include_root}") from None
        text, includes = (_read_header(str(path), signature) if settled
                          else _parse_header(path.read_text(encoding="utf-8")))
        found[name] = text
        pending.extend(includes)
    return tuple(sorted(found.items()))


def _files_in(directory: str, suffix: str) -> list[str]:
    try:
        with os.scandir(directory) as entries:
            return [e.path for e in entries if e.name.endswith(suffix) and e.is_file()]
    except FileNotFoundError:
        return []


def _template_dirs(root: str) -> tuple[str, str]:
    return root, os.path.join(root, "include", "dgjit")


def _scan_templates(root: str) -> list[str]:
    """The templates and headers source_digest() covers (os.scandir: Path.glob cost ~0.9 ms a process)."""
    top, headers = _template_dirs(root)
    return _files_in(top, ".j2") + _files_in(headers, "")


def _with_labels(paths: list[str]) -> tuple[tuple[str, str], ...]:
    """(path, label: parent directory and file name) of each file and rendering module, sorted by path."""
    paths = paths + [os.path.join(_package_dir(), name) for name in _RENDERING_MODULES]
    return tuple((path, "/".join(path.rsplit(os.sep, 2)[-2:])) for path in sorted(paths))


# The package's modules whose code shapes a rendered source beyond the fields of the render context: the
# filters here, the spec/config/epilogue properties templates read, dtype tables, the template choice, and the tile
# arithmetic KernelConfig's methods take from sm90_tiles (threads, shared memory: stored beside each cubin).
# source_digest skips any installed without its source. (The list lives in __init__, which stats the files before
# importing them.)
from . import _RENDERING_MODULES  # noqa: E402


def rendering_code_is_current() -> bool:
    """Whether the rendering modules' files are still those this process imported (the package's __init__ took
    their stat signatures before importing them). source_digest hashes the files as they are now, the process
    renders with the code it loaded: after an update under a running process (git pull, pip install -e) the
    two differ, and indexing the old code's render under the new files' digest would hand that kernel to every
    later process. The render index is then not used (jit.build_artifact): it renders and keys as always."""
    from . import _IMPORTED_RENDERING_MODULE_STATS, _rendering_module_stats

    return _rendering_module_stats() == _IMPORTED_RENDERING_MODULE_STATS

# Per process: templates root -> (the files source_digest() covers, the template directories' settled stat
# signatures taken before they were listed, or None), listed once: adding a file to the templates is not an
# edit a running process needs to see; editing one is, through its stat. And path -> (stat signature, SHA-256
# of the contents) of the settled files hashed or found in a disk memo, an entry counting only while the file's
# signature is unchanged.
_listings: dict[str, tuple[tuple[tuple[str, str], ...], list[list[int]] | None]] = {}
_hashes: dict[str, tuple[tuple[int, ...], bytes]] = {}
_MEMO_FORMAT = 1


@functools.lru_cache(maxsize=16)
def _memo_name(root: str) -> str:
    """The disk memo of one installation (templates root and package directory): installs sharing a cache
    keep separate memos instead of overwriting each other's."""
    return hashlib.sha256(f"{root}\0{_package_dir()}".encode()).hexdigest()[:16]


def _ints(value: object, n: int) -> bool:
    return isinstance(value, list) and len(value) == n and all(type(x) is int for x in value)


def _dir_signatures(root: str) -> list[list[int]] | None:
    """The stat signatures of the template directories when all are settled, else None."""
    try:
        signatures = [_stat_signature(d) for d in _template_dirs(root)]
    except OSError:
        return None
    return [list(sig) for sig, settled in signatures] if all(settled for _, settled in signatures) else None


def _memo_entry(value: object) -> tuple[tuple[int, ...], bytes] | None:
    """A memo's [device, inode, size, mtime_ns, ctime_ns, SHA-256 in hex] as (signature, digest), or None."""
    if not (isinstance(value, list) and len(value) == 6 and _ints(value[:5], 5) and isinstance(value[5], str)
            and len(value[5]) == 64):
        return None
    try:
        return tuple(value[:5]), bytes.fromhex(value[5])
    except ValueError:
        return None


def _read_disk_memo(store, root: str
                    ) -> tuple[dict[str, tuple[tuple[int, ...], bytes]], list[str] | None, list[list[int]] | None]:
    """(file hashes, listing, directory signatures) that a previous process recorded in `store`
    (cache.DiskCache.files_memo_get). The listing of the templates counts (else None) only while the template
    directories have the stat signatures recorded before they were listed (adding, removing or renaming a file
    changes a directory's mtime and ctime). Entries of any other shape are dropped: an absent, unreadable or
    garbage memo is empty, never an error."""
    raw = store.files_memo_get(_memo_name(root)) if store is not None else None
    if not isinstance(raw, dict) or raw.get("format") != _MEMO_FORMAT:
        return {}, None, None
    files, dirs, listing = raw.get("files"), raw.get("dirs"), raw.get("listing")
    entries = ((path, _memo_entry(v)) for path, v in files.items()) if isinstance(files, dict) else ()
    hashes = {path: entry for path, entry in entries if entry is not None}
    if not (isinstance(dirs, list) and len(dirs) == 2 and all(_ints(d, 5) for d in dirs)
            and isinstance(listing, list) and all(isinstance(p, str) for p in listing)):
        return hashes, None, None
    try:
        same = all(_stat_signature(d)[0] == tuple(recorded) for d, recorded in zip(_template_dirs(root), dirs))
    except OSError:
        same = False
    return (hashes, listing, dirs) if same else (hashes, None, None)


def _hash_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).digest()


def source_digest(store=None) -> str:
    """A digest of everything besides the render context that a kernel's rendered source depends on: the
    templates and headers under ``templates_dir()`` and the package modules that shape rendering
    (``_RENDERING_MODULES``: filters, spec/config/epilogue properties, dtype tables). The render index of the
    disk cache keys on it; a change to any of these files changes it.

    It hashes the names (parent directory and file name, never absolute paths) and contents only. Listing,
    reading and hashing the ~145 KB once per process cost ~2.5 ms of a fresh process's first warm load, so
    each file's hash is memoized by its stat signature (device, inode, size, mtime, ctime; ``_stat_signature``)
    in this process and, with `store` (a cache.DiskCache), in a memo file of the cache for the next processes,
    with the listing of the template directories (valid while their signatures hold). An edit changes ctime
    even if mtime and size are forced back; a file or directory changed within the last ``_RACY_NS`` is read
    again on every call and never memoized; a memo that does not match is ignored and rewritten."""
    root = str(templates_dir())
    disk = None
    listed = _listings.get(root)
    scanned = False
    if listed is None:
        disk, listing, dirs = _read_disk_memo(store, root)
        scanned = listing is None
        if scanned:
            dirs = _dir_signatures(root)  # before listing: a file added meanwhile changes them again
            listing = _scan_templates(root)
        listed = _listings[root] = (_with_labels(listing), dirs)
    files, dirs = listed
    fresh = False
    h = hashlib.sha256()
    for path, label in files:
        try:
            signature, settled = _stat_signature(path)
        except FileNotFoundError:  # a rendering module installed without its source, a removed header
            continue
        known = _hashes.get(path)
        if known is None or known[0] != signature:
            if disk is None:
                disk = _read_disk_memo(store, root)[0]
            known = disk.get(path)
            if known is not None and known[0] == signature:  # recorded only when settled: equal means settled
                _hashes[path] = known
            else:
                known = (signature, _hash_file(path))
                if settled:
                    _hashes[path], fresh = known, True
                else:
                    _hashes.pop(path, None)
        h.update(label.encode() + b"\0" + known[1])
    if (fresh or scanned) and store is not None:
        memo = {"format": _MEMO_FORMAT, "files": {path: [*_hashes[path][0], _hashes[path][1].hex()]
                                                  for path, _ in files if path in _hashes}}
        if dirs is not None:  # else the next process lists the directories again
            memo["dirs"] = dirs
            memo["listing"] = [path for path, _ in files if os.path.dirname(path) in _template_dirs(root)]
        store.files_memo_put(_memo_name(root), memo)
    return h.hexdigest()


def render(template: str, entry: str, **context) -> RenderedSource:
    root = templates_dir()
    source = _environment(str(root)).get_template(template).render(entry=entry, **context)
    name = template[:-3] if template.endswith(".j2") else template
    return RenderedSource(name=name, source=source, headers=collect_headers(source, root / "include"),
                          entry=entry)
