"""What an sm90 tile is made of (pure Python, no GPU): threads and consumer warpgroups, accumulator registers,
shared memory, and which tiles, layouts and epilogues the kernel template can take. These mirror gemm_sm90.cuh and
change with it; the heuristic's measured preferences live in sm90_rules, swapped tiles in sm90_swap_ab.
"""
from __future__ import annotations

from . import dtypes
from .spec import GemmSpec


# Hopper's per-block opt-in maximum is 232,448 B; the sm90 family stays 1 KiB under it because the
# driver reserves 1 KiB of system shared memory per block (cuobjdump shows SHARED:1024).
SM90_SMEM_BUDGET_BYTES = 232448 - 1024
# SM count assumed when compiling for sm_90a without a GPU (H100 SXM / H200); with a GPU the
# device's own count is used.
DEFAULT_SM90_NUM_SMS = 132
# Input types whose operands the sm90 family also takes MN-major (layouts nn, tn, tt): wgmma's trans immediates
# exist for 16-bit operands only; tf32 and 8-bit operands are read K-major (layout nt).
SM90_MN_MAJOR_DTYPES = ("bf16", "fp16")
# An MN-major operand arrives in TMA boxes of 128 bytes of M / N (the swizzle span): 64 16-bit elements, so its tile
# extent (block_n for B, block_m for A) is a multiple of this (TF32 B transposed in the kernel: 32, sm90_mn_block).
SM90_MN_BLOCK = 64


def sm90_mn_block(spec: GemmSpec) -> int:
    """Elements of M / N per 128-byte TMA box of an MN-major operand of the spec's input type."""
    return 128 // dtypes.get(spec.dtype).storage_bytes


