"""Content-addressed on-disk store of compiled kernels (cubin + JSON metadata).

Rules (DESIGN.md, "Cache"):
- The key hashes what determines the cubin: the rendered source, the name and
  contents of every header it includes, the compile options, the NVRTC version,
  the target arch, the package version and the store's format. Never a path, an
  mtime or a ``repr``: the cache stays valid when the package or the cache
  directory moves.
- Writes go to a temporary file in the same directory, are fsynced and renamed
  into place; the cubin first, the JSON (carrying the cubin's SHA-256) last, so
  an entry exists only once both are whole.
- A per-key file lock with a second look after taking it: N processes that want
  the same kernel compile it once.
- A checksum mismatch or unreadable metadata is reported (CacheCorruptionWarning),
  the entry removed, and the kernel rebuilt.
- A cache directory that cannot be written degrades to in-memory compilation with
  one CacheUnavailableWarning, never a crash.
- The render index (``index/``) maps a digest of everything a kernel's source is rendered from (template
  and header contents, the package's Python sources, the render context, options, versions, arch) to its
  key, so that a warm load of a known kernel reads no template or header and renders nothing. It is an
  accelerator only: content-addressed like the key (no paths or mtimes), any unreadable or dangling
  entry is a miss, and the key itself is computed as always whenever the kernel is rendered.
- The source-file memo (``sources/``, render.source_digest) records the content hash of each template,
  header and rendering module with its local stat (device, inode, size, mtime, ctime), and the listing of
  the template directories with theirs, so that a new process need not list, read and hash them for the
  render index. Also an accelerator only: it names local paths (one memo per installation), a stat that
  differs means the file is hashed (the directory listed) again, garbage is ignored, and nothing in the key
  or the index depends on it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from . import env
from .errors import CacheCorruptionWarning, CacheUnavailableWarning

try:
    import fcntl
except ImportError:  # not POSIX: no cross-process lock, the double check still holds
    fcntl = None

FORMAT = 1
_KEY = re.compile(r"[0-9a-f]{64}")


def _read_umask() -> int:
    """The process umask, from /proc where it is (os.umask can only read it by setting it, process-wide: another
    thread creating a file meanwhile would get the temporary value); at import, once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()
TOUCH_INTERVAL_S = 24 * 3600
# A temporary younger than this may be a write in progress in another process (clear leaves it alone).
TMP_GRACE_S = 3600


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def kernel_key(*, source: str, headers: tuple[tuple[str, str], ...], options: tuple[str, ...],
               nvrtc_version: tuple[int, int], arch: str, package_version: str) -> str:
    material = {
        "format": FORMAT,
        "source": _sha256(source.encode()),
        "headers": [[name, _sha256(text.encode())] for name, text in sorted(headers)],
        "options": list(options),
        "nvrtc": list(nvrtc_version),
        "arch": arch,
        "package": package_version,
    }
    return _sha256(json.dumps(material, sort_keys=True, separators=(",", ":")).encode())


@dataclass(frozen=True)
class CacheEntry:
    key: str
    cubin: bytes
    meta: dict


def _atomic_write(path: Path, data: bytes) -> None:
    _replace_file(path, data, durable=True)


