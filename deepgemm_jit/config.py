"""Kernel configurations and the heuristic that picks one (pure Python, no GPU).

A config is everything compile-time about *how* a spec is computed: family, tile
shape, pipeline depth, warp layout and the vector width of global loads.

The Hopper heuristic is layered, each module built on the ones before it:
- buckets: the M buckets a choice is made for;
- sm90_tiles: what a tile needs (threads, registers, shared memory) and which tiles a spec can take;
- sm90_rules: the measured rules and the cost model that rank tiles;
- sm90_swap_ab: swapped tiles and their prices;
- this module: KernelConfig and its validation, the pick (choose_config, candidate_configs) and the spec-aware
  buckets (m_bucket_for, tile_bucket).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from . import dtypes
from .buckets import m_bucket, next_m_bucket
from .sm90_cost import sm90_few_16b_slices, sm90_tile_cost
from .sm90_rules import (SM90_BLOCK_N, grouped_fp8_split_kernel, grouped_split_tile, sm90_block_n_preferred,
                         sm90_d_ring, sm90_pingpong_fits, sm90_pingpong_pays, sm90_priced_cost, sm90_rows64_costed,
                         sm90_stages, sm90_tile_may_split, sm90_tiles_by_cost)
from .sm90_swap_ab import (SM90_SWAP_AB_BUCKET_STEP, SM90_SWAP_AB_MIN_GAIN, SM90_SWAP_AB_ROWS64_USUAL_COST,
                           sm90_swap_ab_best, sm90_swap_ab_block_ns, sm90_swap_ab_costed, sm90_swap_ab_max_block_m,
                           sm90_swap_ab_problem)
from .sm90_tiles import (DEFAULT_SM90_NUM_SMS, SM90_SMEM_BUDGET_BYTES, sm90_accumulators, sm90_block_n_legal,
                         sm90_consumers, sm90_d_ring_problem, sm90_epilogue_block_n_problem, sm90_layout_problem,
                         sm90_max_accumulators, sm90_mn_block, sm90_num_threads, sm90_quant_cluster_problem,
                         sm90_smem_bytes, sm90_supports, sm90_three_consumer_problem, sm90_trans_b,
                         split_max_accumulators)
from .spec import GemmSpec

FAMILIES = ("sm80", "sm90")
# Opt-in dynamic shared memory per block on sm_80 / sm_90 (bytes).
SMEM_LIMIT_BYTES = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024, "sm_90": 227 * 1024}


def smem_limit_bytes(arch: str) -> int:
    base = arch.rstrip("a")
    return SMEM_LIMIT_BYTES.get(base, 99 * 1024)


MAX_GROUP_M = 256            # sm90 raster bands (sched_sm90.cuh): far above any useful band (the heuristic's 16)
MAX_THREADS_PER_CTA = 1024   # CUDA's limit (the portable family's 32 * warps_m * warps_n)
MAX_GRID_Y = 65535           # CUDA's limit on grid.y (the portable family's N blocks)
# The portable kernel's accumulators per thread: 128 (64x64 per warp) compiled without a stack (bf16 / tf32, ptxas
# of 2026-12-02); 256 spilled 288-984 bytes and 512 (a 128x128 tile on one warp) 2504-3480.
SM80_MAX_ACCUMULATORS = 128


@dataclass(frozen=True)
class KernelConfig:
    family: str
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    warps_m: int
    warps_n: int
    vec_a: int  # sm80: elements per global load of A (16 bytes / element size when aligned)
    vec_b: int
    group_m: int = 1  # sm90: M blocks walked together by the persistent scheduler (L2 reuse)
    # sm90: the two consumer warpgroups take turns on whole tiles (one's epilogue runs while the other's
    # main loop keeps the tensor cores busy) instead of splitting every tile between them.
    pingpong: bool = False
    # sm90: split-K kernel: each tile's K blocks may be shared among CTAs (how many is chosen per call, see
    # splitk.py), for problems with fewer tiles than SMs.
    split_k: bool = False
    # sm90: D leaves each consumer through a ring of this many 64- or 128-byte column slices of shared memory, each
    # stored by TMA as soon as it is written, instead of a staging tile of the consumer's whole part of D; 0: whole
    # tile.
    # The 64-128 KB a staged FP32 tile takes become pipeline stages (sm90_d_ring says where).
    d_ring: int = 0
    # sm90: the wgmmas compute each tile transposed (D^T = B A^T): B's rows are the instruction's M (64 per consumer,
    # block_n 64 / 128 / 192) and A's its N, so block_m may be any multiple of 8 up to 256 (sm90_swap_ab_problem says
    # which specs). For an M that whole 64-row blocks fit badly.
    swap_ab: bool = False

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family={self.family!r} is not one of {FAMILIES}")
        for name in ("block_m", "block_n", "block_k", "num_stages", "warps_m", "warps_n", "vec_a", "vec_b",
                     "group_m"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not isinstance(self.pingpong, bool):
            raise ValueError(f"pingpong must be a bool, got {self.pingpong!r}")
        if self.pingpong and self.family != "sm90":
            raise ValueError("pingpong consumers exist in the sm90 family only")
        if not isinstance(self.split_k, bool):
            raise ValueError(f"split_k must be a bool, got {self.split_k!r}")
        if self.split_k and (self.family != "sm90" or self.pingpong):
            raise ValueError("split_k kernels are sm90 kernels with cooperative tiles (pingpong=False)")
        if not isinstance(self.swap_ab, bool):
            raise ValueError(f"swap_ab must be a bool, got {self.swap_ab!r}")
        if self.swap_ab and (self.family != "sm90" or self.pingpong or self.split_k or self.d_ring):
            raise ValueError("swap_ab tiles are sm90 kernels with cooperative consumers, unsplit, D staged whole "
                             "(pingpong=False, split_k=False, d_ring=0)")
        if not isinstance(self.d_ring, int) or isinstance(self.d_ring, bool) or self.d_ring < 0 or self.d_ring == 1:
            raise ValueError(f"d_ring must be 0 (whole-tile staging) or a slice count >= 2, got {self.d_ring!r}")
        if self.d_ring and (self.family != "sm90" or sm90_consumers(self.block_m, self.pingpong)[1] != 64):
            raise ValueError("d_ring exists in the sm90 family, for consumers of 64 rows (cooperative tiles of 64 or "
                             f"128 rows, or ping-pong at block_m 64), got block_m={self.block_m}"
                             + (" ping-pong" if self.pingpong else ""))
        if self.num_stages < 2:
            raise ValueError("num_stages must be >= 2 (the pipeline keeps one stage in flight)")
        if self.group_m > MAX_GROUP_M:  # the scheduler multiplies it by the N blocks in 32 bits
            raise ValueError(f"group_m must be at most {MAX_GROUP_M} M blocks, got {self.group_m}")
        if self.family != "sm90" and 32 * self.warps_m * self.warps_n > MAX_THREADS_PER_CTA:
            raise ValueError(f"warps_m * warps_n = {self.warps_m * self.warps_n} warps: a CTA holds at most "
                             f"{MAX_THREADS_PER_CTA // 32}")
        if self.swap_ab and self.block_m % 8:  # the wgmma's N
            raise ValueError(f"block_m={self.block_m} is not a multiple of 8 (swapped tiles: the wgmmas' N)")
        if not self.swap_ab and self.block_m % (16 * self.warps_m):
            raise ValueError(f"block_m={self.block_m} is not a multiple of 16 * warps_m={self.warps_m}")
        if self.block_n % (8 * self.warps_n):
            raise ValueError(f"block_n={self.block_n} is not a multiple of 8 * warps_n={self.warps_n}")
        for name in ("vec_a", "vec_b"):
            if getattr(self, name) not in (1, 2, 4, 8, 16):
                raise ValueError(f"{name} must be 1, 2, 4, 8 or 16 elements (16 bytes at most)")

    @property
    def num_threads(self) -> int:
        if self.family == "sm90":
            return sm90_num_threads(self.block_m, self.pingpong, self.block_n if self.swap_ab else None)
        return 32 * self.warps_m * self.warps_n

    @property
    def tag(self) -> str:
        if self.family == "sm90":
            return (f"sm90_m{self.block_m}n{self.block_n}k{self.block_k}_s{self.num_stages}_g{self.group_m}"
                    + ("_pp" if self.pingpong else "") + ("_sk" if self.split_k else "")
                    + (f"_r{self.d_ring}" if self.d_ring else "") + ("_sw" if self.swap_ab else ""))
        return (f"{self.family}_m{self.block_m}n{self.block_n}k{self.block_k}_s{self.num_stages}"
                f"_w{self.warps_m}x{self.warps_n}_v{self.vec_a}{self.vec_b}")

    def smem_bytes(self, spec: GemmSpec) -> int:
        """Dynamic shared memory; mirrors kSmemBytes of the family's kernel (the GPU tests compare
        it with the value the sm90 module exports)."""
        if self.family == "sm90":
            return sm90_smem_bytes(spec, self.block_m, self.block_n, self.num_stages, self.pingpong, self.split_k,
                                   self.d_ring, self.swap_ab)
        esize = dtypes.get(spec.dtype).storage_bytes
        pad = 16 // esize
        a_rows, a_cols = (self.block_m, self.block_k) if spec.a_k_major else (self.block_k, self.block_m)
        b_rows, b_cols = (self.block_n, self.block_k) if spec.b_k_major else (self.block_k, self.block_n)
        stage = a_rows * (a_cols + pad) + b_rows * (b_cols + pad)
        return self.num_stages * stage * esize

    def fits(self, spec: GemmSpec, arch: str) -> bool:
        """Whether this config can compute `spec` on `arch` (check_for raises nothing)."""
        try:
            self.check_for(spec, arch)
        except ValueError:
            return False
        return True

    def check_for(self, spec: GemmSpec, arch: str) -> None:
        """Raise ValueError if this config cannot compute `spec` on `arch`."""
        if self.family == "sm90":
            _check_sm90(self, spec, arch)
            return
        if spec.grouped:  # the portable kernel has no group walk: it would multiply every row by group 0's weight
            raise ValueError("grouped GEMMs run on the sm90 family only")
        if dtypes.is_quantized(spec.dtype):
            raise ValueError(f"{spec.dtype} GEMMs run on the sm90 family only (Hopper's 8-bit WGMMA)")
        if spec.epilogue != "none":
            raise ValueError(f"fused epilogues ({spec.epilogue!r}) run on the sm90 family only")
        if spec.raw_b:
            raise ValueError("raw-B 3xTF32 GEMMs (GemmSpec.raw_b) run on the sm90 family only")
        esize = dtypes.get(spec.dtype).storage_bytes
        mma_k = 8 if spec.dtype == "tf32" else 16
        if self.block_k % mma_k:
            raise ValueError(f"block_k={self.block_k} must be a multiple of {mma_k} for {spec.dtype}")
        if spec.hi_lo and spec.k % (3 * self.block_k):  # gemm_sm80.cuh's static_assert
            segment = spec.k // 3
            raise ValueError(f"block_k={self.block_k}: the 3xTF32 GEMM's K' = {spec.k} holds three segments of "
                             f"{segment} columns, which must be whole K blocks (use a block_k dividing {segment})")
        accumulators = self.block_m // self.warps_m * (self.block_n // self.warps_n) // 32
        if accumulators > SM80_MAX_ACCUMULATORS:
            raise ValueError(f"config {self.tag}: each thread would hold {accumulators} accumulators, more than the "
                             f"{SM80_MAX_ACCUMULATORS} that fit its registers (more spill to local memory); use more "
                             "warps_m / warps_n or a smaller block")
        if -(-spec.n // self.block_n) > MAX_GRID_Y:  # the portable kernel's grid.y walks N blocks
            raise ValueError(f"N={spec.n} with block_n={self.block_n} makes {-(-spec.n // self.block_n)} column "
                             f"blocks, more than a grid's y dimension takes ({MAX_GRID_Y}); use a wider block_n")
        for name in ("vec_a", "vec_b"):
            vec = getattr(self, name)
            if vec * esize > 16:
                raise ValueError(f"{name}={vec} elements exceeds 16 bytes for {spec.dtype}")
        a_cols = self.block_k if spec.a_k_major else self.block_m
        b_cols = self.block_k if spec.b_k_major else self.block_n
        if a_cols % self.vec_a or b_cols % self.vec_b:
            raise ValueError("tile rows must hold whole vector chunks")
        if self.smem_bytes(spec) > smem_limit_bytes(arch):
            raise ValueError(
                f"config {self.tag} needs {self.smem_bytes(spec)} B of shared memory; "
                f"{arch} allows {smem_limit_bytes(arch)} B: lower num_stages or the block shape")


def _check_sm90(cfg: KernelConfig, spec: GemmSpec, arch: str) -> None:
    if arch != "sm_90a":
        raise ValueError(f"the sm90 family needs arch='sm_90a', got {arch!r}")
    layout_problem = sm90_layout_problem(spec)
    if layout_problem is not None:
        raise ValueError(f"the sm90 family cannot take this spec: {layout_problem}")
    esize = dtypes.get(spec.dtype).storage_bytes
    if cfg.block_k * esize != 128:
        raise ValueError(f"sm90 block_k must span 128 bytes ({128 // esize} for {spec.dtype}), got {cfg.block_k}")
    if cfg.swap_ab:
        _check_sm90_swap_ab(cfg, spec)
        return
    if cfg.block_m not in (64, 128, 192, 256):
        raise ValueError(f"sm90 block_m must be 64, 128, 192 or 256, got {cfg.block_m}")
    if cfg.block_m == 192:
        problem = sm90_three_consumer_problem(spec)
        if problem is None and (cfg.pingpong or cfg.split_k):
            problem = "ping-pong or split-K tiles"
        if problem is not None:
            raise ValueError(f"sm90 192-row tiles (three consumer warpgroups) cannot take {problem}")
    if sm90_trans_b(spec) and cfg.pingpong:
        raise ValueError("a TF32 B stored (K, N) is transposed by the kernel's converter warps beside cooperative "
                         "consumers: no ping-pong tiles")
    if not spec.b_k_major and cfg.block_n % sm90_mn_block(spec):
        mn_block = sm90_mn_block(spec)
        raise ValueError(f"layout {spec.layout!r} has an MN-major B, loaded in boxes of {mn_block} columns "
                         f"(128 bytes, the swizzle span): sm90 block_n must be a multiple of {mn_block}, got "
                         f"{cfg.block_n}")
    if not sm90_block_n_legal(spec, cfg.block_n):
        raise ValueError(f"sm90 block_n must be a multiple of 8 in [8, 256] (int8: 8, 16, 24 or a multiple of 16), "
                         f"got {cfg.block_n}")
    problem = (sm90_epilogue_block_n_problem(spec, cfg.block_n)
               or sm90_quant_cluster_problem(spec, cfg.block_n, cfg.pingpong, cfg.split_k))
    if problem is not None:
        raise ValueError(f"config {cfg.tag} cannot run epilogue {spec.epilogue!r}: {problem}")
    if cfg.pingpong and spec.grouped:
        raise ValueError("grouped GEMMs run cooperative tiles (pingpong=False)")
    if cfg.d_ring and sm90_d_ring_problem(spec, cfg.block_n, cfg.d_ring) is not None:
        raise ValueError(f"config {cfg.tag} stores D through a ring of {cfg.d_ring} slices, which this spec cannot: "
                         f"{sm90_d_ring_problem(spec, cfg.block_n, cfg.d_ring)}")
    if cfg.split_k and sm90_accumulators(cfg.block_m, cfg.block_n, False) > split_max_accumulators(spec):
        raise ValueError(f"split-K tiles hold at most {split_max_accumulators(spec)} accumulators per thread (the "
                         f"partials' reduction needs registers too, and a bias); {cfg.block_m}x{cfg.block_n} holds "
                         f"{sm90_accumulators(cfg.block_m, cfg.block_n, False)}")
    if cfg.pingpong and cfg.block_m not in (64, 128):
        raise ValueError(f"ping-pong consumers each hold a whole tile: block_m must be 64 or 128, got {cfg.block_m}")
    accumulators = sm90_accumulators(cfg.block_m, cfg.block_n, spec.promote, cfg.pingpong)
    if accumulators > sm90_max_accumulators(spec, cfg.block_m):
        raise ValueError(f"sm90 tile {cfg.block_m}x{cfg.block_n}{' ping-pong' if cfg.pingpong else ''} needs "
                         f"{accumulators} accumulator registers per "
                         f"thread; at most {sm90_max_accumulators(spec, cfg.block_m)} fit"
                         + (" (FP8 promotion keeps two sets)" if spec.promote else ""))
    _check_sm90_smem(cfg, spec)


def _check_sm90_smem(cfg: KernelConfig, spec: GemmSpec) -> None:
    if cfg.smem_bytes(spec) > SM90_SMEM_BUDGET_BYTES:
        raise ValueError(f"config {cfg.tag} needs {cfg.smem_bytes(spec)} B of shared memory; "
                         f"sm_90a allows {SM90_SMEM_BUDGET_BYTES} B: lower num_stages or the block shape")


def _check_sm90_swap_ab(cfg: KernelConfig, spec: GemmSpec) -> None:
    problem = sm90_swap_ab_problem(spec)
    if problem is not None:
        raise ValueError(f"sm90 swapped tiles (swap_ab) cannot take {problem}")
    block_ns = sm90_swap_ab_block_ns(spec)
    if cfg.block_n not in block_ns:
        names = ", ".join(map(str, block_ns[:-1])) + f" or {block_ns[-1]}"
        raise ValueError(f"sm90 swapped tiles of {spec.dtype} take block_n {names} (64 columns a consumer), got "
                         f"{cfg.block_n}")
    max_block_m = sm90_swap_ab_max_block_m(spec, cfg.block_n)
    if not 8 <= cfg.block_m <= max_block_m:  # (a multiple of 8: KernelConfig checks that)
        raise ValueError(f"sm90 swapped tiles of {cfg.block_n} columns take block_m a multiple of 8 up to "
                         f"{max_block_m}, got {cfg.block_m}")
    _check_sm90_smem(cfg, spec)


def sm90_ranked(spec: GemmSpec, m_hint: int, num_sms: int) -> list[KernelConfig]:
    """Every sm90 tile config by `sm90_tile_cost`, cheapest first."""
    return [sm90_config(spec, bm, bn, st, split_k=sk > 1, m_hint=m_hint)
            for _, bm, bn, st, sk in sm90_tiles_by_cost(spec, m_hint, num_sms)]


# TF32 at short K and large M: ping-pong consumers of 64 rows, D through the ring, beat the cooperative tiles (each
# consumer's epilogue, 48 KB of FP32 per 64x192 tile, runs under the other's main loop). H200 session 14, one run
# (bench/results/*tf32-pp64-s14*): 4096x32768x512 402.6 us at 64x192 vs 421.7 at the model's 128x224 (64x224 406.9,
# 64x256 416.3); at K = 1536 within 2% either way (24576x1536: 64x224 818 vs 836), at K >= 2048 5-30% slower.
TF32_SHORT_K_PINGPONG_MAX_K = 512
TF32_SHORT_K_PINGPONG_MIN_M = 1024
TF32_SHORT_K_PINGPONG_TILE = (64, 192)


def _sm90_tf32_short_k_pingpong(spec: GemmSpec, m_hint: int) -> KernelConfig | None:
    """The ping-pong tile of TF32_SHORT_K_PINGPONG_* where that measured rule applies (plain unpromoted TF32 with
    FP32 D, K <= 512, M >= 1024, N at least one tile), else None."""
    block_m, block_n = TF32_SHORT_K_PINGPONG_TILE
    if (spec.dtype != "tf32" or spec.promoted or spec.epilogue != "none" or spec.grouped or sm90_trans_b(spec)
            or spec.k > TF32_SHORT_K_PINGPONG_MAX_K or m_hint < TF32_SHORT_K_PINGPONG_MIN_M or spec.n < block_n):
        return None
    d_ring = sm90_d_ring(spec, block_m, block_n, True, m_hint)
    if not d_ring:
        return None
    cfg = sm90_config(spec, block_m, block_n, pingpong=True, d_ring=d_ring)
    return cfg if cfg.num_stages >= 3 else None


def grouped_launch_splits(spec: GemmSpec, m_hint: int, num_sms: int, groups: int) -> bool:
    """Whether launches of the heuristic's grouped kernel (choose_config(spec, m_hint, ..., num_sms, groups)) may
    split tiles: where grouped_split_tile chose the device-split kernel, not where grouped_fp8_split_kernel did
    (nor for a plain kernel)."""
    return _sm90_pick(spec, tile_bucket(spec, m_hint), num_sms, groups)[1]


def choose_sm90_config(spec: GemmSpec, m_hint: int, num_sms: int, groups: int = 1) -> KernelConfig:
    """The cheapest tile of the cost model, or the 128x128 ping-pong tile where `sm90_pingpong_pays`, or TF32's
    short-K ping-pong tile (`_sm90_tf32_short_k_pingpong`) (`groups`: see sm90_tile_cost)."""
    return _sm90_pick(spec, m_hint, num_sms, groups)[0]


@functools.lru_cache(maxsize=1024)
def _sm90_pick(spec: GemmSpec, m_hint: int, num_sms: int, groups: int = 1) -> tuple[KernelConfig, bool]:
    """choose_sm90_config's tile and whether launches of it may split on the device (grouped_launch_splits), decided
    together so that the two cannot drift apart. Memoized: a pure function of its arguments (all hashable, the
    result frozen), and at 0.65-0.9 ms it was the largest host cost of a warm build (2 cores). Where swapped tiles
    are weighed (sm90_swap_ab_costed: m_hint is then a bucket of SM90_SWAP_AB_BUCKET_STEP rows), the pick of the
    usual bucket gives way to the cheapest swapped tile when that costs less by SM90_SWAP_AB_MIN_GAIN at m_hint."""
    if groups == 1 and sm90_swap_ab_costed(spec, m_hint):
        cfg, device_splits = _sm90_pick_tile(spec, m_bucket(m_hint), num_sms, groups)
        if cfg.split_k or cfg.pingpong:
            return cfg, device_splits
        pick_cost = sm90_priced_cost(spec, m_hint, cfg.block_m, cfg.block_n, cfg.num_stages, num_sms)
        if cfg.block_m == 64:
            pick_cost *= SM90_SWAP_AB_ROWS64_USUAL_COST
        swapped = sm90_swap_ab_best(spec, m_hint, num_sms)
        if swapped is not None and swapped[0] < SM90_SWAP_AB_MIN_GAIN * pick_cost:
            _, block_m, block_n, stages = swapped
            return sm90_config(spec, block_m, block_n, stages, swap_ab=True), False
        return cfg, device_splits
    return _sm90_pick_tile(spec, m_hint, num_sms, groups)


def _sm90_pick_tile(spec: GemmSpec, m_hint: int, num_sms: int, groups: int = 1) -> tuple[KernelConfig, bool]:
    """_sm90_pick without swapped tiles, for the usual M bucket m_hint."""
    if groups == 1:
        short_k = _sm90_tf32_short_k_pingpong(spec, m_hint)
        if short_k is not None:
            return short_k, False
    ranked = sm90_tiles_by_cost(spec, m_hint, num_sms, groups=groups)
    if not ranked:  # a bug of the rules (a spec the family accepts must have a tile), not of the call
        raise ValueError(f"no sm90 tile serves {spec.tag} (M = {m_hint}); please report it")
    _, block_m, block_n, stages, splits = ranked[0]
    split_tile = grouped_split_tile(spec, m_hint, num_sms, groups, block_m, block_n) if spec.grouped else None
    if split_tile is not None:
        if split_tile == (block_m, block_n):
            stages = min(stages, sm90_stages(spec, block_m, block_n, split_k=True))
        else:  # as many stages as fit (what the measurement forced)
            (block_m, block_n), stages = split_tile, None
        return sm90_config(spec, block_m, block_n, stages, split_k=True, m_hint=m_hint), True
    if grouped_fp8_split_kernel(spec, block_m, block_n):
        stages = min(stages, sm90_stages(spec, block_m, block_n, split_k=True))
        return sm90_config(spec, block_m, block_n, stages, split_k=True, m_hint=m_hint), False
    if (splits == 1 and sm90_pingpong_pays(spec, m_hint, num_sms, block_m, block_n)
            and sm90_stages(spec, 128, 128, True) >= 3):
        return sm90_config(spec, 128, 128, pingpong=True), False
    return sm90_config(spec, block_m, block_n, stages, split_k=splits > 1, m_hint=m_hint), False


choose_sm90_config.cache_clear = _sm90_pick.cache_clear  # callers that change the rules' constants clear the memo


def candidate_configs(spec: GemmSpec, m_hint: int, arch: str, num_sms: int | None = None,
                      limit: int = 8) -> list[KernelConfig]:
    """What the tuner times for M's bucket: the heuristic's choice first (and it with one stage fewer),
    then the model's next best tiles (sm90), or the portable tile shapes (sm80)."""
    first = choose_config(spec, m_hint, arch, num_sms)
    found = [first]
    if first.family == "sm90":
        if first.num_stages > 3:
            found.append(dataclasses.replace(first, num_stages=first.num_stages - 1))
        ranked = sm90_ranked(spec, usual_tile_bucket(spec, m_hint), num_sms or DEFAULT_SM90_NUM_SMS)
        # The tiles that won somewhere in the H200 sweeps, then the model's order.
        staples = [cfg for cfg in ranked if (cfg.block_m, cfg.block_n) in ((128, 256), (128, 128), (64, 128))]
        if sm90_pingpong_fits(spec) and sm90_stages(spec, 128, 128, True) >= 3:
            pingpong = sm90_config(spec, 128, 128, pingpong=True)  # the ping-pong tile hides such epilogues
            if pingpong not in found:
                found.append(pingpong)
        for cfg in staples + ranked:
            if len(found) >= limit:
                break
            # (one per tile shape and schedule: a cooperative tile beside the ping-pong one of its shape; the
            # heuristic's pick at another stage count counts as that shape)
            if all((cfg.block_m, cfg.block_n, cfg.pingpong, cfg.swap_ab) != (f.block_m, f.block_n, f.pingpong,
                                                                           f.swap_ab) for f in found):
                found.append(cfg)
    else:
        for block_m, warps_m in ((128, 2), (64, 1)):
            for block_n, warps_n in ((128, 4), (64, 2)):
                cfg = dataclasses.replace(first, block_m=block_m, warps_m=warps_m, block_n=block_n,
                                          warps_n=warps_n)
                if cfg.fits(spec, arch) and cfg not in found:
                    found.append(cfg)
    return found[:limit]


