"""CPU tests of the experiment scripts that write rows for scripts/exp_ab_rows.sh (a wrong row costs device time)."""
from bench import runner, suites
from deepgemm_jit import config

from scripts import bucket_rows, cost_model_audit, heuristic_snapshot


def test_cost_model_audit_rows_name_real_alternatives():
    """Every audit line parses as exp_ab_rows.sh reads it, its tiles fit the spec (D ring spelled out: a runner-up
    that needs its ring must not be forced without it), none is the pick itself, and a seed repeats its rows."""
    # bf16 1880x3584x3584: the runner-up 128x224 fits only with its D ring (session 53's first audit forced it
    # without and lost the row)
    rows = [cost_model_audit.audit_row("bf16", 1880, 3584, 3584)]
    assert "128x224s4r2" in rows[0], rows
    rows += cost_model_audit.audit_rows(8, 7, ["bf16", "fp8_tensor", "fp8_block", "fp8_row"], (257, 3000))
    assert rows[1:] == cost_model_audit.audit_rows(8, 7, ["bf16", "fp8_tensor", "fp8_block", "fp8_row"], (257, 3000))
    for line in rows:
        problem, *tiles = line.split()
        m, _, _, _, spec, _, _ = runner.parse_problem(problem)
        pick = config.choose_config(spec, m, "sm_90a", 132)
        assert 1 <= len(tiles) <= 2, line
        for tile in tiles:
            cfg = suites.forced_tile_config(spec, tile)
            cfg.check_for(spec, "sm_90a")
            assert (cfg.block_m, cfg.block_n, cfg.swap_ab) != (pick.block_m, pick.block_n, pick.swap_ab), line


def test_bucket_rows_name_the_old_and_new_picks():
    """Every line is "PROBLEM OLD NEW": NEW is build()'s pick at the problem's M, OLD the pick of the power-of-two
    bucket above 4096 rows (session 54's change), the two differ, both fit the spec, and M_BUCKET_STEPS is left as
    it was."""
    steps = bucket_rows.buckets.M_BUCKET_STEPS
    # fp16 6537 x 4608 x 3584: the 8192-row bucket's 128x256 (7.1 waves at 6537 rows), 128x192 at 6656 rows
    rows = [bucket_rows.bucket_row("fp16", 6537, 4608, 3584, 4096)]
    assert rows[0] == "fp16:6537x4608x3584 128x256s3r0 128x192s4r0", rows
    assert bucket_rows.bucket_row("bf16", 4096, 4096, 7168, 4096) is None  # a bucket of both tables: one pick
    rows += bucket_rows.bucket_rows(6, 5, ["bf16", "fp8_block"], (4097, 16384), 4096)
    assert bucket_rows.buckets.M_BUCKET_STEPS == steps
    for line in rows:
        problem, old, new = line.split()
        m, _, _, _, spec, _, _ = runner.parse_problem(problem)
        assert old != new, line
        assert suites.forced_tile_config(spec, new) == config.choose_config(spec, m, "sm_90a", 132), line
        suites.forced_tile_config(spec, old).check_for(spec, "sm_90a")


def test_heuristic_snapshot_diff_sees_a_moved_pick(tmp_path, monkeypatch):
    """The refactor check: two snapshots of the same rules diff clean (exit 0); a rule constant changed between them
    shows as moved picks (exit 1). A reduced grid keeps it quick."""
    monkeypatch.setattr(heuristic_snapshot, "KINDS", (("fp8", "block", "nt", "none", False, 1),))
    monkeypatch.setattr(heuristic_snapshot, "M_VALUES", (4096, 15353))
    monkeypatch.setattr(heuristic_snapshot, "ODD_NK", ())
    paths = [tmp_path / name for name in ("a.json", "b.json", "c.json")]
    for path in paths[:2]:
        monkeypatch.setattr("sys.argv", ["heuristic_snapshot", str(path)])
        assert heuristic_snapshot.main() == 0
    with runner.config_constants({"SM90_BLOCK_STRADDLE_MAIN_LOOP_COST": 1.0}):
        monkeypatch.setattr("sys.argv", ["heuristic_snapshot", str(paths[2])])
        assert heuristic_snapshot.main() == 0
    monkeypatch.setattr("sys.argv", ["heuristic_snapshot", "--diff", str(paths[0]), str(paths[1])])
    assert heuristic_snapshot.main() == 0
    monkeypatch.setattr("sys.argv", ["heuristic_snapshot", "--diff", str(paths[0]), str(paths[2])])
    assert heuristic_snapshot.main() == 1
