"""The disk cache: key rules, atomic writes, corruption recovery, concurrency."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

import deepgemm_jit as dg
from deepgemm_jit import cache, jit, render
from deepgemm_jit.errors import CacheCorruptionWarning, CacheUnavailableWarning

KEY_ARGS = dict(source="int x;", headers=(("dgjit/a.cuh", "A"), ("dgjit/b.cuh", "B")),
                options=("--gpu-architecture=sm_90a", "-std=c++17"), nvrtc_version=(13, 0),
                arch="sm_90a", package_version="0.1.0")


def test_key_is_stable_and_sensitive():
    k = cache.kernel_key(**KEY_ARGS)
    assert k == cache.kernel_key(**KEY_ARGS)
    assert k == cache.kernel_key(**dict(KEY_ARGS, headers=tuple(reversed(KEY_ARGS["headers"]))))
    for field, value in [("source", "int y;"), ("headers", (("dgjit/a.cuh", "A2"), ("dgjit/b.cuh", "B"))),
                         ("options", ("--gpu-architecture=sm_90a",)), ("nvrtc_version", (13, 1)),
                         ("arch", "sm_80"), ("package_version", "0.2.0")]:
        assert cache.kernel_key(**dict(KEY_ARGS, **{field: value})) != k, field


def _build_small(arch="sm_90a"):
    return dg.build(32, 40, 48, dtype="bf16", arch=arch)


def test_entries_are_readable_by_other_users_and_unreadable_ones_are_misses(tmp_path):
    """Files were created owner-only (mkstemp's 0600): a cache warmed by root could not be read by the serving user,
    whose offline build then raised PermissionError. Entries now get open()'s permissions (0666 less the umask), and
    an entry the process cannot read is a miss (offline: KernelNotCachedError), not a crash (review)."""
    store = cache.DiskCache(tmp_path / "c")
    key = "ab" + "0" * 62
    store.store(key, b"cubin", {"entry": "k"})
    for path in (store.cubin_path(key), store.meta_path(key)):
        assert path.stat().st_mode & 0o777 == 0o666 & ~cache._UMASK, oct(path.stat().st_mode)
    blocked = cache.DiskCache(tmp_path / "d")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "kernels").write_text("a file where the folder should be")
    assert blocked.load(key) is None


def test_offline_an_entry_it_may_not_read_is_a_miss_not_corruption(tmp_path, monkeypatch):
    """Offline, on a read-only cache, an intact entry this process may not read (another user's 0600 files) was
    reported as corrupt ("rebuild it with deepgemm-jit warmup"): it is a miss, as load() says."""
    store = cache.DiskCache(tmp_path)
    key = "ac" * 32
    store.store(key, b"\x7fELF" + bytes(60), {"entry": "k"})
    (tmp_path / "locks").write_text("not a folder")  # lock() fails with an OSError, as on a read-only cache
    real = type(store.meta_path(key)).read_bytes

    def read_bytes(path):
        if path.suffix == ".json":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(type(store.meta_path(key)), "read_bytes", read_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheCorruptionWarning)
        with pytest.raises(LookupError):
            cache.get_or_build(store, key, lambda: pytest.fail("built offline"),
                               missing=lambda: LookupError("missing"))


def test_second_build_hits_disk(cache_dir):
    g1 = _build_small()
    assert g1.artifact.compiled_now
    jit.clear_memo()
    g2 = _build_small()
    assert not g2.artifact.compiled_now and g2.artifact.cubin == g1.artifact.cubin
    meta = json.loads((cache_dir / "kernels" / g1.artifact.key[:2] / f"{g1.artifact.key}.json").read_text())
    assert meta["arch"] == "sm_90a" and meta["cubin_bytes"] == len(g1.artifact.cubin)
    assert str(cache_dir) not in json.dumps(meta)  # no absolute paths in the metadata
    assert not list(cache_dir.glob("kernels/*/.tmp-*"))


def test_moved_cache_still_hits(cache_dir, tmp_path, monkeypatch):
    key = _build_small().artifact.key
    moved = tmp_path / "elsewhere"
    shutil.copytree(cache_dir, moved)
    shutil.rmtree(cache_dir)
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(moved))
    jit.clear_memo()
    g = _build_small()
    assert g.artifact.key == key and not g.artifact.compiled_now


def _copy_templates(tmp_path, monkeypatch):
    root = tmp_path / "templates"
    shutil.copytree(render.templates_dir(), root)
    monkeypatch.setattr(render, "templates_dir", lambda: root)
    render._environment.cache_clear()
    return root


def test_header_change_invalidates_only_includers(cache_dir, tmp_path, monkeypatch):
    root = _copy_templates(tmp_path, monkeypatch)
    key = _build_small().artifact.key
    # A header no kernel includes: same key.
    (root / "include" / "dgjit" / "unused.cuh").write_text("// nothing\n")
    jit.clear_memo()
    assert _build_small().artifact.key == key
    # A header the kernel includes (even a comment): new key, recompiled.
    common = root / "include" / "dgjit" / "common.cuh"
    common.write_text(common.read_text() + "\n// changed\n")
    jit.clear_memo()
    g = _build_small()
    assert g.artifact.key != key and g.artifact.compiled_now
    render._environment.cache_clear()


def _index_files(cache_dir):
    return [p for p in cache_dir.glob("index/*/*") if not p.name.startswith(".tmp-")]


def test_render_index_loads_without_rendering(cache_dir, monkeypatch):
    key = _build_small().artifact.key
    (index,) = _index_files(cache_dir)
    assert index.read_text() == key
    jit.clear_memo()

    def no_render(*args, **kwargs):
        raise AssertionError("a kernel in the render index was rendered")

    monkeypatch.setattr(jit, "render_kernel", no_render)
    g = _build_small()
    assert g.artifact.key == key and not g.artifact.compiled_now and g.artifact.entry == "dgjit_gemm_sm90"


def test_render_index_misses_when_a_template_or_header_changes(cache_dir, tmp_path, monkeypatch):
    root = _copy_templates(tmp_path, monkeypatch)
    _build_small()
    rendered = []
    real = jit.render_kernel
    monkeypatch.setattr(jit, "render_kernel", lambda *a: rendered.append(a) or real(*a))
    for path in (root / "gemm_sm90.cu.j2", root / "include" / "dgjit" / "common.cuh"):
        path.write_text(path.read_text() + "\n{# changed #}\n" if path.suffix == ".j2" else
                        path.read_text() + "\n// changed\n")
        jit.clear_memo()
        before = len(rendered)
        _build_small()
        assert len(rendered) == before + 1, path.name  # the index did not answer for changed files
    render._environment.cache_clear()


def test_render_index_garbage_or_dangling_entries_are_misses(cache_dir):
    g = _build_small()
    (index,) = _index_files(cache_dir)
    index.write_text("not a key")
    jit.clear_memo()
    assert _build_small().artifact.key == g.artifact.key  # rendered again, same key, index repaired
    assert index.read_text() == g.artifact.key
    cache.DiskCache(cache_dir).remove(g.artifact.key)  # the index now points at nothing
    jit.clear_memo()
    again = _build_small()
    assert again.artifact.compiled_now and again.artifact.key == g.artifact.key
    assert cache.DiskCache(cache_dir).clear() == (1, 0) and not _index_files(cache_dir)


@pytest.mark.parametrize("damage", ["flip", "truncate", "bad_json", "no_cubin"])
def test_corrupt_entry_is_detected_and_rebuilt(cache_dir, damage):
    art = _build_small().artifact
    store = cache.DiskCache(cache_dir)
    cubin_path, meta_path = store.cubin_path(art.key), store.meta_path(art.key)
    if damage == "flip":
        data = bytearray(cubin_path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        cubin_path.write_bytes(bytes(data))
    elif damage == "truncate":
        cubin_path.write_bytes(cubin_path.read_bytes()[:100])
    elif damage == "bad_json":
        meta_path.write_text("{not json")
    else:
        cubin_path.unlink()
    jit.clear_memo()
    with pytest.warns(CacheCorruptionWarning, match="corrupt"):
        g = _build_small()
    assert g.artifact.compiled_now and g.artifact.cubin == art.cubin
    assert store.load(art.key) is not None  # rebuilt entry is whole


@pytest.mark.parametrize("offline", [False, True])
def test_corrupt_entry_in_a_read_only_cache_is_a_miss(cache_dir, monkeypatch, offline):
    """A corrupt entry the cache cannot delete (read-only directory) is a miss, not an OSError: a build compiles
    in memory, an offline build raises KernelNotCachedError with its warmup line (it raised the unlink's OSError)."""
    import pathlib

    from deepgemm_jit.errors import KernelNotCachedError

    art = _build_small().artifact
    store = cache.DiskCache(cache_dir)
    store.meta_path(art.key).write_text("{not json")
    real_unlink = pathlib.Path.unlink

    def read_only_unlink(self, *args, **kwargs):
        if str(self).startswith(str(cache_dir)):
            raise OSError(30, "Read-only file system", str(self))
        return real_unlink(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "unlink", read_only_unlink)
    jit.clear_memo()
    if offline:
        monkeypatch.setenv("DEEPGEMM_JIT_OFFLINE", "1")
        with pytest.warns(CacheCorruptionWarning), pytest.raises(KernelNotCachedError, match="warmup"):
            _build_small()
    else:
        with pytest.warns(CacheCorruptionWarning):
            g = _build_small()
        assert g.artifact.compiled_now and g.artifact.cubin == art.cubin
    jit.clear_memo()


def test_entries_skip_metadata_that_is_not_an_entrys(cache_dir):
    """`cache list` reads entries(): valid JSON that is not an entry's metadata is left out (it raised KeyError)."""
    art = _build_small().artifact
    store = cache.DiskCache(cache_dir)
    assert [e["key"] for e in store.entries()] == [art.key]
    for junk in ('{"a": 1}', "null", "[1, 2]"):
        store.meta_path(art.key).write_text(junk)
        assert store.entries() == []


def test_entry_without_metadata_is_invisible(cache_dir):
    """A kill between the cubin and the JSON rename leaves nothing loadable."""
    art = _build_small().artifact
    store = cache.DiskCache(cache_dir)
    store.meta_path(art.key).unlink()
    assert store.load(art.key) is None
    jit.clear_memo()
    assert _build_small().artifact.compiled_now


def test_unwritable_cache_degrades_to_memory(tmp_path, monkeypatch):
    if os.geteuid() == 0:
        target = tmp_path / "a-file"  # root ignores permissions: use a path under a regular file
        target.write_text("x")
        root = target / "cache"
    else:
        root = tmp_path / "ro"
        root.mkdir()
        root.chmod(0o500)
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(root))
    jit.clear_memo()
    cache._warned_unavailable.clear()
    with pytest.warns(CacheUnavailableWarning, match="not usable"):
        g = _build_small()
    assert g.artifact.compiled_now and g.artifact.cubin[:4] == b"\x7fELF"
    jit.clear_memo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per directory, not per kernel
        dg.build(32, 40, 56, dtype="bf16", arch="sm_90a")
    jit.clear_memo()


def test_disabled_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(tmp_path / "never"))
    monkeypatch.setenv("DEEPGEMM_JIT_DISABLE_DISK_CACHE", "1")
    jit.clear_memo()
    assert _build_small().artifact.compiled_now
    assert not (tmp_path / "never").exists()
    jit.clear_memo()


def test_clear(cache_dir):
    _build_small()
    store = cache.DiskCache(cache_dir)
    assert len(store.keys()) == 1
    assert store.clear() == (1, 0) and store.keys() == []


_WORKER = textwrap.dedent("""
    import sys, time
    import deepgemm_jit as dg
    start = float(sys.argv[1])
    while time.time() < start:
        time.sleep(0.001)
    g = dg.build(96, 80, 72, dtype="fp16", arch="sm_90a")
    print("compiled" if g.artifact.compiled_now else "loaded", g.artifact.key)
""")


def test_concurrent_processes_compile_once(cache_dir):
    import time
    start = time.time() + 3.0
    env = dict(os.environ, DEEPGEMM_JIT_CACHE_DIR=str(cache_dir))
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(start)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
    lines = [out.split() for out, _ in results]
    assert sorted(l[0] for l in lines) == ["compiled", "loaded", "loaded", "loaded"], lines
    assert len({l[1] for l in lines}) == 1


def test_damaged_template_bytecode_is_rendered_from_source(tmp_path, monkeypatch):
    """A truncated or damaged Jinja bytecode file under the cache raised UnpicklingError from every render of that
    template (kernels already cached included) until someone deleted it (review): it now counts as absent."""
    import jinja2

    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DEEPGEMM_JIT_DISABLE_DISK_CACHE", raising=False)
    store = render._bytecode_cache()
    env = jinja2.Environment(bytecode_cache=store)
    bucket = jinja2.bccache.Bucket(env, "key", "checksum")
    bucket.code = compile("x = 1", "<t>", "exec")
    store.dump_bytecode(bucket)
    (path,) = (tmp_path / "jinja").iterdir()
    good = path.read_bytes()
    for damaged in (good[:20], good[:10] + b"\x00" * 30 + good[40:]):
        path.write_bytes(damaged)
        fresh = jinja2.bccache.Bucket(env, "key", "checksum")
        store.load_bytecode(fresh)   # must not raise
        assert fresh.code is None


# -- review (session 61, helper 76): the machinery around the key ------------------------------------------------

def test_render_index_is_not_used_once_the_rendering_code_changed_under_the_process(cache_dir, monkeypatch):
    """A process renders with the modules it imported, source_digest hashes the files on disk: after an update under
    a running process (git pull, pip install -e) it would index the old code's kernels under the new files' digest
    for every later process. Such a process neither reads nor writes the index (it renders and keys as always)."""
    key = _build_small().artifact.key
    jit.clear_memo()
    monkeypatch.setattr(dg, "_IMPORTED_RENDERING_MODULE_STATS", {"spec.py": "as imported"})
    assert not render.rendering_code_is_current()
    touched = []
    monkeypatch.setattr(cache.DiskCache, "index_get", lambda self, digest: touched.append(digest))
    monkeypatch.setattr(cache.DiskCache, "index_put", lambda self, digest, key: touched.append(digest))
    g = _build_small()
    assert g.artifact.key == key and not g.artifact.compiled_now and touched == []


def test_a_template_edited_with_its_mtime_put_back_is_rendered_anew(tmp_path, monkeypatch):
    """Jinja2's FileSystemLoader reloads a template only when its mtime changed: an edit that puts it back (cp -p,
    rsync -a, os.utime) rendered the old template while source_digest hashed the new one, and the render index
    then filed the old kernel under the new files. render._Loader compares the whole stat signature."""
    import jinja2

    path = tmp_path / "t.j2"
    path.write_text("old")
    old = os.stat(path)
    os.utime(path, ns=(old.st_atime_ns - 10**10, old.st_mtime_ns - 10**10))  # settled (past render._RACY_NS)
    # Settled at once: os.utime just moved ctime, and an unsettled template is reloaded whatever its signature says
    # (a _Loader comparing mtime alone passed this test without it).
    monkeypatch.setattr(render, "_RACY_NS", 0)
    env_ = jinja2.Environment(loader=render._Loader(str(tmp_path)))
    assert env_.get_template("t.j2").render() == "old"
    settled = os.stat(path)
    path.write_text("new")
    os.utime(path, ns=(settled.st_atime_ns, settled.st_mtime_ns))  # mtime put back (ctime moves)
    assert env_.get_template("t.j2").render() == "new"


def test_headers_in_subfolders_are_refused(tmp_path):
    """source_digest lists include/dgjit/ only: an edit in a subfolder would not invalidate the render index."""
    (tmp_path / "dgjit" / "sub").mkdir(parents=True)
    (tmp_path / "dgjit" / "sub" / "x.cuh").write_text("int x;")
    with pytest.raises(ValueError, match="headers sit directly in include/dgjit/"):
        render.collect_headers('#include "dgjit/sub/x.cuh"\n', tmp_path)


def test_json_nested_past_the_recursion_limit_is_corrupt(tmp_path):
    """json.loads raises RecursionError (not a ValueError) on deep nesting: a damaged entry crashed every build of
    its kernel instead of being reported and rebuilt, and a damaged sources/ memo every GEMM build."""
    store = cache.DiskCache(tmp_path)
    key = "12" * 32
    store.store(key, b"\x7fELF" + bytes(60), {"entry": "k"})
    store.meta_path(key).write_bytes(b"[" * 5000)
    with pytest.warns(CacheCorruptionWarning):
        entry, built = cache.get_or_build(store, key, lambda: (b"\x7fELF" + bytes(61), {"entry": "k"}))
    assert built and len(entry.cubin) == 65 and store.load(key) is not None
    store.files_memo_path("m").parent.mkdir(parents=True, exist_ok=True)
    store.files_memo_path("m").write_bytes(b'{"files": ' + b"[" * 5000)
    assert store.files_memo_get("m") is None


def test_a_corrupt_entry_is_removed_only_under_its_lock(tmp_path, monkeypatch):
    """Removed outside the lock, a corrupt entry could be one another process had just rebuilt (compiled twice)."""
    store = cache.DiskCache(tmp_path)
    key = "34" * 32
    store.store(key, b"\x7fELF" + bytes(60), {"entry": "k"})
    store.cubin_path(key).write_bytes(b"truncated")
    held = []
    real_lock, real_remove = cache.DiskCache.lock, cache.DiskCache.remove

    def lock(self, k):
        held.append(True)
        return real_lock(self, k)

    monkeypatch.setattr(cache.DiskCache, "lock", lock)
    monkeypatch.setattr(cache.DiskCache, "remove", lambda self, k: (held or pytest.fail("removed unlocked"),
                                                                      real_remove(self, k))[1])
    with pytest.warns(CacheCorruptionWarning):
        entry, built = cache.get_or_build(store, key, lambda: (b"\x7fELF" + bytes(61), {"entry": "k"}))
    assert built and held


def test_clear_leaves_a_young_temporary_alone(tmp_path):
    """A young .tmp- file may be another process's write in flight: clear removed it, and that process's rename
    failed ("cache directory is not usable") and its kernel was not saved."""
    store = cache.DiskCache(tmp_path)
    store.store("56" * 32, b"\x7fELF" + bytes(60), {"entry": "k"})
    young, old = (store.cubin_path("56" * 32).parent / name for name in (".tmp-young", ".tmp-old"))
    young.write_bytes(b"x")
    old.write_bytes(b"x")
    past = time.time() - 2 * cache.TMP_GRACE_S
    os.utime(old, (past, past))
    store.clear()
    assert young.exists() and not old.exists()


@pytest.mark.skipif(sys.platform == "win32", reason="flock")
def test_prune_keeps_a_held_lock_and_lock_survives_an_unlink(tmp_path):
    """A lock file's mtime is its creation: prune unlinked old locks while held, and the next process locked a new
    file under the same name, so two compiled one kernel at once. prune leaves held locks; a waiter whose file was
    unlinked meanwhile locks the file that now has the name."""
    import threading

    store = cache.DiskCache(tmp_path)
    key = "78" * 32
    path = tmp_path / "locks" / f"{key}.lock"
    with store.lock(key):
        past = time.time() - 10 * 24 * 3600
        os.utime(path, (past, past))
        store.prune(24 * 3600)
        assert path.exists()  # held: kept
        seen = []
        waiter = threading.Thread(target=lambda: seen.append(_locked_path_is_live(store, key, path)))
        waiter.start()
        time.sleep(0.2)
        path.unlink()  # as an old prune did under a waiter
    waiter.join(10)
    assert seen == [True]
    os.utime(path, (past, past))
    store.prune(24 * 3600)
    assert not path.exists()  # idle: pruned


def _locked_path_is_live(store, key, path) -> bool:
    with store.lock(key):
        return path.exists()


def _idle_lock_file(store, key):
    """The lock file of `key`, made by a finished build and aged past any prune's idle limit (10 days)."""
    with store.lock(key):
        pass
    path = store.root / "locks" / f"{key}.lock"
    past = time.time() - 10 * 24 * 3600
    os.utime(path, (past, past))
    return path


def test_prune_removes_idle_locks_where_flock_needs_a_writable_file(tmp_path, monkeypatch):
    """On NFS, flock is emulated with fcntl byte-range locks, and an exclusive one needs the file open for writing
    (flock(2)): prune opened lock files read-only, its LOCK_EX failed with EBADF (suppressed), and no lock file was
    ever pruned there."""
    import errno

    fcntl = pytest.importorskip("fcntl")
    store, key = cache.DiskCache(tmp_path), "6d" * 32
    path = _idle_lock_file(store, key)
    real_flock = fcntl.flock

    def nfs_flock(fd, op):
        if op & fcntl.LOCK_EX and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EBADF, "Bad file descriptor")
        return real_flock(fd, op)

    monkeypatch.setattr(cache.fcntl, "flock", nfs_flock)
    store.prune(24 * 3600)
    assert not path.exists()


