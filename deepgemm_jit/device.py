"""What GPU (if any) we run on, and which compile targets exist.

Every function is safe to call on a machine without a GPU or driver: they answer
"no GPU" instead of raising CUDA errors.
"""
from __future__ import annotations

import re

from .errors import NoGPUError

_ARCH = re.compile(r"^sm_(\d)(\d)(a?)$")


def normalize_arch(arch: object) -> str:
    """'sm_90a', 'sm_90', 'sm_80', ... validated; ValueError naming `arch` otherwise."""
    if not isinstance(arch, str):
        raise TypeError(f"arch must be a string such as 'sm_90a', got {type(arch).__name__}")
    value = arch.strip().lower()
    match = _ARCH.match(value)
    if not match or int(match.group(1)) < 8:
        raise ValueError(f"arch={arch!r} is not supported; use 'sm_90a' (Hopper) or sm_80/sm_86/sm_89")
    if match.group(3) and value != "sm_90a":
        raise ValueError(f"arch={arch!r}: of the 'a' targets only sm_90a is supported")
    return value


def arch_of_capability(major: int, minor: int) -> str:
    """The target we compile for on a device of this compute capability."""
    if (major, minor) == (9, 0):
        return "sm_90a"  # Hopper: take the arch-specific features (wgmma, setmaxnreg)
    return f"sm_{major}{minor}"


def gpu_count() -> int:
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no driver, no device, or a driver too old for the runtime
        return 0


def current_device_id() -> int:
    import cupy

    return int(cupy.cuda.runtime.getDevice())


def capability(device_id: int | None = None) -> tuple[int, int]:
    import cupy

    dev = cupy.cuda.Device(current_device_id() if device_id is None else device_id)
    cc = dev.compute_capability  # e.g. "90"
    return int(cc[:-1]), int(cc[-1])


def current_arch() -> str:
    """Compile target of the current device; NoGPUError if there is no usable GPU."""
    if gpu_count() == 0:
        raise NoGPUError("no CUDA GPU found: pass arch='sm_90a' (or another target) to compile "
                         "kernels without a GPU; running them needs one")
    return arch_of_capability(*capability())


def target_arch(arch: object | None) -> str:
    """The compile target of a build: `arch` validated (normalize_arch), or the current device's when None."""
    return normalize_arch(arch) if arch is not None else current_arch()


def arch_number(arch: str) -> int:
    """'sm_90a' -> 90, 'sm_80' -> 80 (0 for anything that is not a target name)."""
    match = _ARCH.match(arch)
    return 10 * int(match.group(1)) + int(match.group(2)) if match else 0


def runs_on(arch: str, major: int, minor: int) -> bool:
    """Whether a cubin for `arch` loads on a device of compute capability major.minor."""
    match = _ARCH.match(arch)
    if match is None:
        return False
    a_major, a_minor, specific = int(match.group(1)), int(match.group(2)), bool(match.group(3))
    if specific:
        return (a_major, a_minor) == (major, minor)
    # SASS is forward compatible within one major version only.
    return a_major == major and a_minor <= minor


def num_sms(device_id: int | None = None) -> int:
    import cupy

    dev_id = current_device_id() if device_id is None else device_id
    return int(cupy.cuda.runtime.getDeviceProperties(dev_id)["multiProcessorCount"])


def num_sms_or(default: int) -> int:
    """The current GPU's SM count, or `default` where there is no GPU (offline builds, explain, warmup)."""
    return num_sms() if gpu_count() > 0 else default


def l2_bytes(device_id: int | None = None) -> int:
    import cupy

    dev_id = current_device_id() if device_id is None else device_id
    return int(cupy.cuda.runtime.getDeviceProperties(dev_id)["l2CacheSize"])


def device_for_call(arch: str, ready: set[int], operand_device: int, owner: str) -> int:
    """The device a call of a kernel compiled for `arch` runs on: the current one, after checking that a GPU
    exists, that it holds the operands (`operand_device`, a's) and, once per device (remembered in `ready`), that it
    runs `arch`. `owner` names the object in the errors ("Gemm", "GroupedGemm")."""
    if not ready and gpu_count() == 0:
        raise NoGPUError(f"no CUDA GPU found: this {owner} was compiled for {arch} and can be "
                         "cached and inspected here, but running it needs a GPU")
    dev = current_device_id()
    if operand_device != dev:
        raise ValueError(f"a is on device {operand_device}, but the current device is {dev} "
                         "(torch.cuda.set_device / cupy.cuda.Device(i).use() select it)")
    if dev not in ready:
        major, minor = capability(dev)
        if not runs_on(arch, major, minor):
            raise ValueError(f"this {owner} was compiled for {arch}, the current device is "
                             f"sm_{major}{minor}: build it again with arch=None")
        ready.add(dev)
    return dev
