"""M buckets: every M of a bucket shares one compiled kernel and one heuristic choice (pure Python)."""
from __future__ import annotations


# M buckets: (lo, hi, step) ranges where M is rounded up to a whole step of rows, powers of two elsewhere. A tile's
# wave count changes with every M block, and a tile chosen for the bucket's top can run far from it at the bucket's
# bottom: with power-of-two buckets every M of (512, 1024] ran the 1024-row tile, 128x256 for BF16 4096 x 7168, which
# at 586 rows makes 80 tiles on 132 SMs (76.4 us; the tile the cost model picks for 640 rows, 128x160: 52.0; cuBLAS
# 49.3). H200, docs/NOTES.md session 21 (scripts/exp_m_buckets.py): 128-row buckets in (512, 4096] took BF16 from
# 0.821 to 0.925 and 0.937 to 0.989 geomean against cuBLAS, FP8 per-tensor 1.042 -> 1.063, FP8 block 1.021 -> 1.032
# and 1.094 -> 1.090 (99 rows at M = 586..3500). M in (256, 320] has its own bucket, 5 blocks of the 64-row tiles the
# cost model weighs there for 8-bit types (SM90_ROWS64_BUCKETS; 16-bit costs 128-row tiles at 320 rows), and M in
# (320, 384] its own too: the 512-row bucket's tiles ran there 1.13x slower in geomean (BF16) and 1.10x (FP8
# per-tensor) than the cost model's picks for 384 rows (H200 session 24, scripts/exp_m_buckets.py --against rows,
# bench/results/*exp-m-buckets-384-rows-s24*, 14 shapes x 330 / 384 rows: BF16 24576 x 1536 54.5 -> 43.8 us, 4096 x
# 7168 40.5 -> 34.1, FP8 7168 x 16384 81.8 -> 66.1; against cuBLAS BF16 0.90 -> 1.02, FP8 1.00 -> 1.10; one row 1.3%
# slower); against the 512-row bucket's kernels (--against no384, *exp-m-buckets-384-vs-512-bucket-*): FP16 1.119x,
# TF32 1.129x, FP8 block 1.013x (the one changed row 1.205x), none slower; fp32's raw-B GEMM 8-37% faster than the
# 512-row bucket's tiles on 5 shapes (*exp-fp32-384-bucket-*). At 400 / 448 rows the cost model's picks equal the
# 512-row bucket's on the same shapes. M in (128, 192] has its own bucket since session 40, for the 64-row tiles of
# SM90_ROWS64_UNSPLIT_BUCKETS. Small M otherwise keeps powers of two (the decode rules were measured on them). The
# 128-row steps reach 16384 rows since session 54: with powers of two above 4096, every M of (4096, 8192] took the
# tile priced for 8192 rows, whose last wave can be nearly empty at the M that runs (128x256 at 6537 x 4608: 936
# tiles, 7.1 waves). H200, same-call A/B of the 8192 / 16384-row bucket's pick against the 128-row bucket's on 38
# random problems where they differ (scripts/bucket_rows.py, M 4265-15803, bf16 / fp16 / FP8 tensor, row and block,
# DeepSeek and models-suite shapes; bench/results/*exp-ab-m-buckets-above-4096*): geomean 0.963 of the old time, 31
# rows faster by more than 1% (bf16 4399 x 2112 x 7168 209.2 -> 172.0 us, 4390 x 4096 x 4096 216.1 -> 197.0, fp16
# 11562 x 4096 x 14336 2073 -> 1976), 3 slower by 1.8-4.7% (FP8 block 128x176 at K >= 14336, 15124 x 3584 x 18944
# 1754 -> 1836). Above 16384 rows a 128-row block is under 1% of M, and every M takes the 16384-row bucket's tile.
M_BUCKET_STEPS = ((128, 384, 64), (512, 16384, 128))


def m_bucket(m: int) -> int:
    """The M a config is chosen for: M rounded up to a whole step of rows inside a range of M_BUCKET_STEPS, else to
    a power of two in [64, 16384].

    Heuristics see this representative, not the exact M, so that every M of a bucket shares one
    compiled kernel (and the functional ``gemm`` one memo entry); above 16384 rows the wave
    quantisation the heuristics model no longer changes the choice.
    """
    for lo, hi, step in M_BUCKET_STEPS:
        if lo < m <= hi:
            return -(-m // step) * step
    bucket = 64
    while bucket < m and bucket < 16384:
        bucket *= 2
    return bucket


def next_m_bucket(bucket: int) -> int:
    """The bucket after `bucket` (warmup lists a range's buckets with it): the bucket of the next row; past the
    largest bucket, twice it (so that a walk up to it ends)."""
    nxt = m_bucket(bucket + 1)
    return nxt if nxt > bucket else 2 * bucket
