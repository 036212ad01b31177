"""The first warm load of a process: render.source_digest's stat memo (in the process and in the cache's
``sources/``) must save reading the templates without ever letting an edited file keep its old hash.

Decided behaviour (render.source_digest): a file's hash is reused while its (device, inode, size, mtime,
ctime) is unchanged. An edit that restores size and mtime (os.utime) still changes ctime, which user space
cannot set, so it is detected; a file changed less than render._RACY_NS ago is never memoized (an edit in
the same timestamp tick would not change its stat). Tests that need memoized copies of the templates set
_RACY_NS to 0 and wait for the clock to tick between edits instead.
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

import deepgemm_jit as dg
from deepgemm_jit import cache, jit, render


def _fresh_process():
    """Forget what this process memoized, as a new process would start (the disk cache stays)."""
    render._hashes.clear()
    render._listings.clear()
    render._read_header.cache_clear()
    jit.clear_memo()


@pytest.fixture
def templates(tmp_path, monkeypatch, cache_dir):
    """A private copy of the templates (DEEPGEMM_JIT_TEMPLATES_DIR), memoizable at once (_RACY_NS = 0)."""
    root = tmp_path / "templates"
    shutil.copytree(render.templates_dir(), root)
    monkeypatch.setenv("DEEPGEMM_JIT_TEMPLATES_DIR", str(root))
    monkeypatch.setattr(render, "_RACY_NS", 0)
    _fresh_process()
    yield root
    _fresh_process()
    render._environment.cache_clear()


def _spy(monkeypatch, name):
    """The arguments of every call of render.`name` (a one-argument function), in order."""
    calls = []
    real = getattr(render, name)
    monkeypatch.setattr(render, name, lambda arg: calls.append(arg) or real(arg))
    return calls


@pytest.fixture
def hashed(monkeypatch):
    """The paths render._hash_file reads."""
    return _spy(monkeypatch, "_hash_file")


@pytest.fixture
def scans(monkeypatch):
    """The template roots render._scan_templates lists."""
    return _spy(monkeypatch, "_scan_templates")


def _memo_files(cache_dir):
    return [p for p in cache_dir.glob("sources/*") if not p.name.startswith(".tmp-")]


def _reference_digest():
    """source_digest computed from a fresh listing and the file contents alone (no memo of any kind)."""
    saved = dict(render._hashes), dict(render._listings)
    render._hashes.clear()
    render._listings.clear()
    try:
        return render.source_digest(None)
    finally:
        for memo, before in zip((render._hashes, render._listings), saved):
            memo.clear()
            memo.update(before)


def _wait_for_the_file_clock(ns):
    """Sleep until a change now gets a timestamp other than `ns` (file timestamps use a coarse clock)."""
    deadline = time.monotonic() + 2
    while time.time_ns() < ns + 50_000_000 and time.monotonic() < deadline:
        time.sleep(0.01)


def _edit_keeping_size_and_mtime(path):
    """Swap two different adjacent bytes of `path`, then put its mtime back: same size, same mtime."""
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    i = next(i for i in range(len(data) - 1) if data[i] != data[i + 1])
    data[i], data[i + 1] = data[i + 1], data[i]
    _wait_for_the_file_clock(st.st_ctime_ns)
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert after.st_ctime_ns != st.st_ctime_ns  # what makes the edit visible


def test_a_new_process_hashes_nothing_with_the_memo(templates, cache_dir, hashed, scans):
    store = cache.DiskCache(cache_dir)
    digest = render.source_digest(store)
    assert hashed and scans == [str(templates)]  # the first process lists and reads every file once...
    assert digest == _reference_digest()
    (memo,) = _memo_files(cache_dir)
    recorded = json.loads(memo.read_text())
    assert len(recorded["files"]) == len(render._listings[str(templates)][0]) and recorded["listing"]
    hashed.clear()
    scans.clear()
    assert render.source_digest(store) == digest and hashed == [] == scans  # ...later calls in it none...
    _fresh_process()
    assert render.source_digest(store) == digest and hashed == [] == scans  # ...nor does the next process


def test_a_file_added_to_the_templates_is_seen_by_the_next_process(templates, cache_dir, scans):
    store = cache.DiskCache(cache_dir)
    before = render.source_digest(store)
    include = templates / "include" / "dgjit"
    _wait_for_the_file_clock(os.stat(include).st_ctime_ns)
    (include / "added.cuh").write_text("// new\n")
    assert render.source_digest(store) == before  # a running process keeps its listing
    _fresh_process()
    scans.clear()
    after = render.source_digest(store)
    assert scans == [str(templates)] and after != before and after == _reference_digest()
    (include / "added.cuh").unlink()
    _fresh_process()
    assert render.source_digest(store) == before


def test_edit_with_same_size_and_mtime_changes_the_digest(templates, cache_dir, hashed):
    store = cache.DiskCache(cache_dir)
    before = render.source_digest(store)
    header = templates / "include" / "dgjit" / "common.cuh"
    include_root = templates / "include"
    old_headers = dict(render.collect_headers('#include "dgjit/common.cuh"\n', include_root))
    (memo,) = _memo_files(cache_dir)
    memo_before_edit = memo.read_bytes()

    _edit_keeping_size_and_mtime(header)
    hashed.clear()
    after = render.source_digest(store)  # this process memoized the old hash
    assert hashed == [str(header)]  # the edited file alone is read again
    assert after != before and after == _reference_digest()
    new_headers = dict(render.collect_headers('#include "dgjit/common.cuh"\n', include_root))
    assert new_headers["dgjit/common.cuh"] != old_headers["dgjit/common.cuh"]  # the render reads it again too

    memo.write_bytes(memo_before_edit)  # a new process finding the memo written before the edit
    _fresh_process()
    assert render.source_digest(store) == after


def test_recently_changed_files_are_never_memoized(tmp_path, monkeypatch, cache_dir, hashed):
    root = tmp_path / "templates"
    shutil.copytree(render.templates_dir(), root)  # every copy was just written: racy for _RACY_NS
    monkeypatch.setenv("DEEPGEMM_JIT_TEMPLATES_DIR", str(root))
    _fresh_process()
    store = cache.DiskCache(cache_dir)
    try:
        digest = render.source_digest(store)
        copies = {p for p in hashed if p.startswith(str(root))}
        assert len(copies) == len(list(root.glob("*.j2"))) + len(list(root.glob("include/dgjit/*")))
        hashed.clear()
        assert render.source_digest(store) == digest
        assert {p for p in hashed if p.startswith(str(root))} == copies  # read again on every call
        for memo in _memo_files(cache_dir):
            assert not any(p.startswith(str(root)) for p in json.loads(memo.read_text())["files"])
    finally:
        _fresh_process()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "not_a_dict", "other_format", "bad_entries",
                                    "directory"])
def test_a_corrupt_memo_is_ignored_and_rewritten(templates, cache_dir, damage):
    store = cache.DiskCache(cache_dir)
    digest = render.source_digest(store)
    (memo,) = _memo_files(cache_dir)
    good = json.loads(memo.read_text())
    if damage == "garbage":
        memo.write_bytes(b"\x00\xff\xfe not json")
    elif damage == "truncated":
        memo.write_bytes(memo.read_bytes()[: memo.stat().st_size // 2])
    elif damage == "not_a_dict":
        memo.write_text(json.dumps([good]))
    elif damage == "other_format":
        memo.write_text(json.dumps(dict(good, format=99)))
    elif damage == "bad_entries":
        def bad(i, v):
            return [[1, 2], "x", [*v[:5], "zz"], [*v[:4], "1", v[5]], [*v[:5], "g" * 64], None,
                    [*v[:4], 1.5, v[5]], [*v, 0], [*v[:5], v[5][:62]], [*v[:5], 64]][i % 10]

        good["files"] = {path: bad(i, v) for i, (path, v) in enumerate(good["files"].items())}
        memo.write_text(json.dumps(good))
    else:
        memo.unlink()
        memo.mkdir()
    _fresh_process()
    assert render.source_digest(store) == digest == _reference_digest()
    if damage != "directory":  # a memo that cannot be replaced only stays slow
        rewritten = json.loads(memo.read_text())
        assert rewritten["format"] == render._MEMO_FORMAT
        assert len(rewritten["files"]) == len(render._listings[str(templates)][0])


def _build_small():
    return dg.build(32, 40, 48, dtype="bf16", arch="sm_90a")


def _no_render(monkeypatch):
    def no_render(*args, **kwargs):
        raise AssertionError("a kernel in the render index was rendered")

    monkeypatch.setattr(jit, "render_kernel", no_render)


def test_a_copied_cache_hits_with_or_without_its_memo(templates, cache_dir, tmp_path, monkeypatch):
    key = _build_small().artifact.key
    for variant in ("as_copied", "no_memo", "memo_of_other_files"):
        copy = tmp_path / f"copy-{variant}"
        shutil.copytree(cache_dir, copy)
        (memo,) = _memo_files(copy)
        if variant == "no_memo":
            memo.unlink()
        elif variant == "memo_of_other_files":  # as on another machine: no recorded stat matches
            data = json.loads(memo.read_text())
            data["files"] = {p: [v[0], v[1] + 1, *v[2:]] for p, v in data["files"].items()}
            memo.write_text(json.dumps(data))
        monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(copy))
        _fresh_process()
        with monkeypatch.context() as m:
            _no_render(m)
            g = _build_small()
        assert g.artifact.key == key and not g.artifact.compiled_now, variant
        assert _memo_files(copy), variant


def test_a_forged_memo_hash_costs_a_render_not_a_wrong_kernel(templates, cache_dir, monkeypatch):
    key = _build_small().artifact.key
    (memo,) = _memo_files(cache_dir)
    data = json.loads(memo.read_text())
    data["files"] = {p: [*v[:5], "0" * 64] for p, v in data["files"].items()}  # stats match, hashes lie
    memo.write_text(json.dumps(data))
    _fresh_process()
    rendered = []
    real = jit.render_kernel
    monkeypatch.setattr(jit, "render_kernel", lambda *a: rendered.append(a) or real(*a))
    g = _build_small()
    assert rendered and g.artifact.key == key and not g.artifact.compiled_now  # index missed; key is content


def test_a_file_edited_while_rendering_is_not_indexed(templates, cache_dir, monkeypatch):
    real = jit.render_kernel
    header = templates / "include" / "dgjit" / "common.cuh"

    def render_then_edit(*args):
        out = real(*args)
        header.write_text(header.read_text() + "\n// edited during the render\n")
        return out

    monkeypatch.setattr(jit, "render_kernel", render_then_edit)
    g = _build_small()
    assert g.artifact.compiled_now
    assert not list(cache_dir.glob("index/*/*"))  # the digest of the files before the edit maps to nothing


def test_cache_clear_removes_the_memo(templates, cache_dir):
    _build_small()
    assert _memo_files(cache_dir)
    cache.DiskCache(cache_dir).clear()
    assert not list(cache_dir.glob("sources/*"))


_WARM_CHILD = textwrap.dedent("""
    import json, time
    from deepgemm_jit import compiler, jit, render
    render._RACY_NS = 0
    compiler.nvrtc_version()
    hashed = []
    real = render._hash_file
    render._hash_file = lambda path: hashed.append(path) or real(path)
    rendered = []
    real_render = jit.render_kernel
    jit.render_kernel = lambda *a: rendered.append(a) or real_render(*a)
    import deepgemm_jit as dg
    t0 = time.perf_counter()
    g = dg.build(32, 40, 48, dtype="bf16", arch="sm_90a")
    print(json.dumps({"seconds": time.perf_counter() - t0, "compiled": g.artifact.compiled_now,
                      "hashed": hashed, "rendered": len(rendered), "key": g.artifact.key}))
""")


def test_fresh_process_warm_build_reads_no_source_file(templates, cache_dir):
    env = dict(os.environ, DEEPGEMM_JIT_CACHE_DIR=str(cache_dir), DEEPGEMM_JIT_TEMPLATES_DIR=str(templates))
    runs = [json.loads(subprocess.run([sys.executable, "-c", _WARM_CHILD], env=env, capture_output=True,
                                      text=True, check=True).stdout) for _ in range(2)]
    cold, warm = runs
    assert cold["compiled"] and cold["hashed"] and cold["rendered"] == 1
    assert not warm["compiled"] and warm["hashed"] == [] and warm["rendered"] == 0 and warm["key"] == cold["key"]
