"""pytest plugin for the stream tests' negative control (GPU): every call runs its kernels on the legacy default
stream, whatever the call or torch asked for. A stream test that can fail then fails: its input is written late on
another (non-blocking) stream, which the legacy stream does not wait for.

    PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/scripts python3 -m pytest -p stream_fault_plugin -m gpu \\
        tests/test_gpu.py::test_streams_and_ordering ...      # every test must FAIL
"""
import cupy

from deepgemm_jit import runtime


def _legacy_stream(kind, stream, device_id):
    return cupy.cuda.Stream.null


runtime.stream_for = _legacy_stream