def sm90_consumers(block_m: int, pingpong: bool) -> tuple[int, int]:
    """(consumer warpgroups, rows each holds): one of 64 rows for a cooperative 64-row tile, two halves of a
    128/256-row tile, three thirds of a 192-row tile, or (ping-pong) two that each hold a whole tile (mirror of
    GemmSm90)."""
    if pingpong:
        return 2, block_m
    if block_m == 192:
        return 3, 64
    return (1, 64) if block_m == 64 else (2, block_m // 2)


def sm90_num_threads(block_m: int, pingpong: bool, swapped_block_n: int | None = None) -> int:
    """Threads of an sm90 CTA: the consumers and a producer warpgroup, at least three warpgroups (a 64-row tile's
    second one idles: the register split stays that of two consumers; mirror of GemmSm90::kNumThreads). A swapped
    tile (swapped_block_n: its block_n) has a consumer per 64 of its columns."""
    consumers = sm90_consumers(block_m, pingpong)[0] if swapped_block_n is None else swapped_block_n // 64
    return max(3, consumers + 1) * 128


def sm90_wg_split_k(spec: GemmSpec, block_m: int, pingpong: bool, swap_ab: bool = False) -> bool:
    """Whether a 64-row cooperative tile splits its K blocks between two consumer warpgroups (the second would
    otherwise idle), summed through shared memory before the epilogue: promoted FP8 with per-tensor or per-row
    scales, where it measured 2-9% faster (mirror of GemmSm90::kWGSplitK, which says why not the others). Not
    swapped tiles."""
    return (block_m == 64 and not pingpong and not swap_ab and spec.dtype in dtypes.FP8_DTYPES and spec.promote
            and spec.scaling in ("tensor", "row"))


def sm90_two_partial_sets(spec: GemmSpec, block_m: int, block_n: int, pingpong: bool, swap_ab: bool = False) -> bool:
    """Whether a promoted FP8 tile queues K block i + 1's wgmmas into a second partial set before promoting K block
    i (mirror of GemmSm90::kTwoPartialSets): tiles without K lanes whose consumer holds at most 64 accumulators
    per thread (64 / 128-row tiles up to 128 columns, ping-pong or 256-row tiles up to 64), where the extra set
    fits the registers. Measured on the H200 (session 18): FP8 per-tensor 4096x4096x7168 (128x128) 7% faster,
    fused quant_fp8_g128 (128x128) 3-9%, FP8 block 128x7168x16384 (64x128) 6%. A swapped tile's consumer holds
    block_m / 2: up to 128 rows."""
    if not (spec.dtype in dtypes.FP8_DTYPES and spec.promote):
        return False
    if swap_ab:
        return block_m // 2 <= 64
    _, rows = sm90_consumers(block_m, pingpong)
    return not sm90_wg_split_k(spec, block_m, pingpong) and (rows // 64) * (block_n // 2) <= 64


def sm90_half_partial_sets(spec: GemmSpec, block_m: int, block_n: int, pingpong: bool, swap_ab: bool = False) -> bool:
    """Whether a promoted per-tensor / per-row FP8 tile too wide for sm90_two_partial_sets issues each K block as two
    halves of block_n / 2 columns into their own partial sets (mirror of GemmSm90::kHalfSets): one m64 slice per
    consumer, halves a multiple of 8 wide, no K lanes and no fused epilogue. Block scaling keeps one set (1% slower
    with halves, session 19). Swapped tiles halve block_m (the wgmmas' N), the first half rounded up to 8 rows."""
    if not (spec.dtype in dtypes.FP8_DTYPES and spec.promote and spec.scaling != "block" and spec.epi.is_identity):
        return False
    if sm90_two_partial_sets(spec, block_m, block_n, pingpong, swap_ab):
        return False
    if swap_ab:
        return block_m >= 16
    _, rows = sm90_consumers(block_m, pingpong)
    return not sm90_wg_split_k(spec, block_m, pingpong) and rows == 64 and (block_n // 2) % 8 == 0


# Narrowest slice (bytes per row) a D ring takes, by D dtype (mirror of GemmSm90::kRingD): FP32 from 16 columns;
# 16-bit from 16 columns too (a chunk of the epilogue, two 8-column groups, must lie inside one slice).
_D_RING_MIN_SLICE_BYTES = {"fp32": 64, "bf16": 32, "fp16": 32}


def sm90_d_ring_problem(spec: GemmSpec, block_n: int, d_ring: int) -> str | None:
    """Why D cannot leave through a ring of `d_ring` slices (KernelConfig.d_ring), or None when it can (mirror of
    GemmSm90's static_assert): FP32 D in 64- or 128-byte slices (D tile width a multiple of 16), BF16 / FP16 D in
    32-byte or wider ones (a multiple of 16 columns), with more slices than the ring, not grouped (tiles ending
    inside their group are stored from the whole staged tile, store_rows), and no C / residual (TMA loads them into
    the staging tile)."""
    min_slice_bytes = _D_RING_MIN_SLICE_BYTES.get(spec.out_dtype)
    if min_slice_bytes is None:
        return f"out_dtype {spec.out_dtype!r} (the ring holds FP32, BF16 or FP16 slices)"
    out_cols = block_n // 2 if spec.epi.is_gated else block_n  # gated units: D tiles are half as wide
    esize = dtypes.get(spec.out_dtype).storage_bytes
    slice_bytes = sm90_d_slice_bytes(out_cols, esize)
    if slice_bytes < min_slice_bytes or out_cols * esize // slice_bytes <= d_ring:
        return (f"a D tile of {out_cols} {spec.out_dtype} columns is not more than {d_ring} slices of at least "
                f"{min_slice_bytes} bytes per row (its slices are {slice_bytes // esize} columns wide)")
    if spec.grouped:
        return "grouped GEMMs stage the whole tile (tiles ending inside their group)"
    if spec.epi.beta or spec.epi.residual:
        return "C / the residual are loaded into the whole staging tile"
    return None


def sm90_smem_bytes(spec: GemmSpec, block_m: int, block_n: int, num_stages: int, pingpong: bool = False,
                    split_k: bool = False, d_ring: int = 0, swap_ab: bool = False) -> int:
    """D staging tile per consumer (d_ring: only that many of its column slices) (+ a residual tile when the
    epilogue reads both C and a residual) + stages x (A tile
    + B tile, 128 bytes of K per row; an MN-major operand's 64-wide boxes of block_k rows take the same bytes;
    raw_b: two of each) + full/empty (raw_b: and lo_full) barriers (+ 16 bytes of epilogue-operand barriers) +
    (block scaling) each stage's scales + (row scaling) each consumer's row and column scales + (bias) the
    tile's bias as FP32 per consumer (+ 16 bytes of split-K flags) (+ the second K lane's FP32 sums of a 64-row tile,
    sm90_wg_split_k) (+ a cluster's amax exchange, sm90_quant_cluster: 16 bytes of barriers and two buffers of
    cluster x block_m words) + 1 KiB alignment slack: the layout of GemmSm90 (gemm_sm90.cuh). Swapped tiles (swap_ab):
    block_n / 64 consumers each stage block_m rows of their 64 columns (the same D bytes), and row scaling's and the
    bias's buffers hold block_m rows and 64 columns a consumer."""
    num_math_wgs, wg_rows = sm90_consumers(block_m, pingpong)
    epi = spec.epi
    out_cols = block_n // 2 if epi.is_gated else block_n  # gated units: D tiles are half as wide (kOutCols)
    out_esize = dtypes.get(spec.out_dtype).storage_bytes
    d_row_bytes = d_ring * sm90_d_slice_bytes(out_cols, out_esize) if d_ring else out_cols * out_esize
    d_bytes = num_math_wgs * wg_rows * d_row_bytes
    epi_bytes = (d_bytes if epi.beta and epi.residual else 0) + (16 if epi.beta or epi.residual else 0)
    if swap_ab:  # a consumer's 64 columns, or all block_m rows
        epi_bytes += {"none": 0, "col": block_n * 4, "row": block_n // 64 * block_m * 4}[epi.bias]
    else:
        epi_bytes += {"none": 0, "col": num_math_wgs * block_n * 4, "row": num_math_wgs * wg_rows * 4}[epi.bias]
    scale_bytes = 0
    if spec.scaling == "block":  # per stage: block_m scales of A, the tile's B blocks, 16-byte slots
        b_blocks = 1 if 128 % block_n == 0 else (block_n // 128 if block_n % 128 == 0 else block_n // 128 + 2)
        scale_bytes = num_stages * -(-(block_m + b_blocks) // 4) * 16
    if spec.scaling == "row":
        scale_bytes = (block_n // 64 * (block_m + 64) if swap_ab else num_math_wgs * (wg_rows + block_n)) * 4
    split_bytes = 16 if split_k else 0
    lane_bytes = wg_rows * block_n * 4 if sm90_wg_split_k(spec, block_m, pingpong, swap_ab) else 0
    cluster = sm90_quant_cluster(spec, block_n)
    exchange_bytes = 16 + 2 * cluster * block_m * 4 if cluster > 1 else 0
    # raw_b: a stage holds A_hi and A_lo, the raw B block and its B_lo slot, and has a third barrier (lo_full);
    # trans_b: the raw (MN-major) B block and its K-major slot, and the third barrier.
    operand_tiles = 2 if spec.raw_b else 1
    trans_b = sm90_trans_b(spec)
    barrier_bytes = -(-(3 if spec.raw_b or trans_b else 2) * num_stages * 8 // 16) * 16
    return (d_bytes + num_stages * (operand_tiles * (block_m + block_n) + (block_n if trans_b else 0)) * 128
            + barrier_bytes + scale_bytes + epi_bytes + split_bytes + lane_bytes + exchange_bytes + 1024)


def sm90_max_accumulators(spec: GemmSpec, block_m: int = 128) -> int:
    """FP32/INT32 accumulators a consumer thread may hold within its 232 registers: 128, or 176 split into
    two sets when FP8 partial sums are promoted (the partial set and the running set; 128x192 spilled to
    the stack, 128x176 did not). The three consumers of a 192-row tile (512 threads) have 128 registers, ptxas's
    ceiling for the whole kernel: 96 (192x192; 192x208 did not compile), 64 where the epilogue loads C or a
    residual, or writes a gated unit's FP32 D (192x192 kept 24-136 bytes on the stack there)."""
    if block_m == 192:
        epi = spec.epi
        if epi.beta or (epi.residual and not epi.is_gated) or (epi.is_gated and spec.out_dtype == "fp32"):
            return 64
        return SM90_THREE_CONSUMER_MAX_ACCUMULATORS
    return 176 if spec.promote else 128


SM90_THREE_CONSUMER_MAX_ACCUMULATORS = 96


def sm90_three_consumer_problem(spec: GemmSpec) -> str | None:
    """Why a spec cannot run 192-row tiles (three consumers of 128 registers, mirror of GemmSm90's static_assert),
    or None: 16-bit inputs without promotion, layout nt, dense and unsplit."""
    if spec.dtype not in ("bf16", "fp16"):
        return f"dtype {spec.dtype!r} (16-bit inputs only)"
    if not (spec.a_k_major and spec.b_k_major):
        return f"layout {spec.layout!r} (nt only)"
    if spec.grouped:
        return "grouped GEMMs"
    return None


def sm90_block_n_legal(spec: GemmSpec, block_n: int) -> bool:
    """wgmma's N: any multiple of 8 up to 256, except that integer (s8) wgmma takes only 8, 16, 24 and the
    multiples of 16 (ptxas rejects m64n136k32.s32.s8.s8), and that an MN-major B (layouts nn, tn) is loaded in
    64-column TMA boxes (one 128-byte swizzle row each): block_n a multiple of 64 (TF32 nn: 32, sm90_mn_block)."""
    if block_n % 8 or not 8 <= block_n <= 256:
        return False
    if not spec.b_k_major and block_n % sm90_mn_block(spec):
        return False
    return spec.dtype != "int8" or block_n <= 24 or block_n % 16 == 0


def sm90_layout_problem(spec: GemmSpec) -> str | None:
    """Why the sm90 family cannot read the spec's operands in its layout, or None when it can: K-major operands
    (layout nt) for every type, MN-major ones (nn, tn, tt) for bf16 / fp16, and TF32's MN-major B (layout nn), which
    the kernel transposes in shared memory (sm90_trans_b; mirror of GemmSm90's static_asserts)."""
    if spec.layout == "nt" or spec.dtype in SM90_MN_MAJOR_DTYPES or sm90_trans_b(spec):
        return None
    return (f"layout {spec.layout!r} has MN-major operands, which the sm90 family (WGMMA) reads for bf16/fp16 only; "
            f"{spec.dtype} operands must be K-major (layout 'nt')")


def sm90_trans_b(spec: GemmSpec) -> bool:
    """Whether the spec's Hopper kernel reads a TF32 B stored (K, N) (layout nn) and transposes it in shared memory
    (GemmSm90's kTransB, converter warps beside the wgmmas): plain TF32 (not promoted, not grouped, no 3xTF32
    operands), A K-major."""
    return (spec.dtype == "tf32" and spec.layout == "nn" and not spec.promote and not spec.grouped
            and not spec.hi_lo and not spec.raw_b)


# D tile widths (columns of D) whose quant_fp8_g128 tiles run in thread-block clusters of 128 / width CTAs along N,
# which exchange their rows' partial amax through distributed shared memory (GemmSm90's kCluster): small M needs
# tiles this narrow to give every SM one (64 x 4096x7168: 128 tiles of 64x32 where 128-column ones make 32).
SM90_QUANT_CLUSTER_COLS = (16, 32, 64)


def sm90_quant_cluster(spec: GemmSpec, block_n: int) -> int:
    """CTAs per thread-block cluster of the spec's Hopper kernel with tiles BLOCK_N wide (GemmSm90::kClusterN): 128 /
    D tile columns for quant_fp8_g128 tiles of SM90_QUANT_CLUSTER_COLS, else 1. Such tiles are dense, unsplit and
    cooperative (sm90_quant_cluster_problem)."""
    out_cols = block_n // 2 if spec.epi.is_gated else block_n
    return 128 // out_cols if spec.epi.has_group_scales and out_cols in SM90_QUANT_CLUSTER_COLS else 1


# Clusters of 2 / 4 / 8 CTAs (one per SM) that the H200 keeps resident at once (cuOccupancyMaxActiveClusters on the
# 64x64 / 64x32 / 64x16 quant_fp8_g128 kernels, bf16 and FP8 block alike; scripts/cluster_residency.py, session 59):
# a GPC runs whole clusters only, so clusters of 4 or 8 fill 120 of the 132 SMs.
SM90_CLUSTER_RESIDENT_132 = {2: 66, 4: 30, 8: 15}


def sm90_cluster_sms(cluster: int, num_sms: int) -> int:
    """The SMs a persistent walk of clusters of `cluster` CTAs keeps busy on a GPU of num_sms SMs (the cost model's
    SM count for such tiles; launches ask the driver: launch.cluster_grid). Other SM counts than the H200's 132 scale
    its residency."""
    if cluster == 1:
        return num_sms
    resident = SM90_CLUSTER_RESIDENT_132.get(cluster, 132 // (2 * cluster)) * num_sms // 132
    return max(1, min(num_sms // cluster, resident)) * cluster


def sm90_cluster_tiles(spec: GemmSpec, m: int, block_m: int, block_n: int) -> int:
    """Cluster tiles of M rows for tiles BLOCK_N wide (TileScheduler's cluster walk): M blocks x the N blocks in
    groups of sm90_quant_cluster (the last group may reach past N); the tile count where there is no cluster."""
    cluster = sm90_quant_cluster(spec, block_n)
    return -(-m // block_m) * -(-(-(-spec.n // block_n)) // cluster)


def sm90_quant_cluster_problem(spec: GemmSpec, block_n: int, pingpong: bool = False, split_k: bool = False,
                               swap_ab: bool = False) -> str | None:
    """Why a tile BLOCK_N wide whose group quantization runs across a cluster (sm90_quant_cluster) cannot take this
    kind of tile, or None (mirror of GemmSm90's static_assert: dense, unsplit, cooperative)."""
    if sm90_quant_cluster(spec, block_n) == 1:
        return None
    for flag, what in ((spec.grouped, "grouped GEMMs"), (pingpong, "ping-pong tiles"), (split_k, "split-K tiles"),
                       (swap_ab, "swapped tiles")):
        if flag:
            return (f"quant_fp8_g128 tiles narrower than a 1x128 group quantize across a thread-block cluster, "
                    f"which {what} do not run")
    return None


def sm90_epilogue_block_n_problem(spec: GemmSpec, block_n: int) -> str | None:
    """Why the fused epilogue cannot use tiles BLOCK_N wide, or None when it can (mirror of GemmSm90's
    static_asserts): gated units pair 8 gate with 8 up columns (BLOCK_N multiple of 16), quant_fp8_g128 needs tiles
    of whole 1x128 groups of D (128 or 256 output columns: a group's amax is reduced inside the tile) or, in dense
    GEMMs, of 16, 32 or 64 (a cluster's CTAs reduce it together: sm90_quant_cluster), and a D tile row must be whole
    16-byte chunks (TMA store boxes; 1-byte outputs need 16 columns)."""
    epi = spec.epi
    if epi.is_gated and block_n % 16:
        return f"gated units ({epi.gate}) need block_n to be a multiple of 16, got {block_n}"
    out_cols = block_n // 2 if epi.is_gated else block_n
    widths = (128, 256) if spec.grouped else (*SM90_QUANT_CLUSTER_COLS, 128, 256)
    if epi.has_group_scales and out_cols not in widths:
        return (f"quant_fp8_g128 needs D tiles of {', '.join(map(str, widths[:-1]))} or {widths[-1]} columns "
                f"(whole 1x128 groups{', or parts of one in a cluster' if not spec.grouped else ''}), got {out_cols}"
                + (" (block_n / 2: gated)" if epi.is_gated else ""))
    if (out_cols * dtypes.get(spec.out_dtype).storage_bytes) % 16:
        return f"a D tile row of {out_cols} {spec.out_dtype} columns is not a whole number of 16-byte chunks"
    return None


def sm90_accumulators(block_m: int, block_n: int, promote: bool, pingpong: bool = False) -> int:
    """Accumulator registers per consumer thread for a tile (mirror of GemmSm90's static_assert)."""
    per_wg_rows = sm90_consumers(block_m, pingpong)[1]
    return (per_wg_rows // 64) * (block_n // 2) * (2 if promote else 1)


def sm90_supports(spec: GemmSpec, arch: str) -> bool:
    """Whether the Hopper family builds this spec's kernel: sm_90a and a layout its WGMMA reads for the type (nt for
    every type; nn, tn, tt for bf16 / fp16). Calls whose operands TMA cannot describe (row pitches or bases not
    16-byte aligned: an odd K, K = 4100 in 16 bits, a sliced view) run it on aligned copies (Gemm._staged_roles,
    staging.py): 2-4x faster than the portable kernel with 1-, 2- or 4-element loads on every row measured
    (1000 x 1000 x 1002 BF16 68.0 -> 20.9 us, 4096 x 4096 x 4100 810 -> 363; cuBLAS 24.1 / 544;
    bench/results/*exp-staging-s25*). The portable family serves other archs, other layouts, and calls captured
    in a CUDA graph before the staging buffers were sized."""
    if dtypes.is_quantized(spec.dtype) or spec.epilogue != "none" or spec.grouped:
        return arch == "sm_90a"
    return arch == "sm_90a" and sm90_layout_problem(spec) is None


def _packed_row_bytes(spec: GemmSpec) -> dict[str, int]:
    """Row bytes of the packed (contiguous) operands whose rows the spec fixes: A's rows of K when K-major, B's
    rows (of K, or of N when MN-major), D's rows of N_out. An MN-major A's rows are M long (per call)."""
    esize = dtypes.get(spec.dtype).storage_bytes
    b_esize = 4 if spec.raw_b else esize  # raw_b: the caller's FP32 weight
    rows = {"b": spec.b_shape()[1] * b_esize, "d": spec.n_out * dtypes.get(spec.out_dtype).storage_bytes}
    if spec.a_k_major:
        rows["a"] = spec.a_shape(1)[1] * esize
    return rows


def sm90_unaligned_rows(spec: GemmSpec) -> list[str]:
    """The operands whose packed rows TMA cannot describe (row bytes not a multiple of 16), which every call of
    the Hopper kernel copies into aligned buffers (Gemm._staged_roles): 'a' / 'b' for K-major rows of K, 'b' for an
    MN-major B's rows of N, 'd' for D's rows of N_out. An MN-major A's rows (M) are judged per call."""
    return [role for role, nbytes in sorted(_packed_row_bytes(spec).items()) if nbytes % 16]


def sm90_off_sector_rows(spec: GemmSpec) -> list[str]:
    """The packed A / B whose rows TMA reads in place but every other one of which starts 16 bytes into a 32-byte
    sector (row bytes an odd multiple of 16): calls copy those whose copy pays (sm90_realign_roles,
    Gemm._staged_roles)."""
    return [role for role, nbytes in sorted(_packed_row_bytes(spec).items())
            if role != "d" and nbytes % 16 == 0 and nbytes % 32]


def sm90_d_slice_bytes(block_n: int, out_esize: int) -> int:
    """Width of the column slices the sm90 epilogue stores D in: the widest of 128/64/32/16 bytes
    that divides a tile row (mirror of StoreTraits in gemm_sm90.cuh)."""
    row_bytes = block_n * out_esize
    for width in (128, 64, 32, 16):
        if row_bytes % width == 0:
            return width
    # (a ValueError like every other refusal of a tile: a forced block_n such as 100 raised StopIteration)
    raise ValueError(f"block_n={block_n}: a D tile row of {row_bytes} bytes is not a multiple of 16 (TMA store "
                     "boxes); use a multiple of 8 columns (16-bit D) or 4 (FP32 D)")


# The last share holds its accumulators while it loads and adds the partials: 128 per thread (128x256) spilled
# (ptxas, 168 registers at entry), 112 (128x224) did not. A bias keeps its registers live through the tile: with one,
# 128x216 / 128x224 spilled 40-72 bytes (any epilogue with a bias), 128x200 did not (tests/fuzz.py found it).
SPLIT_MAX_ACCUMULATORS = 112
SPLIT_MAX_ACCUMULATORS_BIAS = 100


def split_max_accumulators(spec: GemmSpec) -> int:
    """Accumulators per thread a split-K tile of `spec` may hold (SPLIT_MAX_ACCUMULATORS[_BIAS])."""
    return SPLIT_MAX_ACCUMULATORS if spec.epi.bias == "none" else SPLIT_MAX_ACCUMULATORS_BIAS
