// Work distribution of the Hopper GEMM family (gemm_sm90.cuh): the units a persistent CTA's roles walk (Tile),
// split-K's arguments, and the two walks: TileScheduler over a dense problem's tiles (and their K shares) and
// GroupedTileScheduler over the tiles of all groups of a grouped GEMM (and, in split-K kernels, the shares of its
// last partial wave, decided on the device). Every role of a CTA constructs the same walk and sees the same units.
#pragma once
#include "dgjit/ptx_sm90.cuh"

namespace dgjit {
namespace sm90 {

// One unit of work as the workers see it: an output tile's first row in A and D (rows of all groups stacked, for
// grouped GEMMs), the end of the rows it may write (M, or its group's end), its N block and its group, and the K
// blocks [k_begin, k_end) it accumulates: all of K, or (split-K) one split's share of the tile numbered `id`.
struct Tile {
  uint32_t row0, row_end, n_block, group;
  uint32_t k_begin, k_end;
  uint32_t id, split;  // split-K: the tile's slot in the workspace and this unit's share of its K blocks
  uint32_t num_splits;  // shares of this tile's K blocks (1: the whole tile)

  // Share `split_` of `shares` of the tile's kNumKBlocks K blocks, workspace slot `slot`. (constexpr: nothing
  // changes at run time; tests/test_splitk_cpu.py evaluates it in static_asserts against its model of the shares.)
  template <uint32_t kNumKBlocks>
  DGJIT_DEVICE constexpr void set_share(uint32_t split_, uint32_t shares, uint32_t slot) {
    k_begin = split_ * kNumKBlocks / shares;
    k_end = (split_ + 1) * kNumKBlocks / shares;
    id = slot;
    split = split_;
    num_splits = shares;
  }
};

// Split-K (deepgemm_jit/splitk.py): every tile's K blocks are divided into num_splits nearly equal shares that
// different CTAs accumulate at the same time, so that a problem with fewer tiles than SMs (decode, small M) still
// keeps every SM streaming. Each share's consumer warpgroup writes its FP32/INT32 partial tile (its accumulator
// registers as they are, 16 bytes per thread and store, coalesced) to `partials` and counts itself in
// `arrivals` (one counter per tile and consumer, zero between launches). The one that arrives last sums the
// num_splits partials in split order (the same bits whichever CTA is last: deterministic) and runs the epilogue;
// it also puts the counter back to zero. partials: num_tiles * num_splits * kBlockM * kBlockN words from M = 64 on,
// fewer below (only the threads that hold rows below M keep theirs: reduce_split). `atomic` (build(...,
// deterministic=False)): every share adds its partial into the tile's first slot with vector reductions instead,
// and the last one reads that one sum and zeroes it again (the slots start zeroed); FP32 sums then depend on the
// order the shares arrive in. INT32 (INT8) kernels ignore it: their ordered sum is exact and was faster.
struct SplitArgs {
  uint32_t num_splits = 1;
  void* partials = nullptr;
  uint32_t* arrivals = nullptr;
  uint32_t atomic = 0;
  uint32_t whole_tiles = 0;  // grouped walks: units below it are whole tiles (set on the device, GroupedTileScheduler)
};

// Tile t of a grid of num_m_blocks x kNumNBlocks tiles, numbered in bands of kGroupM consecutive M blocks;
// inside a band the M block varies fastest. The CTAs running at the same time then cover a roughly
// square patch of D, so the A rows and B rows they need are read from DRAM about once and served from
// L2 afterwards.
template <uint32_t kGroupM, uint32_t kNumNBlocks>
DGJIT_DEVICE void raster(uint32_t t, uint32_t num_m_blocks, uint32_t& m_block, uint32_t& n_block) {
  static_assert(kGroupM >= 1, "band size must be positive");
  constexpr uint32_t kTilesPerBand = kGroupM * kNumNBlocks;
  const uint32_t band = t / kTilesPerBand;
  const uint32_t first_m_block = band * kGroupM;
  const uint32_t rows_left = num_m_blocks - first_m_block;
  const uint32_t band_m_blocks = rows_left < kGroupM ? rows_left : kGroupM;
  const uint32_t in_band = t - band * kTilesPerBand;
  m_block = first_m_block + in_band % band_m_blocks;
  n_block = in_band / band_m_blocks;
}

// Grouped GEMMs (mixture of experts): group g multiplies its rows of A by B_g (rows g * N ... of the stacked
// (G * N, K) weight). How its rows are given (run-time `kind`):
//   kOffsets:  bounds[g] is the end of group g's rows, its start the previous group's end (torch's `offs`);
//   kSegments: bounds[2g], bounds[2g + 1] are its start and end (from per-row expert ids, group_segments.cu.j2);
//   kMasked:   rows [g * max_m, g * max_m + bounds[g]) of A viewed as (G * max_m, K) (bounds = masked_m).
// Ranges are clamped to [0, M) (a bad offset cannot send a store outside D) and empty when they end before they
// start. `d` / `d_ld` (elements): D's base and row pitch, for tiles that end inside their group (store_rows).
enum class GroupBounds : uint32_t { kOffsets = 0, kSegments = 1, kMasked = 2 };
struct GroupArgs {
  const int32_t* bounds = nullptr;
  uint32_t num_groups = 0;
  uint32_t kind = 0;
  uint32_t max_m = 0;
  void* d = nullptr;
  int64_t d_ld = 0;
};

// [start, end) rows of group g as described above.
DGJIT_DEVICE void group_rows(const GroupArgs& ga, uint32_t m, uint32_t g, uint32_t& start, uint32_t& end) {
  int64_t s, e;
  if (ga.kind == static_cast<uint32_t>(GroupBounds::kMasked)) {
    const int32_t count = ga.bounds[g];
    s = static_cast<int64_t>(g) * ga.max_m;
    e = s + (count < 0 ? 0 : (static_cast<uint32_t>(count) < ga.max_m ? count : ga.max_m));
  } else if (ga.kind == static_cast<uint32_t>(GroupBounds::kOffsets)) {
    s = g == 0 ? 0 : ga.bounds[g - 1];
    e = ga.bounds[g];
  } else {
    s = ga.bounds[2 * g];
    e = ga.bounds[2 * g + 1];
  }
  s = s < 0 ? 0 : (s > m ? m : s);
  e = e > m ? m : e;
  e = e < s ? s : e;
  start = static_cast<uint32_t>(s);
  end = static_cast<uint32_t>(e);
}

// Persistent tile walk: CTA b takes units b, b + gridDim.x, ... Unit u is split u % num_splits of tile
// u / num_splits in the raster order (num_splits = 1 without split-K: units are tiles), so the shares of a tile
// run on neighbouring CTAs at the same time.
// kClusterN > 1 (thread-block clusters of kClusterN CTAs along x, GemmSm90's kCluster): the walk is over cluster
// tiles, one M block by kClusterN adjacent N blocks, taken by cluster c = b / kClusterN at units c, c + clusters,
// ...; the CTA of rank r takes N block kClusterN * n + r of cluster tile n, so every CTA of a cluster walks as many
// tiles as the others, in step. Where kClusterN does not divide the N blocks, the last cluster tile's ranks past
// them get N blocks past N (nothing of them is stored; K-major B boxes there lie wholly outside the tensor and are
// zero-filled, MN-major B loads GemmSm90::mn_box_col's clamped last box, which no stored element reads).
template <uint32_t kBlockM, uint32_t kNumNBlocks, uint32_t kGroupM, uint32_t kNumKBlocks, uint32_t kClusterN = 1>
struct TileScheduler {
  static constexpr uint32_t kWalkNBlocks = (kNumNBlocks + kClusterN - 1) / kClusterN;
  uint32_t m;
  uint32_t num_m_blocks;
  uint32_t num_splits;
  uint32_t num_units;
  uint32_t next_unit;

