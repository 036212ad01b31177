"""pytest plugin for the stream tests' negative control (GPU): every call runs its kernels on one non-blocking stream
of its own, whatever the call or torch asked for. A stream test that can fail then fails: its input is written late
on the intended stream, which that stream does not wait for. (Session 36 used the legacy default stream here: three
torch tests still passed, their 10 ms sleep over before the first call had compiled its kernel; they now warm up
first and spin 0.3 s.)

    PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/scripts python3 -m pytest -p stream_fault_plugin -m gpu \\
        tests/test_gpu.py::test_streams_and_ordering ...      # every test must FAIL
"""
import cupy

from deepgemm_jit import runtime


_wrong = {}


def _wrong_stream(kind, stream, device_id):
    if device_id not in _wrong:
        with cupy.cuda.Device(device_id):
            _wrong[device_id] = cupy.cuda.Stream(non_blocking=True)
    return _wrong[device_id]


runtime.stream_for = _wrong_stream
