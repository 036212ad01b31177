"""CUDA graph capture helpers of the GPU tests: a call captured after a first, uncaptured one, and replays with
fresh inputs judged against float64 each time."""
from deepgemm_jit import reference


def capture_call(g, a, b, out):
    """(graph, stream): g(a, b, out=out) run once on a new non-blocking stream (compiling, loading, planning and
    sizing workspaces outside the capture), out poisoned again, then the same call captured (not run: out is
    checked to be still all NaN)."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        g(a, b, out=out, stream=stream)
        reference.poison(out, stream)
        stream.synchronize()
        stream.begin_capture()
        g(a, b, out=out, stream=stream)
        graph = stream.end_capture()
    stream.synchronize()
    assert reference.num_nonfinite(out) == out.size  # captured, not run
    return graph, stream


def replay_with_fresh_a(graph, stream, spec, a, b, out, times=3, dtype="bf16"):
    """Launch a captured call `times` times, each with fresh values copied into A (made on the current stream,
    copied on `stream`) and D poisoned first, and check D against the float64 reference each time."""
    import cupy

    for _ in range(times):
        fresh = reference.random_matrix(a.shape, dtype)  # alive until the stream is synchronised below
        cupy.cuda.Device().synchronize()
        cupy.cuda.runtime.memcpyAsync(a.data.ptr, fresh.data.ptr, a.nbytes, 3, stream.ptr)
        reference.poison(out, stream)
        graph.launch(stream)
        stream.synchronize()
        err = reference.error(out, reference.reference(spec, a, b))
        assert reference.within_bound(err, dtype), err
