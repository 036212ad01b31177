"""deepgemm_jit.trial (the tuner's whole call) on the CPU: tests/trial_on_numpy.py runs its code paths with NumPy
standing in for CuPy, in a subprocess so that the stand-in never reaches other tests."""
import pathlib
import subprocess
import sys


def test_trial_values_and_bounds_on_numpy():
    script = pathlib.Path(__file__).with_name("trial_on_numpy.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ok")