def _replace_file(path: Path, data: bytes, *, durable: bool) -> None:
    """Write `data` to a temporary file beside `path` and rename it over `path`; `durable`: fsync first (a
    memo that a crash may leave empty is written without: it is read as garbage, i.e. as no memo)."""
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        # mkstemp makes the file owner-only (0600): a cache warmed by one user (root, a build step) could then not be
        # read by the serving user. The permissions an open() would give, as the cache's folders and locks get.
        if hasattr(os, "fchmod"):  # POSIX (Windows has it from Python 3.13 only)
            os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class DiskCache:
    """The store under one root directory (no I/O happens in the constructor)."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    # -- layout ---------------------------------------------------------------
    def _dir(self, key: str) -> Path:
        return self.root / "kernels" / key[:2]

    def cubin_path(self, key: str) -> Path:
        return self._dir(key) / f"{key}.cubin"

    def meta_path(self, key: str) -> Path:
        return self._dir(key) / f"{key}.json"

    # -- read -------------------------------------------------------------------
    def load(self, key: str, *, repair: bool = True) -> CacheEntry | None:
        """The entry, verified; None when absent. Corrupt entries are reported and removed with `repair` (only
        under the key's lock: another process may have rebuilt the entry since this one read it), else a miss."""
        meta_path = self.meta_path(key)
        try:
            meta_bytes = meta_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError:  # unreadable here (no rights, a file where a folder should be): a miss, not a crash
            return None
        try:
            meta = json.loads(meta_bytes)
            cubin = self.cubin_path(key).read_bytes()
            ok = (isinstance(meta, dict) and meta.get("key") == key
                  and meta.get("cubin_sha256") == _sha256(cubin) and meta.get("cubin_bytes") == len(cubin))
        except (ValueError, OSError, RecursionError) as exc:  # RecursionError: JSON nested past the limit
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        else:
            reason = "checksum mismatch"
        if ok:
            self._touch(meta_path)
        elif not repair:
            return None
        else:
            warnings.warn(f"deepgemm-jit: cache entry {key[:16]} in {self._dir(key)} is corrupt "
                          f"({reason}); removing it and rebuilding", CacheCorruptionWarning, stacklevel=3)
            self.remove(key)
            return None
        return CacheEntry(key=key, cubin=cubin, meta=meta)

    @staticmethod
    def _touch(meta_path: Path) -> None:
        """Record use (the metadata's mtime) for `prune`, at most once a day per entry."""
        try:
            if time.time() - meta_path.stat().st_mtime > TOUCH_INTERVAL_S:
                os.utime(meta_path)
        except OSError:  # a read-only cache still serves
            pass

    # -- write ------------------------------------------------------------------
    def store(self, key: str, cubin: bytes, meta: dict) -> CacheEntry:
        meta = dict(meta, key=key, cubin_sha256=_sha256(cubin), cubin_bytes=len(cubin),
                    format=FORMAT, created=time.time())
        self._dir(key).mkdir(parents=True, exist_ok=True)
        _atomic_write(self.cubin_path(key), cubin)
        _atomic_write(self.meta_path(key), json.dumps(meta, indent=1, sort_keys=True).encode())
        return CacheEntry(key=key, cubin=cubin, meta=meta)

    @contextlib.contextmanager
    def lock(self, key: str) -> Iterator[None]:
        lock_dir = self.root / "locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        path = lock_dir / f"{key}.lock"
        while True:
            f = open(path, "a+b")
            if fcntl is None:
                break
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                # The lock counts only while `path` still names the file we locked: prune may have unlinked it while
                # we waited (another process then creates and locks a new file under the same name).
                held, now = os.fstat(f.fileno()), os.stat(path)
                if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                    break
            except FileNotFoundError:
                pass
            except BaseException:  # ENOLCK (some network file systems), an interrupt while waiting: not leaked
                f.close()
                raise
            f.close()  # (closing releases the flock)
        with f:
            try:
                yield
            finally:
                if fcntl is not None:
                    fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def _remove_lock_if_idle(self, path: Path) -> None:
        """Unlink a lock file nobody holds, holding it meanwhile (lock() re-opens one unlinked under it)."""
        try:  # r+ (a vanished one is not made): NFS emulates flock with fcntl locks, whose exclusive kind needs a
            f = open(path, "r+b")  # file open for writing (EBADF on a read-only one: no lock was ever pruned there)
        except PermissionError:  # another user's lock: read-only (a local flock takes that)
            f = open(path, "rb")
        with f:
            if fcntl is not None:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return  # held: a kernel is being built under it
            # Only while `path` still names the file locked here: another prune may have unlinked it meanwhile,
            # and a build then locked a new file under the same name (it holds that one, not this).
            held = os.fstat(f.fileno())
            try:
                now = os.stat(path)
            except FileNotFoundError:
                return  # the other prune's unlink, and no build since
            if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                path.unlink()

    # -- management ---------------------------------------------------------------
    # -- render index -------------------------------------------------------------
    def index_path(self, render_digest: str) -> Path:
        return self.root / "index" / render_digest[:2] / render_digest

    def index_get(self, render_digest: str) -> str | None:
        """The key recorded for `render_digest`, or None (absent or unreadable: a miss, never an error)."""
        try:  # bytes.decode: a text-mode open imports the codec, ~0.5 ms the first time in a process
            key = self.index_path(render_digest).read_bytes().decode("ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return key if _KEY.fullmatch(key) else None

    def index_put(self, render_digest: str, key: str) -> None:
        """Record `key` for `render_digest` (best effort: a read-only or full cache just stays slower)."""
        path = self.index_path(render_digest)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(path, key.encode("ascii"))

    # -- source-file memo -----------------------------------------------------------
    def files_memo_path(self, name: str) -> Path:
        return self.root / "sources" / f"{name}.json"

    def files_memo_get(self, name: str) -> object:
        """The parsed JSON of memo `name`, or None (absent or unreadable; the caller checks its shape)."""
        try:
            return json.loads(self.files_memo_path(name).read_bytes())
        except (OSError, ValueError, RecursionError):
            return None

    def files_memo_put(self, name: str, memo: dict) -> None:
        """Replace memo `name` (best effort, as index_put)."""
        path = self.files_memo_path(name)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            _replace_file(path, json.dumps(memo, separators=(",", ":")).encode(), durable=False)

    def remove(self, key: str) -> bool:
        """Delete an entry's files where possible: a read-only cache keeps them (a corrupt entry is then a miss
        every time, never an error). True when the entry is gone (its metadata, which makes it an entry)."""
        for path in (self.meta_path(key), self.cubin_path(key)):
            with contextlib.suppress(OSError):
                path.unlink()
        return not self.meta_path(key).exists()

    def keys(self) -> list[str]:
        base = self.root / "kernels"
        if not base.is_dir():
            return []
        return sorted(p.stem for p in base.glob("*/*.json"))

    def entries(self) -> list[dict]:
        """Metadata of every readable entry, with its on-disk size (files that are not an entry's metadata, valid
        JSON or not, are left out as unreadable ones are)."""
        out = []
        for key in self.keys():
            try:
                meta = json.loads(self.meta_path(key).read_bytes())
                size = self.cubin_path(key).stat().st_size + self.meta_path(key).stat().st_size
            except (OSError, ValueError, RecursionError):
                continue
            if not isinstance(meta, dict) or meta.get("key") != key:
                continue
            meta["disk_bytes"] = size
            out.append(meta)
        return out

    def prune(self, older_than_s: float) -> tuple[int, int]:
        """Remove entries not used (loaded or written) for `older_than_s` seconds, and stale
        temporaries and locks; returns (entries removed, entries that could not be removed)."""
        cutoff = time.time() - older_than_s
        removed = kept = 0
        for key in self.keys():
            try:
                if self.meta_path(key).stat().st_mtime < cutoff:
                    if self.remove(key):
                        removed += 1
                    else:
                        kept += 1
            except FileNotFoundError:
                continue
        for path in self.root.glob("kernels/*/.tmp-*"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
        for path in self.root.glob("locks/*.lock"):  # a lock's mtime is its creation: old ones may be held now
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    self._remove_lock_if_idle(path)
        return removed, kept

    def clear(self) -> tuple[int, int]:
        """Remove every entry (and stale temporaries); returns (entries removed, entries that could not be
        removed)."""
        keys = self.keys()
        gone = sum(self.remove(key) for key in keys)
        base = self.root / "kernels"
        if base.is_dir():
            for tmp in base.glob("*/.tmp-*"):  # stale ones only: a young one is another process's write in flight
                with contextlib.suppress(OSError):
                    if tmp.stat().st_mtime < time.time() - TMP_GRACE_S:
                        tmp.unlink()
        for pattern in ("index/*/*", "sources/*"):  # the index would only point at removed keys; its memo too
            for path in self.root.glob(pattern):
                with contextlib.suppress(OSError):
                    path.unlink()
        return gone, len(keys) - gone


def default_cache() -> DiskCache | None:
    """The cache at DEEPGEMM_JIT_CACHE_DIR (or the user cache dir); None if disabled."""
    if env.disk_cache_disabled():
        return None
    return DiskCache(env.cache_dir())


_warned_unavailable: set[str] = set()


def _warn_unavailable(root: Path, exc: OSError) -> None:
    if str(root) in _warned_unavailable:
        return
    _warned_unavailable.add(str(root))
    warnings.warn(f"deepgemm-jit: cache directory {root} is not usable ({exc}); kernels are compiled "
                  "in memory only for this process. Set DEEPGEMM_JIT_CACHE_DIR to a writable directory.",
                  CacheUnavailableWarning, stacklevel=4)


def _readable(path: Path) -> bool:
    """Whether `path` exists and this process may read it."""
    try:
        path.read_bytes()
    except OSError:
        return False
    return True


def get_or_build(cache: DiskCache | None, key: str, build: Callable[[], tuple[bytes, dict]],
                 missing: Callable[[], Exception] | None = None) -> tuple[CacheEntry, bool]:
    """(entry, compiled_now): from disk if present, else built once across processes.

    `missing`, when given, forbids building: it makes the exception raised for an absent entry
    (offline mode).
    """
    if missing is not None:
        entry = cache.load(key, repair=False) if cache is not None else None
        # There but corrupt (a plain miss, or an entry this process may not read, is no corruption and writes nothing):
        if entry is None and cache is not None and _readable(cache.meta_path(key)):
            try:
                with cache.lock(key):  # reported and removed under the lock
                    entry = cache.load(key)
            except OSError:  # a read-only cache (the usual offline deployment): reported all the same, left in place
                warnings.warn(f"deepgemm-jit: cache entry {key[:16]} in {cache.root} is corrupt (and cannot be "
                              "removed here): rebuild it with deepgemm-jit warmup", CacheCorruptionWarning,
                              stacklevel=3)
        if entry is None:
            raise missing()
        return entry, False

    def in_memory() -> tuple[CacheEntry, bool]:
        cubin, meta = build()
        return CacheEntry(key=key, cubin=cubin, meta=dict(meta, key=key)), True

    if cache is None:
        return in_memory()
    try:
        entry = cache.load(key, repair=False)
        if entry is not None:
            return entry, False
        with cache.lock(key):
            entry = cache.load(key)  # someone may have built it while we waited
            if entry is not None:
                return entry, False
            cubin, meta = build()
            try:
                return cache.store(key, cubin, meta), True
            except OSError as exc:  # full disk, or lost rights mid-way: keep the kernel
                _warn_unavailable(cache.root, exc)
                return CacheEntry(key=key, cubin=cubin, meta=dict(meta, key=key)), True
    except OSError as exc:  # the directory cannot be read, created or locked
        _warn_unavailable(cache.root, exc)
        return in_memory()