  static DGJIT_DEVICE uint32_t first_unit() { return blockIdx.x / kClusterN; }
  static DGJIT_DEVICE uint32_t stride() { return gridDim.x / kClusterN; }

  DGJIT_DEVICE TileScheduler(uint32_t m_, const GroupArgs&, const SplitArgs& sk)
      : m(m_), num_m_blocks((m_ + kBlockM - 1) / kBlockM), num_splits(sk.num_splits),
        num_units(num_m_blocks * kWalkNBlocks * sk.num_splits), next_unit(first_unit()) {}

  DGJIT_DEVICE bool next(Tile& tile) {
    if (next_unit >= num_units) return false;
    const uint32_t t = next_unit / num_splits;
    const uint32_t split = next_unit - t * num_splits;
    uint32_t m_block, walk_n_block;
    raster<kGroupM, kWalkNBlocks>(t, num_m_blocks, m_block, walk_n_block);
    tile.n_block = kClusterN * walk_n_block + blockIdx.x % kClusterN;
    tile.row0 = m_block * kBlockM;
    tile.row_end = m;
    tile.group = 0;
    tile.set_share<kNumKBlocks>(split, num_splits, t);
    next_unit += stride();
    return true;
  }
  // Tiles that read the B rows of the tile next() just returned (one per M block).
  DGJIT_DEVICE uint32_t b_readers() const { return num_m_blocks; }
  // Units handed out so far, counting the one next() just returned.
  DGJIT_DEVICE uint32_t tiles_done() const { return (next_unit - first_unit()) / stride(); }
  DGJIT_DEVICE bool has_next() const { return next_unit < num_units; }
};

// The same walk over the tiles of all groups, group after group (raster order inside a group): tile t of the
// CTA's sequence is found by moving a cursor forward through the groups, so empty and short groups cost a
// couple of loads of their bounds and no CTA ever runs an empty tile. Every role of the CTA walks it alike.
//
// Split-K on the device (split-K kernels): the group sizes are only known here, so before the CTA's roles start
// one warp counts the tiles of all groups (plan(), 32 groups per round of loads) and splits the last, partial wave:
// the first whole_tiles (whole waves of gridDim.x) run whole, and when the tiles left over would leave at least half
// of the CTAs idle, each of them gets S = min(max_splits, gridDim.x / tiles left) shares (units whole_tiles + j:
// share j % S of the j / S-th tile left, whose workspace slot is j / S). With few tiles that is every tile; with a
// wave's worth and a little more, the stragglers. Every CTA counts the same bounds, so all agree; tiles left x S <=
// gridDim.x bounds the workspace (splitk.grouped_workspace_bytes), and splitk.tail_split mirrors the rule. The count
// stops past kScanWaves waves (a tail then costs little). A launch that splits nothing runs the walk (and the roles'
// code) compiled with kSplit = false, the plain kernel's: the split walk's state in registers through the K loop
// slowed it by 2-8% (docs/NOTES.md, session 20).
template <uint32_t kBlockM, uint32_t kNumNBlocks, uint32_t kGroupM, uint32_t kNumKBlocks, bool kSplit>
struct GroupedTileScheduler {
  static constexpr uint32_t kScanWaves = 8;
  const GroupArgs& ga;
  uint32_t m;
  uint32_t next_unit;
  uint32_t whole_tiles = 0, num_splits = 1;  // kSplit: units from whole_tiles on are shares of the last tiles
  uint32_t group = 0, first_tile = 0, group_tiles = 0, m_blocks = 0, start = 0, end = 0;

