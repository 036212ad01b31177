"""The CPU tests' compile-and-inspect step for sm90 kernels: a real NVRTC compile to sm_90a, read back from the
cubin, with the checks every variant must pass."""
from deepgemm_jit import compiler, jit, sass


def compiled_clean(spec, cfg, arch="sm_90a"):
    """`cfg`'s kernel for `spec`, after cfg.check_for: no local memory or stack, no wgmma serialisation warning
    (ptxas's C7514 family: a silent 2x slowdown), every wgmma's descriptors in uniform registers (an R2UR chain
    before each wgmma cost FP8 bias+gelu 6-15%). Returns (artifact, opcode mix, case label)."""
    cfg.check_for(spec, arch)
    art = jit.get_kernel(spec, cfg, arch)
    usage = sass.resource_usage(art.cubin)[art.entry]
    case = f"{spec.tag} {cfg.tag}"
    assert usage.get("LOCAL", 0) == 0 and usage.get("STACK", 0) == 0, (case, usage)
    assert not compiler.serialization_warnings(art.meta["log"]), (case, art.meta["log"])
    assert sass.wgmma_vector_descriptors(art.cubin) == 0, (case, "wgmma descriptors moved from vector registers")
    return art, sass.opcode_mix(art.cubin), case
