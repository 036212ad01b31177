"""When does ptxas serialise a wgmma loop (C7514)? Reduced kernels of the promoted FP8 K loops, compiled to sm_90a with
NVRTC on the CPU (no GPU): `python3 docs/experiments/c7514_loop_shapes.py` prints each shape and whether the
compile log carries C7514 ("non wgmma instructions reading accumulator registers of a wgmma between start and end
of the pipeline stage").

Findings (session 18, NVRTC 13.0): two register sets alternating in a loop, each read after a wait_group 1 that
follows the other set's issue, compile clean only with a tail that has two ways out (the two-set K loop's
`if (more) {issue; wait 1; read; wait 0; read} else {wait 0; read}`); the same loop with a straight tail (`wait 0;
read both`) is flagged, and so is the half-width loop (GemmSm90::mainloop_half_sets, session 19) until its
tail got an `else { wait_group 0 }` arm that never runs. Which set a wait retires is known to ptxas only along
some paths; check the log of every new loop shape (the CPU tests assert no C7514 on the variant matrix)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from deepgemm_jit import compiler, render  # noqa: E402

PRELUDE = '''#include "dgjit/common.cuh"
#include "dgjit/ptx_sm90.cuh"
using namespace dgjit;
using namespace dgjit::sm90;
template <int N> DGJIT_DEVICE void fence(float (&p)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) fence_operand(p[i]);
}
template <int N> DGJIT_DEVICE void issue(float (&p)[N], uint64_t da, uint64_t db) {
  fence(p);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 4; ++k)
    WgmmaM64<2 * N>::template mma<MmaKind::kE4M3E4M3, false, false>(p, da + k, db + k, k != 0 ? 1u : 0u);
  wgmma_commit_group();
  fence(p);
}
extern "C" __global__ void __launch_bounds__(128) dgjit_probe(float* out, uint64_t da, uint64_t db, int n,
                                                               const float* sc) {
  float acc[88];
#pragma unroll
  for (int i = 0; i < 88; ++i) acc[i] = 0.f;
'''
EPILOGUE = '''
#pragma unroll
  for (int i = 0; i < 88; ++i) out[i * 128 + threadIdx.x] = acc[i];
}
'''


def promote(part: str, off: int, scale: str, regs: int = 44) -> str:
    return (f"fence({part});\n#pragma unroll\n  for (int i = 0; i < {regs}; ++i) "
            f"acc[{off} + i] = fmaf({part}[i], sc[{scale}], acc[{off} + i]);\n")


def two_sets(tail: str) -> str:
    body = f'''
  float p0[44], p1[44];
  issue(p0, da, db);
  int k = 0;
#pragma unroll 1
  for (; k + 2 < n; k += 2) {{
    issue(p1, da + 100 * k, db); wgmma_wait_group<1>(); {promote("p0", 0, "k")}
    issue(p0, da + 100 * k + 50, db); wgmma_wait_group<1>(); {promote("p1", 0, "k + 1")}
  }}
'''
    if tail == "two ways out":
        return body + f'''
  if (k + 1 < n) {{ issue(p1, da, db); wgmma_wait_group<1>(); {promote("p0", 0, "0")} wgmma_wait_group<0>();
                    {promote("p1", 0, "1")} }}
  else {{ wgmma_wait_group<0>(); {promote("p0", 0, "0")} }}
'''
    return body + f"  wgmma_wait_group<0>(); {promote('p0', 0, '0')} {promote('p1', 0, '1')}"


def halves(tail: str) -> str:
    body = f'''
  float lo[44], hi[44];
  issue(lo, da, db);
  int k = 0;
#pragma unroll 1
  for (; k + 1 < n; ++k) {{
    issue(hi, da + 100 * k, db); wgmma_wait_group<1>(); {promote("lo", 0, "k")}
    issue(lo, da + 100 * k + 50, db); wgmma_wait_group<1>(); {promote("hi", 44, "k")}
  }}
'''
    last = (f"issue(hi, da, db); wgmma_wait_group<1>(); {promote('lo', 0, '0')} wgmma_wait_group<0>(); "
            f"{promote('hi', 44, '1')}")
    if tail == "else wait 0":
        return body + f"  if (k < n) {{ {last} }} else {{ wgmma_wait_group<0>(); }}\n"
    return body + "  " + last + "\n"


def flagged(body: str) -> bool:
    source = PRELUDE + body + EPILOGUE
    rendered = render.RenderedSource(name="probe.cu", source=source, entry="dgjit_probe",
                                     headers=render.collect_headers(source, render.templates_dir() / "include"))
    return "C7514" in compiler.compile_cubin(rendered, "sm_90a").log


if __name__ == "__main__":
    for name, body in (("two sets, straight tail", two_sets("straight")),
                       ("two sets, two ways out", two_sets("two ways out")),
                       ("halves, straight tail", halves("straight")),
                       ("halves, else wait 0", halves("else wait 0"))):
        print(f"{name:28s} {'C7514 (serialised)' if flagged(body) else 'clean'}")