def sm90_split_config(spec: GemmSpec, m_hint: int, num_sms: int, splits: int) -> KernelConfig:
    """The cheapest split-K tile of the cost model for M bucket m_hint with `splits` shares (build's split_k=)."""
    esize = dtypes.get(spec.dtype).storage_bytes
    out_esize = dtypes.get(spec.out_dtype).storage_bytes
    best = None
    for block_m in (128, 64):
        if block_m == 64 and not sm90_rows64_costed(spec, m_hint):
            continue
        for block_n in SM90_BLOCK_N:
            if (not sm90_block_n_legal(spec, block_n) or sm90_epilogue_block_n_problem(spec, block_n) is not None
                    or sm90_quant_cluster_problem(spec, block_n, split_k=True) is not None
                    or not sm90_tile_may_split(spec, m_hint, block_m)
                    or not sm90_block_n_preferred(spec, block_n, m_hint)
                    or sm90_accumulators(block_m, block_n, False) > split_max_accumulators(spec)
                    or sm90_accumulators(block_m, block_n, spec.promote) > sm90_max_accumulators(spec)):
                continue
            stages = sm90_stages(spec, block_m, block_n, split_k=True, m_hint=m_hint)
            if stages < 3:
                continue
            cost = sm90_tile_cost(m_hint, spec.n, spec.k, block_m, block_n, 128 // esize, out_esize, num_sms, stages,
                                  block_n // 2 if spec.epi.is_gated else None, splits=splits,
                                  few_16b_slices=sm90_few_16b_slices(spec))
            if best is None or cost < best[0]:
                best = (cost, block_m, block_n, stages)
    if best is None:
        raise ValueError(f"split_k={splits}: no split-K tile serves {spec.tag} (none that its epilogue and shared "
                         f"memory allow holds at most {split_max_accumulators(spec)} accumulators a thread); leave "
                         "split_k unset or 1")
    return sm90_config(spec, best[1], best[2], best[3], split_k=True, m_hint=m_hint)


