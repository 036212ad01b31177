import json

import pytest

from deepgemm_jit import cli, device


def test_demo_without_gpu_compiles_and_says_so(cache_dir, capsys):
    if device.gpu_count():
        pytest.skip("a GPU is present: the GPU demo runs in the GPU tests")
    assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "No GPU found" in out and str(cache_dir) in out
    assert "compiled and cached, not run" in out


def test_demo_without_gpu_says_when_nothing_was_stored(tmp_path, monkeypatch, capsys):
    """An unusable cache directory (here a file): the kernels live in memory only, and demo said they were cached,
    printing cubin paths that did not exist (review, session 60)."""
    if device.gpu_count():
        pytest.skip("a GPU is present: the GPU demo runs in the GPU tests")
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    monkeypatch.setenv("DEEPGEMM_JIT_CACHE_DIR", str(not_a_dir))
    with pytest.warns(Warning):
        assert cli.main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "(memory only)" in out and "NOT all saved to the disk cache" in out and str(not_a_dir) not in out


def test_explain_json(cache_dir, capsys):
    # sm_80: the portable family
    assert cli.main(["explain", "100", "201", "300", "--dtype", "tf32", "--layout", "tn", "--arch", "sm_80",
                     "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["family"] == "sm80" and info["local_bytes"] == 0 and info["sass"]["HMMA"] > 0
    assert info["cubin"].startswith(str(cache_dir)) and info["staging"] is None


def test_explain_says_which_packed_operands_are_staged(cache_dir, capsys):
    """fp16 tn with N = 201: B's (K, N) rows and D's rows are not 16-byte multiples, so every call copies them into
    aligned buffers for the Hopper kernel; K = 4100 nt stages A and B; aligned rows are read in place."""
    for argv, staged in ((["100", "201", "300", "--layout", "tn"], ["b", "d"]), (["64", "256", "4100"], ["a", "b"]),
                         (["64", "256", "4096"], [])):
        assert cli.main(["explain", *argv, "--dtype", "fp16", "--arch", "sm_90a", "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["family"] == "sm90" and info["staging"]["packed_staged"] == staged, (argv, info["staging"])
        assert ("pad these rows" in info["staging"]["note"]) == bool(staged)


def test_explain_says_which_packed_operands_calls_may_realign(cache_dir, capsys):
    """BF16 K = 4104: 8208-byte rows, TMA-legal but every other one 16 bytes into a 32-byte sector, so calls
    may copy A or B (sm90_rules.sm90_realign_roles); K = 4112 (a 32-byte multiple) and TF32 K = 4104 are read in
    place."""
    for argv, dtype, realigned in ((["4096", "4096", "4104"], "bf16", ["a", "b"]),
                                   (["4096", "4096", "4112"], "bf16", []), (["4096", "4096", "4104"], "tf32", [])):
        assert cli.main(["explain", *argv, "--dtype", dtype, "--arch", "sm_90a", "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["staging"]["packed_staged"] == [] and info["staging"].get("realigned", []) == realigned, argv
    assert cli.main(["explain", "4096", "4096", "4104", "--dtype", "bf16", "--arch", "sm_90a"]) == 0
    assert "realign   a and b: rows an odd multiple of 16 bytes" in capsys.readouterr().out
    # TF32 nn above 256 rows runs the nt twin on a transposed copy of b; a (K = 4100: 16400-byte rows, off sectors)
    # is read as stored and realigned like any operand (explain returned before saying so; review, session 60)
    assert cli.main(["explain", "4096", "4096", "4100", "--dtype", "tf32", "--layout", "nn", "--arch", "sm_90a",
                     "--json"]) == 0
    staging = json.loads(capsys.readouterr().out)["staging"]
    assert staging["transposed"] == ["b"] and staging["realigned"] == ["a"], staging


def test_explain_names_the_decode_kernel(cache_dir, capsys):
    """Calls with M <= 8 run a weight-streaming kernel: gemv.py's for nt (gemv_rows.py's row sweep at M = 1 with
    16-bit weights), gemv_kn.py's for TF32 nn / tn."""
    assert cli.main(["explain", "1", "2112", "7168", "--arch", "sm_90a"]) == 0
    assert ("decode    M <= 8: gemv_bf16_bf16_t1, gemv_rows_bf16_bf16_m1_224x4, gemv_rows_bf16_bf16_m2_224x4 (M <= 2: "
            "224 threads x 4 words a row, grid 528; warps_k 8, grid 132;") in capsys.readouterr().out
    assert cli.main(["explain", "1", "7168", "16384", "--arch", "sm_90a"]) == 0
    assert ("decode    M <= 2: gemv_rows_bf16_bf16_m1_512x4, gemv_rows_bf16_bf16_m2_512x4 (M <= 2: 512 threads x 4 "
            "words a row, grid 264; needs" in capsys.readouterr().out)
    assert cli.main(["explain", "1", "4096", "4096", "--dtype", "tf32", "--layout", "nn", "--arch", "sm_90a"]) == 0
    assert "decode    M <= 8: gemv_kn_tf32_fp32_c2 (cluster 2, grid 128;" in capsys.readouterr().out
    assert cli.main(["explain", "1", "4096", "4096", "--layout", "nn", "--arch", "sm_90a"]) == 0
    assert "\ndecode " not in capsys.readouterr().out  # 16-bit nn: the Hopper tiles stream faster


def test_explain_fp8_with_epilogue_json(cache_dir, capsys):
    """Issue 4's check from the command line: QGMMA in the SASS and no local memory."""
    assert cli.main(["explain", "4096", "7168", "2048", "--dtype", "fp8_e4m3", "--scaling", "row", "--epilogue",
                     "bias+gelu", "--arch", "sm_90a", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["family"] == "sm90" and info["local_bytes"] == 0 and info["sass"]["QGMMA"] > 0
    assert info["spec"]["scaling"] == "row" and info["spec"]["epilogue"] == "bias+gelu"
    assert info["m_hint"] == info["m_bucket"] == 4096


def test_explain_names_the_m_bucket(cache_dir, capsys):
    """Between 512 and 4096 rows the tile is chosen for M rounded up to 128 rows (400 rows: 512), except where
    swapped tiles are weighed (plain 16-bit, K >= 2048, up to 2048 rows: 8 rows, config.m_bucket_for)."""
    assert cli.main(["explain", "586", "4096", "1536", "--arch", "sm_90a"]) == 0
    assert "(M hint 586, tile chosen for M bucket 640)" in capsys.readouterr().out
    assert cli.main(["explain", "586", "4096", "7168", "--arch", "sm_90a"]) == 0
    assert "(M hint 586, tile chosen for M bucket 592)" in capsys.readouterr().out
    assert cli.main(["explain", "400", "4096", "1536", "--arch", "sm_90a", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["m_bucket"] == 512
    # a grouped GEMM hinted at 300 rows per group has its tile chosen at 512 (config.tile_bucket), and says so
    import deepgemm_jit as dg

    g = dg.build_grouped(4096, 7168, dtype="bf16", expected_m=300, num_groups=8, arch="sm_90a")
    assert g.explain()["m_bucket"] == 512 and dg.build(300, 4096, 1536, arch="sm_90a").explain()["m_bucket"] == 320
    assert dg.build(300, 4096, 7168, arch="sm_90a").explain()["m_bucket"] == 304


def test_explain_text_and_cache_commands(cache_dir, capsys):
    assert cli.main(["explain", "64", "64", "64", "--arch", "sm_90a"]) == 0
    text = capsys.readouterr().out
    assert "HGMMA" in text  # 64x64x64 nt bf16 goes to the Hopper family
    assert "wgmma     serialized by ptxas: no" in text  # README lists it in this view too (it was JSON only)
    assert cli.main(["cache", "list"]) == 0
    listing = capsys.readouterr().out
    assert "1 kernels" in listing
    key = listing.splitlines()[1].split()[0]
    assert cli.main(["cache", "info", key]) == 0
    assert json.loads(capsys.readouterr().out)["arch"] == "sm_90a"
    assert cli.main(["cache", "clear"]) == 2
    assert cli.main(["cache", "clear", "--yes"]) == 0
    assert "removed 1" in capsys.readouterr().out


def test_cache_commands_refuse_what_they_cannot_do(cache_dir, capsys, monkeypatch):
    """review: `cache info` without KEY said "N entries match None"; arguments another action takes were ignored;
    a clear that removed nothing (read-only cache) reported every kernel removed and exited 0."""
    from deepgemm_jit import cache

    assert cli.main(["explain", "64", "64", "64", "--arch", "sm_90a", "--dtype", "fp8"]) == 0  # build's aliases
    capsys.readouterr()
    assert cli.main(["cache", "info"]) == 2
    assert "cache info needs a KEY" in capsys.readouterr().err
    for argv, word in ((["cache", "list", "abc"], "KEY"),
                       (["cache", "info", "ab", "--older-than", "3"], "--older-than"),
                       (["cache", "prune", "--older-than", "3", "--yes"], "--yes")):
        assert cli.main(argv) == 2
        assert f"takes no {word}" in capsys.readouterr().err
    monkeypatch.setattr(cache.DiskCache, "remove", lambda self, key: False)  # as a read-only cache's unlink fails
    assert cli.main(["cache", "clear", "--yes"]) == 1
    captured = capsys.readouterr()
    assert "removed 0 kernels" in captured.out and "could not remove 1 kernels" in captured.err
    monkeypatch.setenv("DEEPGEMM_JIT_DISABLE_DISK_CACHE", "1")
    assert cli.main(["cache", "clear", "--yes"]) == 2 and cli.main(["cache", "list"]) == 0


def test_cli_reports_bad_arguments(cache_dir, capsys):
    assert cli.main(["explain", "0", "8", "8", "--arch", "sm_90a"]) == 2
    assert "M must be" in capsys.readouterr().err


def test_explain_split_k_and_fp32(cache_dir, capsys):
    """The text form shows the split-K rule of a split-K kernel, and --dtype fp32 explains the 3xTF32 GEMM."""
    assert cli.main(["explain", "64", "2112", "7168", "--arch", "sm_90a"]) == 0
    out = capsys.readouterr().out
    assert "_sk" in out and "split-K   shares per tile by M" in out and "M=4096: 1" in out
    assert cli.main(["explain", "64", "256", "100", "--dtype", "fp32", "--arch", "sm_90a", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["spec"]["dtype"] == "fp32" and info["inner_spec"]["promoted"] and info["local_bytes"] == 0
    assert cli.main(["explain", "64", "256", "100", "--dtype", "fp32", "--arch", "sm_90a"]) == 0
    out = capsys.readouterr().out   # K = 100 is no multiple of 32: both operands are split
    assert "3xTF32    split kernel" in out and "from [hi | lo] operands of 256 columns" in out
    assert cli.main(["explain", "64", "256", "128", "--dtype", "fp32", "--arch", "sm_90a"]) == 0
    assert "A as [hi | lo] of 256 columns and the raw weight" in capsys.readouterr().out