def test_offline_reports_a_corrupt_entry_it_cannot_lock_and_a_miss_writes_nothing(tmp_path):
    """Offline (get_or_build with `missing`): a corrupt entry in a cache whose lock cannot be taken (read-only) is
    still reported, not only "not cached"; an absent entry leaves no lock file behind."""
    store = cache.DiskCache(tmp_path)
    key = "9a" * 32
    store.store(key, b"\x7fELF" + bytes(60), {"entry": "k"})
    store.cubin_path(key).write_bytes(b"truncated")
    (tmp_path / "locks").write_text("not a folder")  # lock() fails with an OSError, as on a read-only cache
    with pytest.warns(CacheCorruptionWarning), pytest.raises(LookupError):
        cache.get_or_build(store, key, lambda: pytest.fail("built offline"), missing=lambda: LookupError("missing"))
    other = cache.DiskCache(tmp_path / "other")
    with pytest.raises(LookupError):
        cache.get_or_build(other, "9b" * 32, lambda: pytest.fail("built offline"), missing=lambda: LookupError("x"))
    assert not (tmp_path / "other").exists()


def test_prune_leaves_the_lock_file_that_replaced_the_one_it_locked(tmp_path, monkeypatch):
    """Two prunes at once: the second opened an old idle lock file, the first unlinked it, and a build locked a new
    file under the name; the second then took the (now nameless) old file's lock and unlinked the name, i.e. the held
    lock, so a third process locked yet another file and built the same kernel concurrently. A prune unlinks a lock
    file only while the name still points at the file it locked."""
    fcntl = pytest.importorskip("fcntl")
    store, key = cache.DiskCache(tmp_path), "5c" * 32
    path = _idle_lock_file(store, key)
    real_flock, builds = fcntl.flock, []

    def flock(fd, op):
        if op & fcntl.LOCK_NB and not builds:  # the prune has opened the old file; meanwhile:
            path.unlink()  # another prune unlinks it
            builds.append(store.lock(key))  # and a build locks a new file under the name
            builds[0].__enter__()
        return real_flock(fd, op)

    monkeypatch.setattr(cache.fcntl, "flock", flock)
    store.prune(24 * 3600)
    monkeypatch.setattr(cache.fcntl, "flock", real_flock)
    try:
        assert builds and path.exists()  # the build's lock file is still the one the name points at
        with open(path, "rb") as f, pytest.raises(BlockingIOError):
            real_flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # and it is held: the next build waits
    finally:
        builds[0].__exit__(None, None, None)