def sm90_config(spec: GemmSpec, block_m: int, block_n: int, num_stages: int | None = None,
                group_m: int = 16, pingpong: bool = False, split_k: bool = False,
                d_ring: int | None = None, m_hint: int | None = None, swap_ab: bool = False) -> KernelConfig:
    """An sm90 config for `spec` with the given tile (stages: as many as fit when None; d_ring: the rule of
    sm90_d_ring at m_hint when None, 0 for swapped tiles)."""
    esize = dtypes.get(spec.dtype).storage_bytes
    if swap_ab and d_ring is None:
        d_ring = 0
    if d_ring is None:
        d_ring = sm90_d_ring(spec, block_m, block_n, pingpong, m_hint)
    stages = (sm90_stages(spec, block_m, block_n, pingpong, split_k, d_ring=d_ring, swap_ab=swap_ab)
              if num_stages is None else num_stages)
    return KernelConfig(family="sm90", block_m=block_m, block_n=block_n, block_k=128 // esize,
                        num_stages=stages, warps_m=2, warps_n=1, vec_a=16 // esize, vec_b=16 // esize,
                        group_m=group_m, pingpong=pingpong, split_k=split_k, d_ring=d_ring, swap_ab=swap_ab)


def max_vector(esize: int, ptr: int, row_stride: int, rows: int) -> int:
    """Widest load (elements, <= 16 bytes) that every row start of a matrix allows.

    A matrix is described by its base pointer and its row stride in elements; a
    vector load of v elements is legal when every row starts v-element aligned.
    """
    vec = 16 // esize
    while vec > 1:
        aligned_ptr = ptr % (vec * esize) == 0
        aligned_rows = rows <= 1 or row_stride % vec == 0
        if aligned_ptr and aligned_rows:
            return vec
        vec //= 2
    return 1


