"""MN-major operands in the Hopper family (layouts nn, tn, tt; bf16 / fp16) without a GPU.

1. A NumPy model of the shared-memory address math, the only correctness check possible here: TMA's 128-byte
   swizzled box writes (tensor maps as launch.py encodes them, boxes as the producer issues them) against the
   tensor cores' reads through the kernel's wgmma descriptors, interpreted with the PTX ISA canonical layouts
   (docs/experiments/sm90-mn-major.md). Every element of every wgmma operand of a stage must be the right element
   of A or B (or zero past M / N / K). The same model reproduces the K-major (nt) path, which runs correctly on the
   H200, so the model's reading of the swizzle and of the descriptor fields is anchored to hardware; mutated
   descriptors (LBO / SBO swapped, a wrong trans flag, no swizzle) must fail it.
2. The model's replica of the kernel's offsets and descriptors is tied to gemm_sm90.cuh by compiling static_asserts
   on the kernel's own constexpr functions (desc_a_base / desc_a_at / desc_b_base / desc_b_at, kMnBlockBytes).
3. Real NVRTC compiles of the new variants to sm_90a (HGMMA with the transpose flags, one TMA load per box, no
   local memory, no serialised wgmmas, the shared-memory mirror equal to the kernel's), heuristic choices and
   validation errors.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import deepgemm_jit as dg
from deepgemm_jit import compiler, config, dtypes, launch, sass, sm90_rules, sm90_tiles
from deepgemm_jit.arrays import MatrixView
from deepgemm_jit.spec import GemmSpec, OperandLayout
from probes import assert_probe_ties
from sm90_kernels import compiled_clean

ARCH = "sm_90a"
ESIZE = 2                      # bf16 / fp16
BLOCK_K = 64                   # 128 bytes of K
SPAN = 128                     # bytes of the swizzle span (one swizzle row)
MN_BLOCK = SPAN // ESIZE       # M / N elements of one MN-major box
MN_BLOCK_BYTES = BLOCK_K * SPAN
MMA_K = 16                     # K of one m64nNk16 wgmma
K_GROUP_BYTES = 8 * SPAN       # 8 rows of the swizzle atom


# ---------------------------------------------------------------------------------------------------------------
# What the kernel computes (a replica of gemm_sm90.cuh; test_replica_matches_the_kernel ties it to the C++)
# ---------------------------------------------------------------------------------------------------------------

def operand_offset(k_major: bool, mn: int, k: int) -> int:
    """GemmSm90::operand_offset: the start of the operand of M / N index mn (multiple of 64) and K step k."""
    if k_major:
        return mn * SPAN + k * MMA_K * ESIZE
    return (mn // MN_BLOCK) * MN_BLOCK_BYTES + k * MMA_K * SPAN


def desc_k_major(addr: int) -> int:
    return ((addr & 0x3FFFF) >> 4) | (1 << 16) | ((K_GROUP_BYTES >> 4) << 32) | (1 << 62)


def desc_mn_major(addr: int) -> int:
    return ((addr & 0x3FFFF) >> 4) | ((MN_BLOCK_BYTES >> 4) << 16) | ((K_GROUP_BYTES >> 4) << 32) | (1 << 62)


@dataclasses.dataclass(frozen=True)
class KernelModel(OperandLayout):
    """One GemmSm90 instantiation's operand handling: layout (a_k_major / b_k_major from OperandLayout), tile,
    consumers."""

    layout: str
    block_m: int
    block_n: int
    pingpong: bool = False

    @property
    def consumers(self) -> tuple[int, int]:
        return sm90_tiles.sm90_consumers(self.block_m, self.pingpong)

    def wg_row_offset(self, wg: int) -> int:
        return 0 if self.pingpong else wg * self.consumers[1]

    def operand_desc(self, k_major: bool, addr: int) -> int:
        return desc_k_major(addr) if k_major else desc_mn_major(addr)

    def desc_a_base(self, stage_a: int, wg: int) -> int:
        return self.operand_desc(self.a_k_major, stage_a + operand_offset(self.a_k_major, self.wg_row_offset(wg), 0))

    def desc_a_at(self, base: int, mi: int, k: int) -> int:
        return base + (operand_offset(self.a_k_major, mi * 64, k) >> 4)

    def desc_b_base(self, stage_b: int) -> int:
        return self.operand_desc(self.b_k_major, stage_b)

    def desc_b_at(self, base: int, k: int) -> int:
        return base + (operand_offset(self.b_k_major, 0, k) >> 4)

    # The trans immediates of the wgmma (tnspA / tnspB in the SASS): 1 = MN-major.
    @property
    def trans_a(self) -> bool:
        return not self.a_k_major

    @property
    def trans_b(self) -> bool:
        return not self.b_k_major

    @staticmethod
    def mn_box_col(mn0: int, j: int, extent: int) -> int:
        """GemmSm90::mn_box_col: box j's M / N index, a box wholly past the tensor moved onto its last box."""
        return min(mn0 + j * MN_BLOCK, (extent - 1) // MN_BLOCK * MN_BLOCK)

    def stage_boxes(self, k_major: bool, rows: int, mn0: int, k_idx: int, extent: int
                    ) -> list[tuple[int, tuple[int, int]]]:
        """GemmSm90::load_operand: (byte offset in the stage buffer, (col, row) box coordinates) of each TMA load."""
        if k_major:
            return [(0, (k_idx, mn0))]
        return [(j * MN_BLOCK_BYTES, (self.mn_box_col(mn0, j, extent), k_idx)) for j in range(rows // MN_BLOCK)]


class SwappedStrides(KernelModel):
    """Negative control: LBO and SBO of the MN-major descriptor exchanged."""

    def operand_desc(self, k_major, addr):
        if k_major:
            return desc_k_major(addr)
        return ((addr & 0x3FFFF) >> 4) | ((K_GROUP_BYTES >> 4) << 16) | ((MN_BLOCK_BYTES >> 4) << 32) | (1 << 62)


class WrongTrans(KernelModel):
    """Negative control: MN-major operands issued without the trans immediate (read as K-major)."""

    trans_a = False
    trans_b = False


# ---------------------------------------------------------------------------------------------------------------
# What the hardware does (PTX ISA: TMA tiled mode with SWIZZLE_128B; wgmma canonical layouts)
# ---------------------------------------------------------------------------------------------------------------

def swizzle_128b(addr):
    """The 16-byte unit inside each 128-byte row XORed with the row index mod 8, on the shared address."""
    return addr ^ (((addr >> 7) & 7) << 4)


def tma_load(smem: np.ndarray, dst: int, tensor: np.ndarray, tmap: dict, col: int, row: int, swizzle=swizzle_128b
             ) -> int:
    """cp.async.bulk.tensor.2d: element (row + i, col + j) of `tensor` (zero outside it) to the 2-byte slot of shared
    byte address swizzle(dst + i * box row bytes + j * 2). Returns the transaction bytes (the whole box)."""
    rows, cols = tensor.shape
    assert (tmap["rows"], tmap["cols"]) == (rows, cols) and tmap["swizzle"] == SPAN
    assert rows == 1 or tmap["pitch"] == cols * ESIZE  # (a single row's pitch is never used; launch rounds it up)
    box_rows, box_cols = tmap["box_rows"], tmap["box_cols"]
    assert box_cols * ESIZE == SPAN and dst % 1024 == 0, "a 128B-swizzled box row is one swizzle span, 1024-aligned"
    i, j = np.meshgrid(np.arange(box_rows), np.arange(box_cols), indexing="ij")
    r, c = row + i, col + j
    inside = (r < rows) & (c < cols)
    values = np.where(inside, tensor[np.minimum(r, rows - 1), np.minimum(c, cols - 1)], 0)
    slots = swizzle(dst + i * SPAN + j * ESIZE) // ESIZE
    assert (smem[slots] == -1).all(), "a shared-memory slot written twice in one stage"
    smem[slots] = values
    return box_rows * box_cols * ESIZE


def wgmma_addresses(desc: int, k_major: bool, mn_extent: int, swizzle=swizzle_128b) -> np.ndarray:
    """Shared byte address of element (mn, kk) of an m64nNk16 operand read through `desc` (mn_extent x 16).

    Canonical layouts with the 128-byte swizzle, in 2-byte elements (T = 8 per 16 bytes):
      K-major:  ((8, m), (T, 2)) : ((8T, SBO), (1, T))   row mn at (mn % 8) * 128 + (mn // 8) * SBO, K along it;
      MN-major: ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO))   mn at (mn % 64) * 2 + (mn // 64) * LBO, K row kk
                at (kk % 8) * 128 + (kk // 8) * SBO;
    the swizzle acting on the resulting address (base offset 0: patterns start on 1024-byte boundaries)."""
    start = (desc & 0x3FFF) << 4
    lbo = ((desc >> 16) & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    assert desc >> 62 == 1 and (desc >> 49) & 7 == 0, "128B swizzle, base offset 0"
    mn, kk = np.meshgrid(np.arange(mn_extent), np.arange(MMA_K), indexing="ij")
    if k_major:
        offset = (mn % 8) * SPAN + (mn // 8) * sbo + kk * ESIZE
    else:
        offset = (mn % MN_BLOCK) * ESIZE + (mn // MN_BLOCK) * lbo + (kk % 8) * SPAN + (kk // 8) * sbo
    return swizzle(start + offset)


# ---------------------------------------------------------------------------------------------------------------
# One stage end to end: stored operands -> tensor maps -> producer boxes -> smem -> descriptors -> operand reads
# ---------------------------------------------------------------------------------------------------------------

STAGE_A = 0x6000   # a stage's A buffer (1024-aligned, like every GemmSm90 stage buffer)


@pytest.fixture
def captured_maps(monkeypatch):
    """launch.operand_map's tensor-map arguments instead of a driver call (no GPU needed)."""
    names = ("ptr", "dtype", "rows", "cols", "pitch", "box_rows", "box_cols", "swizzle")
    monkeypatch.setattr(launch, "_tensor_map", lambda *args: dict(zip(names, args)))


def operand_tmap(stored: np.ndarray, k_major: bool, block_mn: int) -> dict:
    view = MatrixView(ptr=1 << 20, rows=stored.shape[0], cols=stored.shape[1], row_stride=stored.shape[1],
                      dtype=dtypes.numpy_dtype("bf16"), device=0)
    return launch.operand_map(view, "bf16", k_major, block_mn, BLOCK_K)


def check_stage(model: KernelModel, m: int, n: int, k: int, row0: int, n0: int, k_block: int,
                tma_swizzle=swizzle_128b, wgmma_swizzle=swizzle_128b) -> None:
    """Load one stage of tile (row0, n0) at K block k_block as the producer does and read every wgmma operand of
    every consumer as the tensor cores would; raise AssertionError on the first wrong element. Every element at an
    M index < M (A) or N index < N (B) must be exact, zero past K; elements past M / N feed only outputs that are
    never stored, so they are not compared (the producer may fill them with another box's data)."""
    # Logical operands as unique non-zero ids (0 = TMA's zero fill), stored as the layout says.
    a_log = 1 + np.arange(m * k, dtype=np.int64).reshape(m, k)
    b_log = 1 + m * k + np.arange(n * k, dtype=np.int64).reshape(n, k)
    a_stored = a_log if model.a_k_major else np.ascontiguousarray(a_log.T)
    b_stored = b_log if model.b_k_major else np.ascontiguousarray(b_log.T)
    a_bytes, b_bytes = model.block_m * SPAN, model.block_n * SPAN
    stage_b = STAGE_A + a_bytes
    smem = np.full((stage_b + b_bytes) // ESIZE, -1, dtype=np.int64)

    tx = 0
    k_idx = k_block * BLOCK_K
    for stored, k_major, rows, mn0, extent, base in ((a_stored, model.a_k_major, model.block_m, row0, m, STAGE_A),
                                                     (b_stored, model.b_k_major, model.block_n, n0, n, stage_b)):
        tmap = operand_tmap(stored, k_major, rows)
        for offset, (col, row) in model.stage_boxes(k_major, rows, mn0, k_idx, extent):
            assert row < stored.shape[0] and col < stored.shape[1], "no TMA box lies wholly outside the tensor"
            tx += tma_load(smem, base + offset, stored, tmap, col, row, tma_swizzle)
    assert tx == a_bytes + b_bytes, "the boxes' bytes are the stage's transaction bytes (kStageTxBytes)"
    assert (smem[STAGE_A // ESIZE:] != -1).all() and (smem[:STAGE_A // ESIZE] == -1).all(), \
        "the boxes fill exactly the stage's A and B buffers"

    def compare(got, log, rows, cols, extent_rows, what):
        valid = rows < extent_rows
        want = np.where(cols[None, :] < k, log[np.minimum(rows, extent_rows - 1)[:, None], np.minimum(cols, k - 1)[None, :]],
                        0)
        np.testing.assert_array_equal(got[valid], want[valid], err_msg=what)

    num_wgs, wg_rows = model.consumers
    for wg in range(num_wgs):
        base_a = model.desc_a_base(STAGE_A, wg)
        base_b = model.desc_b_base(stage_b)
        for ks in range(BLOCK_K // MMA_K):
            cols = k_idx + ks * MMA_K + np.arange(MMA_K)
            for mi in range(wg_rows // 64):
                addr = wgmma_addresses(model.desc_a_at(base_a, mi, ks), not model.trans_a, 64, wgmma_swizzle)
                assert addr.min() >= STAGE_A and addr.max() < stage_b and len(np.unique(addr)) == addr.size
                rows = row0 + model.wg_row_offset(wg) + mi * 64 + np.arange(64)
                compare(smem[addr // ESIZE], a_log, rows, cols, m, f"A {model} wg={wg} mi={mi} k={ks}")
            addr = wgmma_addresses(model.desc_b_at(base_b, ks), not model.trans_b, model.block_n, wgmma_swizzle)
            assert addr.min() >= stage_b and addr.max() < stage_b + b_bytes and len(np.unique(addr)) == addr.size
            compare(smem[addr // ESIZE], b_log, n0 + np.arange(model.block_n), cols, n, f"B {model} k={ks}")


MODELS = [KernelModel(layout, bm, bn, pp)
          for layout in ("nn", "tn", "tt")
          for bm, bn, pp in ((64, 64, False), (64, 256, False), (128, 128, False), (128, 192, False),
                             (256, 128, False), (128, 128, True), (64, 192, True))]
# The K-major path (layout nt) is correct on the H200: the model must agree with it, for odd widths too.
NT_MODELS = [KernelModel("nt", bm, bn, pp) for bm, bn, pp in ((64, 8, False), (128, 176, False), (256, 128, False),
                                                               (128, 256, False), (64, 136, True))]


@pytest.mark.parametrize("model", MODELS + NT_MODELS, ids=str)
def test_stage_address_model(model, captured_maps):
    """Interior tiles and edge tiles (M, N, K tails, whole boxes past M or N), first and last K block."""
    m, n, k = 3 * model.block_m + 40, 2 * model.block_n + 24, 4 * BLOCK_K + 40   # every tail partial
    for row0, n0 in ((0, 0), (model.block_m, model.block_n), (3 * model.block_m, 2 * model.block_n)):
        for k_block in (0, 4):
            check_stage(model, m, n, k, row0, n0, k_block)


def test_stage_model_with_small_problems(captured_maps):
    """Problems smaller than one box (M = 8 rows of a 128-row tile, N = 64 of 256, K = 24)."""
    for layout in ("nn", "tn", "tt", "nt"):
        check_stage(KernelModel(layout, 128, 256), 8, 64, 24, 0, 0, 0)
        check_stage(KernelModel(layout, 64, 64), 1, 8, 1, 0, 0, 0)


@pytest.mark.parametrize("broken", [SwappedStrides("nn", 64, 128), SwappedStrides("tn", 128, 64),
                                    SwappedStrides("tt", 64, 64), WrongTrans("nn", 64, 64), WrongTrans("tt", 64, 64)],
                         ids=lambda b: f"{type(b).__name__}-{b.layout}")
def test_model_catches_wrong_descriptors(broken, captured_maps):
    """The check has teeth: LBO and SBO exchanged, or the trans immediate left out, read wrong elements."""
    with pytest.raises(AssertionError):
        check_stage(broken, 300, 300, 300, 0, 0, 1)


def test_model_catches_a_missing_swizzle(captured_maps):
    """TMA and the tensor cores must apply the same swizzle: one side without it reads wrong elements (K-major and
    MN-major alike), while both without it would agree (the model checks agreement, the swizzle is a fact of both)."""
    plain = lambda addr: addr  # noqa: E731
    for layout in ("nt", "nn", "tn"):
        model = KernelModel(layout, 64, 64)
        for tma_swizzle, wgmma_swizzle in ((plain, swizzle_128b), (swizzle_128b, plain)):
            with pytest.raises(AssertionError):
                check_stage(model, 300, 300, 300, 0, 0, 1, tma_swizzle, wgmma_swizzle)
        check_stage(model, 300, 300, 300, 0, 0, 1, plain, plain)


# ---------------------------------------------------------------------------------------------------------------
# The replica above is the kernel's arithmetic: static_asserts on GemmSm90's own constexpr functions
# ---------------------------------------------------------------------------------------------------------------

def _gemm_type(model: KernelModel, dtype: str = "bf16") -> str:
    t = {"bf16": "bfloat16_t", "fp16": "half_t"}[dtype]
    flag = lambda b: "true" if b else "false"  # noqa: E731
    return (f"GemmSm90<{t}, {t}, {t}, 4096, 4096, {model.block_m}, {model.block_n}, 64, 2, 16, Scaling::kNone, false, "
            f"{flag(model.pingpong)}, EpilogueNone, false, false, {flag(model.a_k_major)}, {flag(model.b_k_major)}>")


def _probe_source(models, lie: bool = False) -> str:
    lines = ['#include "dgjit/gemm_sm90.cuh"', "using namespace dgjit;", "using namespace dgjit::sm90;", ""]
    asserts = []
    stage_b_base = 0x1C000
    for i, model in enumerate(models):
        lines.append(f"using G{i} = {_gemm_type(model)};")
        g = f"G{i}"
        asserts += [f"static_assert({g}::kMnBlockElems == {MN_BLOCK} && {g}::kMnBlockBytes == {MN_BLOCK_BYTES});",
                    f"static_assert({g}::kSmemABytesPerStage == {model.block_m * SPAN} && "
                    f"{g}::kSmemBBytesPerStage == {model.block_n * SPAN});"]
        num_wgs, wg_rows = model.consumers
        for wg in range(num_wgs):
            base = model.desc_a_base(STAGE_A, wg)
            for mi in range(wg_rows // 64):
                for ks in range(BLOCK_K // MMA_K):
                    want = model.desc_a_at(base, mi, ks) + (1 if lie and (wg, mi, ks) == (0, 0, 1) else 0)
                    asserts.append(f"static_assert({g}::desc_a_at({g}::desc_a_base({STAGE_A}u, {wg}u), {mi}u, {ks}u)"
                                   f" == {want}ull);")
        for ks in range(BLOCK_K // MMA_K):
            want = model.desc_b_at(model.desc_b_base(stage_b_base), ks)
            asserts.append(f"static_assert({g}::desc_b_at({g}::desc_b_base({stage_b_base}u), {ks}u) == {want}ull);")
        for mn0, j, extent in ((0, 0, 1), (0, 3, 1), (128, 1, 200), (128, 2, 200), (128, 3, 256), (192, 2, 4096)):
            want = model.mn_box_col(mn0, j, extent)
            asserts.append(f"static_assert({g}::mn_box_col({mn0}, {j}u, {extent}u) == {want});")
    lines.append('extern "C" __global__ void dgjit_probe(unsigned int* out) {')
    lines += ["  " + a for a in asserts]
    lines += ["  out[0] = 1;", "}"]
    return "\n".join(lines) + "\n"


def test_replica_matches_the_kernel():
    """Every descriptor the model derives equals what GemmSm90's desc_* functions compute (compile-time), for every
    model of the tests above; a single wrong value must fail the compile (the probe has teeth)."""
    models = MODELS + NT_MODELS
    assert_probe_ties(_probe_source(models), _probe_source(models[:1], lie=True))


# ---------------------------------------------------------------------------------------------------------------
# Real compiles of the new variants
# ---------------------------------------------------------------------------------------------------------------

VARIANTS = [  # (layout, dtype, out_dtype, block_m, block_n, pingpong, epilogue)
    ("nn", "bf16", "bf16", 128, 256, False, "none"),
    ("tn", "bf16", "bf16", 128, 192, False, "none"),
    ("tt", "bf16", "fp32", 128, 176, False, "none"),
    ("nn", "fp16", "fp16", 64, 64, False, "none"),
    ("tn", "fp16", "fp32", 64, 128, False, "none"),
    ("tt", "fp16", "bf16", 64, 112, False, "none"),
    ("nn", "bf16", "bf16", 256, 128, False, "none"),
    ("tn", "fp16", "fp16", 256, 64, False, "none"),
    ("tt", "bf16", "bf16", 128, 128, True, "none"),
    ("nn", "fp16", "fp16", 64, 192, True, "none"),
    ("nn", "bf16", "bf16", 128, 128, False, "bias+gelu"),
    ("tn", "fp16", "fp16", 64, 256, False, "beta+bias_row+silu+residual"),
    ("tt", "bf16", "bf16", 128, 256, False, "swiglu"),
]


def _tnsp_flags(cubin: bytes) -> set[tuple[bool, bool]]:
    lines = [line for line in sass.disassemble(cubin).splitlines() if "HGMMA" in line]
    return {(".tnspA" in line, ".tnspB" in line) for line in lines}


@pytest.mark.parametrize("layout,dtype,out_dtype,block_m,block_n,pingpong,epilogue", VARIANTS)
def test_compile_variants(layout, dtype, out_dtype, block_m, block_n, pingpong, epilogue, shared_cache_dir,
                          monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    spec = GemmSpec.create(2048, 1024, dtype=dtype, out_dtype=out_dtype, layout=layout, epilogue=epilogue)
    cfg = config.sm90_config(spec, block_m, block_n, pingpong=pingpong)
    art, mix, case = compiled_clean(spec, cfg, ARCH)
    assert mix.get("HGMMA", 0) > 0 and mix.get("UTMALDG", 0) > 0 and mix.get("UTMASTG", 0) > 0, case
    # The transpose immediates say which operand is MN-major, on every wgmma.
    assert _tnsp_flags(art.cubin) == {(not spec.a_k_major, not spec.b_k_major)}, case
    if not (spec.epi.beta or spec.epi.residual):  # (C / residual prefetches are TMA loads too)
        a_boxes = 1 if spec.a_k_major else block_m // 64
        b_boxes = 1 if spec.b_k_major else block_n // 64
        # Every B box also in its evict-first form (B read by few tiles, gemm_sm90.cuh kStreamBMaxReaders).
        assert sass.tma_loads(art.cubin) == (a_boxes + b_boxes, b_boxes), (case, sass.tma_loads(art.cubin))
    assert "STL" not in mix and "LDL" not in mix, case
    assert mix.get("USETMAXREG", 0) > 0 and "C7508" not in art.meta["log"], case
    launch.check_layout(art, spec)  # sm90_tiles.sm90_smem_bytes == the kernel's exported kSmemBytes


def test_compile_split_k_variant(shared_cache_dir, monkeypatch):
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    g = dg.build(64, 2112, 7168, dtype="bf16", layout="nn", arch=ARCH)
    assert g.family == "sm90" and g.config.split_k and g.config.block_n % 64 == 0, g.config.tag
    info = g.explain()
    assert info["local_bytes"] == 0 and info["sass"].get("HGMMA", 0) > 0, g.config.tag
    assert not compiler.serialization_warnings(g.artifact.meta["log"])
    assert _tnsp_flags(g.artifact.cubin) == {(False, True)}
    launch.check_layout(g.artifact, g.spec)


@pytest.mark.parametrize("layout", ["nn", "tn", "tt"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_build_chooses_sm90(layout, dtype, shared_cache_dir, monkeypatch):
    """build() without a config: the Hopper family, a legal tile, and the kernel's layout equal to the mirror."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    g = dg.build(4096, 4096, 4096, dtype=dtype, layout=layout, arch=ARCH)
    assert g.family == "sm90", g.config.tag
    assert g.spec.b_k_major or g.config.block_n % 64 == 0
    info = g.explain()
    assert info["local_bytes"] == 0 and info["spill_bytes"] == 0
    launch.check_layout(g.artifact, g.spec)


@pytest.mark.parametrize("layout", ["nn", "tn", "tt"])
def test_build_tf32_mn_major_compiles_the_nt_kernel_and_the_transpose(layout, shared_cache_dir, monkeypatch):
    """TF32 with MN-major operands (nn: above SM90_TF32_TRANS_B_MAX_M rows): the Hopper kernel of the nt twin
    (sm90_rules.kernel_spec) and the transpose kernel its calls run first (copies.py), neither with local memory;
    explain says which operands are transposed."""
    from deepgemm_jit import copies

    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    g = dg.build(2 * sm90_rules.SM90_TF32_TRANS_B_MAX_M, 1001, 1003, dtype="tf32", layout=layout, arch=ARCH)
    assert g.family == "sm90" and g.spec.layout == layout
    assert g.kernel_spec == sm90_rules.kernel_spec(g.spec, ARCH, g.m_hint)
    assert g.kernel_spec.layout == "nt" and g._transposes
    assert g.transposed_operands == tuple(r for r, k_major in zip("ab", (g.spec.a_k_major, g.spec.b_k_major))
                                          if not k_major)
    info = g.explain()
    assert info["local_bytes"] == 0 and info["sass"].get("HGMMA", 0) > 0 and info["spec"]["layout"] == layout
    assert info["staging"]["transposed"] == list(g.transposed_operands) != []
    assert info["staging"]["kernel_spec"] == g.kernel_spec.tag and "_nt_" in g.kernel_spec.tag
    assert info["staging"]["kernel_layout"] == "nt" and "transposed_in_kernel" not in info["staging"]
    art = copies.get_kernel(copies.CopySpec("transpose", 4), ARCH)
    usage = sass.resource_usage(art.cubin)[art.entry]
    assert usage.get("LOCAL", 0) == 0 and usage["SHARED"] >= 32 * 33 * 4
    mix = sass.opcode_mix(art.cubin)
    assert mix.get("LDS", 0) > 0 and mix.get("STS", 0) > 0 and mix.get("BAR", 0) > 0
    assert mix.get("ACQBULK", 0) == 1  # griddepcontrol.wait: a staged call may launch it programmatically


# ---------------------------------------------------------------------------------------------------------------
# Heuristic and validation
# ---------------------------------------------------------------------------------------------------------------

DEEPSEEK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


@pytest.mark.parametrize("layout", ["nn", "tn", "tt"])
def test_heuristic_picks_sm90_for_tma_legal_shapes(layout):
    for n, k in DEEPSEEK + [(4096, 4096), (64, 64), (256, 1000 if layout == "tn" else 1024)]:
        for dtype in ("bf16", "fp16"):
            spec = GemmSpec.create(n, k, dtype=dtype, layout=layout)
            for m in (1, 64, 128, 4096, 16384):
                cfg = config.choose_config(spec, m, ARCH, 132)
                assert cfg.family == "sm90", (layout, n, k, m)
                assert spec.b_k_major or cfg.block_n % 64 == 0, (layout, n, k, m, cfg.tag)
                cfg.check_for(spec, ARCH)
            for cfg in config.candidate_configs(spec, 4096, ARCH, 132):
                cfg.check_for(spec, ARCH)


@pytest.mark.parametrize("m,n,k,epilogue", [(1, 2112, 7168, None), (64, 4096, 7168, None), (100, 1000, 1003, None),
                                             (256, 7168, 2048, "bias+gelu"), (200, 4096, 4096, None)])
def test_build_tf32_nn_transposes_b_in_the_kernel(m, n, k, epilogue, shared_cache_dir, monkeypatch):
    """TF32 nn up to SM90_TF32_TRANS_B_MAX_M rows: the Hopper kernel of the nn spec itself (sm90_tiles.sm90_trans_b),
    whose converter warps transpose each B stage in shared memory (LDS + 16-byte STS beside the HGMMAs), no local
    memory, its shared-memory layout as sm90_tiles.sm90_smem_bytes mirrors it, no copies of B per call."""
    from deepgemm_jit import launch

    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    g = dg.build(m, n, k, dtype="tf32", layout="nn", arch=ARCH, epilogue=epilogue)
    case = f"{m}x{n}x{k} {epilogue} {g.config.tag}"
    assert g.family == "sm90" and g.kernel_spec == g.spec and not g._transposes and g.transposed_operands == (), case
    assert g.config.block_n % 32 == 0 and not g.config.pingpong, case
    info = g.explain()
    assert info["local_bytes"] == 0 and info["spill_bytes"] == 0, case
    mix = sass.opcode_mix(g.artifact.cubin)
    assert mix.get("HGMMA", 0) > 0 and mix.get("LDS", 0) > 0 and mix.get("STS", 0) > 0, (case, mix)
    unaligned = [role for role, row in (("a", k), ("b", n), ("d", n)) if row % 4]  # FP32 rows of 16-byte multiples
    assert info["staging"]["packed_staged"] == unaligned, case
    assert info["staging"]["transposed_in_kernel"] == ["b"] and "transposed" not in info["staging"], case
    launch.check_layout(g.artifact, g.spec)


def test_build_tf32_tn_small_m_copies_a_and_runs_the_nn_kernel(shared_cache_dir, monkeypatch):
    """TF32 tn up to SM90_TF32_TRANS_B_MAX_M rows: the kernel of the nn twin (sm90_rules.kernel_spec), so calls copy
    only A (M x K, small there) transposed and the kernel transposes B; explain names both and the twin's layout."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    g = dg.build(32, 1000, 1003, dtype="tf32", layout="tn", arch=ARCH)
    assert g.family == "sm90" and g.kernel_spec.layout == "nn" and g.transposed_operands == ("a",)
    assert sm90_tiles.sm90_trans_b(g.kernel_spec) and g.config.block_n % 32 == 0 and not g.config.pingpong
    staging = g.explain()["staging"]
    assert staging["transposed"] == ["a"] and staging["transposed_in_kernel"] == ["b"], staging
    assert staging["kernel_layout"] == "nn" and staging["kernel_spec"] == g.kernel_spec.tag, staging


def test_heuristic_rules_per_layout():
    fam = lambda n, k, layout, dtype="bf16", out=None: config.choose_config(  # noqa: E731
        GemmSpec.create(n, k, dtype=dtype, out_dtype=out, layout=layout), 4096, ARCH).family
    # 16-bit types build the Hopper kernel in every layout; rows TMA cannot describe are staged per call
    # (Gemm._stages): nn's A (M, K) and tt's B (N, K) rows of K = 4100, nn's B (K, N) rows of N = 4100.
    for layout in ("nn", "tn", "tt"):
        assert fam(4096, 4100, layout) == fam(4100, 4096, layout, out="fp32") == "sm90", layout
    # TF32 has no MN-major WGMMA: an MN-major A only in the portable kernel; a B stored (K, N) transposed in the
    # Hopper kernel's shared memory (sm90_tiles.sm90_trans_b)
    assert fam(4096, 4096, "nn", dtype="tf32") == "sm90"
    assert fam(4096, 4096, "tn", dtype="tf32") == "sm80"
    assert sm90_tiles.sm90_block_n_legal(GemmSpec.create(4096, 4096, dtype="tf32", layout="nn"), 96)  # 3 boxes of 32
    assert not sm90_tiles.sm90_block_n_legal(GemmSpec.create(4096, 4096, layout="nn"), 96)
    assert sm90_tiles.sm90_block_n_legal(GemmSpec.create(4096, 4096, layout="tt"), 96)  # B K-major in tt


def test_split_k_tiles_respect_mn_major_b():
    """Decode-sized M: split-K tiles are chosen for MN-major B too (where the cost model says they pay), and every
    tile, split or not, forced or chosen, is whole 64-column boxes."""
    for layout in ("nn", "tn"):
        chosen = []
        for n, k in DEEPSEEK:
            spec = GemmSpec.create(n, k, dtype="bf16", layout=layout)
            for m in (16, 32, 64, 128):
                cfg = config.choose_config(spec, m, ARCH, 132)
                assert cfg.family == "sm90" and cfg.block_n % 64 == 0, (layout, n, k, m, cfg.tag)
                chosen.append(cfg.split_k)
            forced = config.sm90_split_config(spec, 64, 132, 4)
            assert forced.block_n % 64 == 0 and forced.split_k
            forced.check_for(spec, ARCH)
        assert any(chosen), layout


def test_config_errors():
    nn = GemmSpec.create(1024, 2048, dtype="bf16", layout="nn")
    with pytest.raises(ValueError, match="multiple of 64"):
        config.sm90_config(nn, 128, 96, 3).check_for(nn, ARCH)
    config.sm90_config(nn, 128, 128, 3).check_for(nn, ARCH)
    tn = GemmSpec.create(1024, 2048, dtype="fp16", layout="tn")
    for block_m in (64, 128, 256):
        config.sm90_config(tn, block_m, 64, 2).check_for(tn, ARCH)
    tf32 = GemmSpec.create(1024, 2048, dtype="tf32", layout="tn")
    with pytest.raises(ValueError, match="bf16/fp16 only.*K-major"):
        config.sm90_config(tf32, 128, 128, 3).check_for(tf32, ARCH)
    tf32_nn = GemmSpec.create(1024, 2048, dtype="tf32", layout="nn")  # B transposed in the kernel: 32-column boxes
    config.sm90_config(tf32_nn, 128, 96, 3).check_for(tf32_nn, ARCH)
    with pytest.raises(ValueError, match="multiple of 32"):
        config.sm90_config(tf32_nn, 128, 80, 3).check_for(tf32_nn, ARCH)
    # build() with a Hopper config for a TF32 MN-major spec compiles it for its twin (sm90_rules.kernel_spec): at 64
    # rows tn's nn twin (A copied transposed, B transposed in the kernel), at 2048 its nt twin
    g = dg.build(64, 1024, 2048, dtype="tf32", layout="tn", arch=ARCH, config=config.sm90_config(tf32, 128, 128, 3))
    assert g.family == "sm90" and g.kernel_spec.layout == "nn" and g.spec.layout == "tn"
    assert g.transposed_operands == ("a",)
    g = dg.build(2048, 1024, 2048, dtype="tf32", layout="tn", arch=ARCH, config=config.sm90_config(tf32, 128, 128, 3))
    assert g.kernel_spec.layout == "nt" and g.transposed_operands == ("a", "b")


def test_epilogue_rules():
    for layout in ("nn", "tn", "tt"):
        for dtype in ("bf16", "fp16"):
            spec = GemmSpec.create(1024, 1000, dtype=dtype, layout=layout, epilogue="bias+gelu")
            assert config.choose_config(spec, 4096, ARCH).family == "sm90"
        # TF32: the nt twin's kernel on transposed copies (sm90_rules.kernel_spec)
        tf32 = GemmSpec.create(1024, 1000, dtype="tf32", layout=layout, epilogue="relu")
        assert config.choose_config(sm90_rules.kernel_spec(tf32, ARCH), 4096, ARCH).family == "sm90"
        with pytest.raises(ValueError, match="fp8_e4m3 operands K-major only"):
            GemmSpec.create(1024, 1024, dtype="fp8", scaling="tensor", layout=layout, epilogue="relu")
    with pytest.raises(ValueError, match="Hopper"):  # epilogues still have no portable kernel
        config.choose_config(GemmSpec.create(1024, 1024, layout="nn", epilogue="relu"), 4096, "sm_80")
    # 8-bit and grouped GEMMs keep their nt-only errors.
    with pytest.raises(ValueError, match="layout 'nt'"):
        GemmSpec.create(64, 64, dtype="int8", layout="tn")
    with pytest.raises(ValueError, match="grouped GEMMs take layout 'nt'"):
        GemmSpec.create(64, 64, dtype="bf16", layout="nn", grouped=True)


def test_tensor_map_boxes(captured_maps):
    """K-major: one (block_mn x 64) box; MN-major: 64-column boxes of block_k rows over the (K, MN) view."""
    k_major = operand_tmap(np.zeros((300, 1000)), True, 128)
    assert (k_major["rows"], k_major["cols"], k_major["box_rows"], k_major["box_cols"]) == (300, 1000, 128, 64)
    mn_major = operand_tmap(np.zeros((1000, 304)), False, 256)
    assert (mn_major["rows"], mn_major["cols"], mn_major["box_rows"], mn_major["box_cols"]) == (1000, 304, 64, 64)
    assert mn_major["swizzle"] == k_major["swizzle"] == 128 and mn_major["pitch"] == 304 * 2


def test_unaligned_m_of_an_mn_major_a_runs_portable(shared_cache_dir, monkeypatch):
    """tn with M % 8 != 0: A's (K, M) rows are not 16-byte multiples: the portable variant is what _artifact_for
    gives (it serves calls captured in a CUDA graph before the staging buffers are sized; other calls copy A into
    an aligned buffer for the Hopper kernel, Gemm._stages)."""
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(shared_cache_dir))
    g = dg.build(4096, 1024, 1024, dtype="bf16", layout="tn", arch=ARCH)
    assert g.family == "sm90"
    bf16 = dtypes.numpy_dtype("bf16")
    view = lambda rows, cols: MatrixView(1 << 20, rows, cols, cols, bf16, 0)  # noqa: E731
    assert g._artifact_for(view(1024, 4096), view(1024, 1024), view(4096, 1024)) is g.artifact
    fallback = g._artifact_for(view(1024, 4095), view(1024, 1024), view(4095, 1024))
    assert fallback.config.family == "sm80" and fallback.spec == g.spec


def test_sass_flag_parser(monkeypatch):
    """_tnsp_flags (what test_compile_variants asserts with) on a known listing: it re-implemented the parser inline
    and never called the helper (a review mutated _tnsp_flags and this test still passed)."""
    fake = """
        /*08e0*/                   HGMMA.64x256x16.F32.BF16 R24, gdesc[UR8].tnspB, R24, UP0 ;
        /*0900*/                   HGMMA.64x256x16.F32.BF16 R24, gdesc[UR28].tnspA.tnspB, R24 ;
        /*0920*/                   LDS R4, [R2] ;
    """
    monkeypatch.setattr(sass, "disassemble", lambda cubin: fake)
    assert _tnsp_flags(b"cubin") == {(False, True), (True, True)}
    assert re.search(r"gdesc\[UR\d+\]\.tnspA", fake.splitlines()[2])
