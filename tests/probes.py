"""Compile-time probes: a kernel made of static_asserts over the templates' constexpr functions, compiled to sm_90a
with NVRTC (no GPU), so a host-side model of a kernel computation is tied to the kernel's own code."""
import re

import pytest

from deepgemm_jit import compiler, render
from deepgemm_jit.errors import CompileError


def compile_probe(source: str, arch: str = "sm_90a") -> None:
    """Compile `source` (entry dgjit_probe) against the templates' headers; a failed static_assert raises
    deepgemm_jit.errors.CompileError."""
    rendered = render.RenderedSource(name="probe.cu", source=source, entry="dgjit_probe",
                                     headers=render.collect_headers(source, render.templates_dir() / "include"))
    compiler.compile_cubin(rendered, arch)


def assert_probe_ties(source, wrong_source) -> None:
    """`source` (the model's values) compiles, and `wrong_source` (the same with one value off) fails a
    static_assert: the probe ties the model to the kernel and can fail."""
    compile_probe(source)
    with pytest.raises(CompileError) as info:
        compile_probe(wrong_source)
    # Only failed assertions count: NVRTC echoes the offending source line, so any other error on a static_assert
    # line (an undefined name, a syntax slip in the lie) also put "static_assert" into the log (review).
    errors = re.findall(r": error: (.*)", info.value.log)
    assert errors and all(e.startswith("static assertion failed") for e in errors), info.value.log[:2000]