def packed_vectors(spec: GemmSpec) -> tuple[int, int]:
    """Vector widths for freshly allocated, packed operands (256-byte aligned bases)."""
    esize = dtypes.get(spec.dtype).storage_bytes
    a_ld = spec.k if spec.a_k_major else None  # an MN-major A has M as its row length
    b_ld = spec.k if spec.b_k_major else spec.n
    vec_a = max_vector(esize, 0, a_ld, 2) if a_ld is not None else 16 // esize
    vec_b = max_vector(esize, 0, b_ld, 2)
    return vec_a, vec_b


# Buckets measured on dense GEMMs only: grouped GEMMs choose their tile for the next bucket that is not one of them.
DENSE_ONLY_BUCKETS = (192, 320, 384)
# The 3xTF32 GEMMs of dtype fp32 (GemmSpec.promoted / raw_b) were measured at 129-192 rows in the 256-row bucket only
# (its raw-B tiles would change there: its own cost model weighs 64-row tiles at every M): they keep that choice.
FP32X3_SKIPPED_BUCKETS = (192,)


def raster_band_m_blocks(m_blocks: int, group_m: int, band: int) -> int:
    """M blocks in band `band` of the persistent tile order (sched_sm90.cuh's raster: bands of group_m consecutive
    M blocks, the last band holding what is left); its host mirror for grouped.tile_walk and launch.a_edge_used."""
    return min(group_m, m_blocks - band * group_m)