  DGJIT_DEVICE GroupedTileScheduler(uint32_t m_, const GroupArgs& ga_, const SplitArgs& sk)
      : ga(ga_), m(m_), next_unit(blockIdx.x) {
    if constexpr (kSplit) {
      whole_tiles = sk.whole_tiles;
      num_splits = sk.num_splits;
    }
    if (ga.num_groups > 0) load(0);
  }

  // The launch's plan into out[0] (whole tiles) and out[1] (shares of the tiles after them; 1: nothing split);
  // one whole warp calls it.
  static DGJIT_DEVICE void plan(const GroupArgs& ga, uint32_t m, uint32_t max_splits, volatile uint32_t* out) {
    uint32_t tiles = 0;  // (not counted when the host allows one share: nothing would split)
    for (uint32_t g0 = 0; max_splits > 1 && g0 < ga.num_groups && tiles <= kScanWaves * gridDim.x; g0 += 32) {
      uint32_t mine = 0, s, e;
      if (g0 + lane_idx() < ga.num_groups) {
        group_rows(ga, m, g0 + lane_idx(), s, e);
        mine = (e - s + kBlockM - 1) / kBlockM * kNumNBlocks;
      }
#pragma unroll
      for (uint32_t offset = 16; offset > 0; offset /= 2) mine += __shfl_xor_sync(0xffffffffu, mine, offset);
      tiles += mine;
    }
    uint32_t whole = tiles, splits = 1;
    const uint32_t left = tiles % gridDim.x;
    if (max_splits > 1 && tiles <= kScanWaves * gridDim.x && left > 0 && 2 * left <= gridDim.x) {
      const uint32_t fit = gridDim.x / left;
      splits = fit < max_splits ? fit : max_splits;
      whole = tiles - left;
    }
    if (lane_idx() == 0) {
      out[0] = whole;
      out[1] = splits;
    }
  }

  DGJIT_DEVICE void load(uint32_t g) {
    group_rows(ga, m, g, start, end);
    m_blocks = (end - start + kBlockM - 1) / kBlockM;
    group_tiles = m_blocks * kNumNBlocks;
  }

  DGJIT_DEVICE bool next(Tile& tile) {
    if (group >= ga.num_groups) return false;
    uint32_t t = next_unit, split = 0, shares = 1, slot = 0;
    if constexpr (kSplit) {
      if (next_unit >= whole_tiles) {
        slot = (next_unit - whole_tiles) / num_splits;
        split = next_unit - whole_tiles - slot * num_splits;
        t = whole_tiles + slot;
        shares = num_splits;
      }
    }
    while (t >= first_tile + group_tiles) {
      if (++group >= ga.num_groups) return false;
      first_tile += group_tiles;
      load(group);
    }
    uint32_t m_block;
    raster<kGroupM, kNumNBlocks>(t - first_tile, m_blocks, m_block, tile.n_block);
    tile.row0 = start + m_block * kBlockM;
    tile.row_end = end;
    tile.group = group;
    tile.set_share<kNumKBlocks>(split, shares, slot);
    next_unit += gridDim.x;
    return true;
  }
  // Tiles that read the B rows of the tile next() just returned: its group's M blocks.
  DGJIT_DEVICE uint32_t b_readers() const { return m_blocks; }
};

}  // namespace sm90
}  // namespace dgjit
