import pytest

from deepgemm_jit import arrays, device, grouped, jit, quantization


def pytest_collection_modifyitems(config, items):
    # The offline compile sweep past its first seeds repeats what the GPU fuzz run compiles anyway; it costs CI
    # about 150 s, so it runs only when asked for by name (-m sweep, or any -m expression naming it).
    if "sweep" not in (config.option.markexpr or ""):
        later = pytest.mark.skip(reason="offline compile sweep past the first seeds: run with -m sweep")
        for item in items:
            if "sweep" in item.keywords:
                item.add_marker(later)
    if device.gpu_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh, private kernel cache (and an empty in-process memo) for one test."""
    root = tmp_path / "cache"
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(root))
    monkeypatch.delenv("DEEPGEMM_JIT_DISABLE_DISK_CACHE", raising=False)
    _clear_process_memos()
    yield root
    _clear_process_memos()


def _clear_process_memos():
    # Every in-process memo, not only the GEMM one: a kernel another test built while the cache pointed elsewhere
    # would otherwise count as "in this process's memory only" here (warmup then reports it as not on disk).
    jit.clear_memo()
    grouped._segments_memo.clear()
    quantization.clear_memo()


@pytest.fixture(scope="session")
def shared_cache_dir(tmp_path_factory):
    """One cache shared by the compile-heavy CPU tests (each kernel compiled once per run)."""
    return tmp_path_factory.mktemp("shared-cache")


@pytest.fixture
def plan_calls(monkeypatch):
    """record(module) -> a list that receives the M of each later call of module.plan (how the GPU tests see which
    decode kernel a Gemm call dispatched to)."""
    def record(module):
        seen = []
        original = module.plan

        def recording(spec, arch, m, *args, **kwargs):
            seen.append(m)
            return original(spec, arch, m, *args, **kwargs)

        monkeypatch.setattr(module, "plan", recording)
        return seen

    return record


@pytest.fixture
def fake_gpu_memory(monkeypatch):
    """Every pointer counts as device memory on GPU 0, inside an allocation reaching 1 GiB past it (for
    fakes.FakeDeviceArray; nothing is dereferenced)."""
    monkeypatch.setattr(arrays, "_device_of_pointer", lambda ptr: 0)
    monkeypatch.setattr(arrays, "allocation_end", lambda ptr: ptr + (1 << 30))