def m_bucket_for(spec: GemmSpec, m: int, arch: str = "sm_90a") -> int:
    """The M bucket Gemms of `spec` are chosen, memoized and tuned for on `arch`: m_bucket, except M rounded up to
    SM90_SWAP_AB_BUCKET_STEP rows where swapped tiles are weighed (sm90_swap_ab_costed, Hopper only: their gain is
    M's granularity, so a Gemm chosen for 1050 rows must not serve 1100)."""
    if arch == "sm_90a" and sm90_swap_ab_costed(spec, m):
        return -(-m // SM90_SWAP_AB_BUCKET_STEP) * SM90_SWAP_AB_BUCKET_STEP
    return m_bucket(m)


def buckets_within(spec: GemmSpec, bucket: int, arch: str = "sm_90a") -> tuple[int, ...]:
    """The m_bucket_for buckets of the M that m_bucket rounds up to `bucket` (warmup compiles a kernel for each):
    `bucket` itself, or its steps of SM90_SWAP_AB_BUCKET_STEP rows where swapped tiles are weighed (on Hopper)."""
    first = bucket
    while first > 1 and m_bucket(first - 1) == bucket:
        first -= 1
    if arch != "sm_90a" or not (sm90_swap_ab_costed(spec, first) or sm90_swap_ab_costed(spec, bucket)):
        return (bucket,)  # (one range: both ends tell)
    return tuple(sorted({m_bucket_for(spec, m) for m in range(first, bucket + 1)}))


def usual_tile_bucket(spec: GemmSpec, m_hint: int) -> int:
    """The bucket unswapped tiles are weighed at: tile_bucket, rounded up to its usual M bucket where swapped tiles
    made it finer (as _sm90_pick prices the usual pick; the rules that weigh 64-row tiles name usual buckets)."""
    return m_bucket(tile_bucket(spec, m_hint))


def tile_bucket(spec: GemmSpec, m_hint: int) -> int:
    """The M bucket `spec`'s tile is chosen for (choose_config; explain reports it): m_bucket_for, except that grouped
    GEMMs skip DENSE_ONLY_BUCKETS (the 192- and 320-row ones exist for dense 64-row tiles, the 384-row one was
    measured on dense GEMMs) and keep the next bucket's choice (grouped FP8 64x128 lost to 128x128 on 15 of 18 masked
    rows, session 19), and that the 3xTF32 GEMMs skip FP32X3_SKIPPED_BUCKETS."""
    bucket = m_bucket_for(spec, m_hint)
    while ((spec.grouped and bucket in DENSE_ONLY_BUCKETS)
           or ((spec.promoted or spec.raw_b) and bucket in FP32X3_SKIPPED_BUCKETS)):
        bucket = next_m_bucket(bucket)
    return bucket


def choose_config(spec: GemmSpec, m_hint: int, arch: str, num_sms: int | None = None, groups: int = 1
                  ) -> KernelConfig:
    """The heuristic choice for M's bucket: the Hopper family where it applies (sm_90a, a layout it reads for the
    type, row strides TMA describes or that Gemm._staged_roles copies: `sm90_supports`), the portable family otherwise.
    Grouped GEMMs: `m_hint` rows in each of `groups` groups."""
    if sm90_supports(spec, arch):
        cfg = choose_sm90_config(spec, tile_bucket(spec, m_hint), num_sms or DEFAULT_SM90_NUM_SMS, groups)
        cfg.check_for(spec, arch)
        return cfg
    if dtypes.is_quantized(spec.dtype) or spec.epilogue != "none" or spec.grouped or spec.raw_b:
        what = (f"{spec.dtype} GEMMs" if dtypes.is_quantized(spec.dtype) else
                "grouped GEMMs" if spec.grouped else "raw-B 3xTF32 GEMMs (GemmSpec.raw_b)" if spec.raw_b else
                f"fused epilogues ({spec.epilogue!r})")
        raise ValueError(f"{what} need a Hopper GPU (arch sm_90a), got arch {arch!r}")
    return choose_sm80_config(spec, m_hint, arch)


def choose_sm80_config(spec: GemmSpec, m_hint: int, arch: str, vec_a: int | None = None,
                       vec_b: int | None = None) -> KernelConfig:
    """The heuristic choice for the portable family.

    - 128x128 tiles with 8 warps (64x32 per warp) for large M; 64x128 with 4 warps
      when M is small, so that a few M tiles still spread over the SMs.
    - BLOCK_K of 32 for every dtype (64 bytes of 16-bit or 128 bytes of FP32 per
      row), three stages: enough cp.async in flight to hide latency. 16-bit tiles
      stay under 100 KB; 128-row FP32 (TF32) tiles need 104-108 KB with three, more
      than sm_86 / sm_89 give a block (99 KB), so there they run two stages
      (session 60: every TF32 and dtype='fp32' build above 64 rows was refused).
    - vec_a/vec_b: widest loads the operands allow (packed operands by default).
    """
    if vec_a is None or vec_b is None:
        pa, pb = packed_vectors(spec)
        vec_a = pa if vec_a is None else vec_a
        vec_b = pb if vec_b is None else vec_b
    if m_bucket(m_hint) == 64:
        block_m, warps_m = 64, 1
    else:
        block_m, warps_m = 128, 2
    cfg = KernelConfig(family="sm80", block_m=block_m, block_n=128, block_k=32, num_stages=3,
                       warps_m=warps_m, warps_n=4, vec_a=vec_a, vec_b=vec_b)
    if not cfg.fits(spec, arch):
        two_stages = dataclasses.replace(cfg, num_stages=2)
        if two_stages.fits(spec, arch):
            return two_stages
    cfg.check_for(spec, arch)
    return cfg
