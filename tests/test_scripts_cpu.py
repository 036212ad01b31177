"""CPU tests of the experiment scripts that write rows for scripts/exp_ab_rows.sh (a wrong row costs device time)."""
from bench import runner, suites
from deepgemm_jit import config

from scripts import cost_model_audit


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
