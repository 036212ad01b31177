"""Compile-time probes: a kernel made of static_asserts over the templates' constexpr functions, compiled to sm_90a
with NVRTC (no GPU), so a host-side model of a kernel computation is tied to the kernel's own code."""
from deepgemm_jit import compiler, render


def compile_probe(source: str, arch: str = "sm_90a") -> None:
    """Compile `source` (entry dgjit_probe) against the templates' headers; a failed static_assert raises
    deepgemm_jit.errors.CompileError."""
    rendered = render.RenderedSource(name="probe.cu", source=source, entry="dgjit_probe",
                                     headers=render.collect_headers(source, render.templates_dir() / "include"))
    compiler.compile_cubin(rendered, arch)
