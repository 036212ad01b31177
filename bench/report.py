"""Run records: header (environment), JSON, markdown, PNG roofline plot, and the short printed table.

Pure Python except ``collect_env`` (queries the GPU when called; ``collect_host_env`` does not) and ``write_plot``
(imports matplotlib lazily).

JSON schema (``SCHEMA_VERSION``): {"schema": int, "header": {...HEADER_KEYS}, "rows": [{...ROW_KEYS, ...}]}.
``ratio`` = baseline_us / us: above 1 we are faster. ``tflops`` = 2MNK/t (TOPS for int8), ``gbps`` = (A + B + D
bytes, + the scales for FP8)/t. FP8 rows add ``err_cos`` / ``baseline_err_cos`` (DeepGEMM's cos difference vs the
BF16-input product), shown as the markdown's cos column when a run has any. Epilogue rows (``--epilogue``) add
``epilogue`` and ``overhead`` = us / plain_us (our GEMM with the epilogue vs the same GEMM without it, timed in
the same interleaved loop; ``plain_*`` keys), shown as columns when a run has any, and one geomean line per
(dtype, epilogue) with the largest overhead; their ``ratio`` is against torch's cuBLAS + separate ops.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

from . import dtypes as bench_dtypes
from . import metrics

SCHEMA_VERSION = 1
REPO_ROOT = Path(__file__).resolve().parent.parent

HEADER_KEYS = ("date", "gpu", "sm_count", "cc", "l2_bytes", "driver", "runtime", "cupy", "nvrtc", "torch",
               "torch_cuda", "numpy", "ml_dtypes", "python", "deepgemm_jit", "git_commit", "git_dirty",
               "source_sha256", "command", "suites", "dtypes", "layouts", "reps", "warmup", "flush_bytes",
               "seed", "quick", "baselines", "gpu_state")
# Every row has these keys (values may be None when a row failed); extra keys are allowed.
ROW_KEYS = ("suite", "dtype", "layout", "m", "n", "k", "status", "us", "tflops", "gbps", "baseline",
            "baseline_us", "ratio", "err", "family", "config")
ROW_STATUSES = ("ok", "fail", "error", "skipped")


# ------------------------------------------------------------------------------------------ header / provenance
def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 10.0) -> str | None:
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def git_info(root: Path = REPO_ROOT) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the code that runs.

    The commit passed along for a GPU run wins (DEEPGEMM_JIT_GIT_COMMIT, or `.carry/commit`, which
    scripts/prepare_device.sh writes right before each run, while the code still hashes as it did then): the GPU
    machine's copy may carry a stale `.git`
    (a run of 000fe47 was labelled a1c2507 by `git rev-parse` there; `source_sha256` told the truth). Else git;
    (None, None) where neither is available.
    """
    passed = os.environ.get("DEEPGEMM_JIT_GIT_COMMIT") or None
    dirty_flag = os.environ.get("DEEPGEMM_JIT_GIT_DIRTY")
    carry = root / ".carry" / "commit"
    if passed is None and carry.is_file():
        fields = carry.read_text().split()
        # "commit dirty source_sha256": trusted only while the code is what it was written for (a stale file
        # left in a local tree labelled later runs with an old commit)
        if fields and (len(fields) < 3 or fields[2] == source_sha256(root)):
            passed, dirty_flag = fields[0], (fields[1] if len(fields) > 1 else None)
    if passed is not None:
        return passed, (None if dirty_flag is None else dirty_flag == "1")
    commit = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if commit is None:
        return None, None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    # New files the run may have used (a template, a module) make it dirty too; results and scratch do not.
    untracked = _run(["git", "status", "--porcelain", "--", *UNTRACKED_DIRTY], cwd=root)
    if status is None or untracked is None:
        return commit, None
    return commit, bool(status) or any(line.startswith("??") for line in untracked.splitlines())


# Where an untracked file makes a run dirty (git pathspecs): the code a run can load.
UNTRACKED_DIRTY = ("deepgemm_jit", "templates", "bench", "scripts", ":(exclude)bench/results")


def source_sha256(root: Path = REPO_ROOT) -> str:
    """Hash of the code that ran (library, templates, bench; results excluded): identifies it without git."""
    h = hashlib.sha256()
    for top in ("deepgemm_jit", "templates", "bench"):
        base = root / top
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            rel = p.relative_to(root).as_posix()
            if not p.is_file() or "__pycache__" in rel or rel.startswith("bench/results/"):
                continue
            if p.suffix not in (".py", ".cuh", ".cu", ".h", ".jinja", ".j2", ".toml", ".md", ".txt"):
                continue
            h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _version(module_name: str) -> str | None:
    try:
        mod = __import__(module_name)
    except Exception:
        return None
    return str(getattr(mod, "__version__", "?"))


def collect_host_env(argv: list[str], module: str = "bench") -> dict:
    """The parts of a run's header that need no GPU: date, versions, commit, source hash and the command
    (``python -m <module> <argv>``)."""
    commit, dirty = git_info()
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cupy": _version("cupy"),
        "numpy": _version("numpy"),
        "ml_dtypes": _version("ml_dtypes"),
        "python": platform.python_version(),
        "deepgemm_jit": _version("deepgemm_jit"),
        "git_commit": commit,
        "git_dirty": dirty,
        "source_sha256": source_sha256(),
        "command": " ".join([os.path.basename(sys.executable), "-m", module, *argv]),
    }


def collect_env(argv: list[str], settings: dict, module: str = "bench") -> dict:
    """The run's header: collect_host_env plus the GPU, driver, NVRTC and torch. Queries the GPU (call it after
    CUDA is known to work)."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"]
    nvrtc = cupy.cuda.nvrtc.getVersion()
    torch_version = torch_cuda = None
    if _version("torch") is not None:
        torch = sys.modules["torch"]
        torch_version = str(torch.__version__)
        torch_cuda = str(getattr(torch.version, "cuda", None))
    smi = _run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw,"
                "power.limit,persistence_mode", "--format=csv,noheader", "-i", cupy.cuda.Device().pci_bus_id])
    # (by PCI bus id: nvidia-smi's ordinals ignore CUDA_VISIBLE_DEVICES, CuPy's device 0 may be another GPU)
    header = collect_host_env(argv, module)
    header.update({
        "gpu": name.decode() if isinstance(name, bytes) else str(name),
        "sm_count": int(props["multiProcessorCount"]),
        "cc": f"{props['major']}.{props['minor']}",
        "l2_bytes": int(props["l2CacheSize"]),
        "driver": cupy.cuda.runtime.driverGetVersion(),
        "runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "nvrtc": ".".join(map(str, nvrtc)),
        "torch": torch_version,
        "torch_cuda": torch_cuda,
        "gpu_state": smi,  # "sm clock, max sm clock, mem clock, temperature, power, power limit, persistence"
    })
    header.update(settings)
    return header


def result_stem(date_iso: str, suites, commit: str | None, dirty: bool | None, source_sha: str) -> str:
    """'<date>-<suites>-<gitshort>': 20261129T071502Z-deepseek_square-1a2b3c4; without a commit, 'src' and the first
    7 hex digits of source_sha256 replace the commit."""
    when = _dt.datetime.fromisoformat(date_iso).astimezone(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    short = commit[:7] if commit else f"src{source_sha[:7]}"
    if dirty:
        short += "-dirty"
    return f"{when}-{'_'.join(suites)}-{short}"


# ---------------------------------------------------------------------------------------------------- checks
def validate(record: dict) -> list[str]:
    """Problems with a run record (empty list: fine). The CPU tests hold the schema to this."""
    problems = []
    if record.get("schema") != SCHEMA_VERSION:
        problems.append(f"schema {record.get('schema')!r} != {SCHEMA_VERSION}")
    header = record.get("header", {})
    problems += [f"header lacks {k}" for k in HEADER_KEYS if k not in header]
    for i, row in enumerate(record.get("rows", [])):
        problems += [f"row {i} lacks {k}" for k in ROW_KEYS if k not in row]
        if row.get("status") not in ROW_STATUSES:
            problems.append(f"row {i} status {row.get('status')!r}")
        if row.get("status") == "ok" and not (isinstance(row.get("us"), (int, float)) and row["us"] > 0):
            problems.append(f"row {i} is ok without a time")
        if row.get("status") == "fail" and row.get("us") is not None:
            problems.append(f"row {i} failed its check but carries a time")
    return problems


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def to_json(header: dict, rows: list[dict]) -> str:
    """NaN (a non-finite output's err) is stored as null, with the row's status saying why."""
    return json.dumps(_json_safe({"schema": SCHEMA_VERSION, "header": header, "rows": rows}), indent=1,
                      allow_nan=False)


# -------------------------------------------------------------------------------------------------- summaries
def experiment_stamp(header: dict) -> str:
    """The run's start as YYYYMMDDTHHMMSS (from collect_env's date), the prefix of experiment result names."""
    return header["date"].replace("-", "").replace(":", "")[:15]


def write_experiment_json(out: str | None, name: str, data) -> None:
    """An experiment script's results as `out`/`name` (indented JSON, the folder made first); nothing when `out` is
    None (the script was run without --out)."""
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / name).write_text(json.dumps(data, indent=1))


def summary_rows(rows: list[dict]) -> list[dict]:
    """The rows a summary pools: with --tiles (several tile options per shape) the heuristic's own rows (tiles None
    or "auto"), or, in a run of forced tiles only, those of its first option; pooling every option of one shape
    would average the sweep, not the library."""
    options = list(dict.fromkeys(r.get("tiles") for r in rows))
    if len(options) <= 1:
        return rows
    keep = {None, "auto"} & set(options) or {options[0]}
    return [r for r in rows if r.get("tiles") in keep]


def geomean_by_dtype(rows: list[dict]) -> dict[str, dict]:
    """{dtype: {"ratio": geomean of ratio, "tflops", "baseline_tflops", "n" (rows in the mean), "n_ok",
    "n_bad"}} over the plain rows with status ok (and a baseline, for ratio); epilogue rows are summarized by
    ``geomean_by_epilogue``."""
    out: dict[str, dict] = {}
    rows = [r for r in summary_rows(rows) if not r.get("epilogue")]
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        rs = [r for r in rows if r["dtype"] == dtype]
        ok = [r for r in rs if r["status"] == "ok"]
        paired = [r for r in ok if r.get("ratio")]
        out[dtype] = {
            "ratio": metrics.geomean(r["ratio"] for r in paired),
            "tflops": metrics.geomean(r["tflops"] for r in paired),
            "baseline_tflops": metrics.geomean(r.get("baseline_tflops") for r in paired),
            "n": len(paired), "n_ok": len(ok), "n_bad": len(rs) - len(ok),
        }
    return out


# The FP8 recipes whose torch baselines compete: issue 6's decode bar compares every FP8 row with the faster of
# torch's per-tensor and block-scaled matmuls (per-tensor is the faster one at small M).
FP8_RECIPES = ("fp8_tensor", "fp8_row", "fp8_block")


def _shape(r: dict) -> tuple:
    return r["layout"], r["m"], r["n"], r["k"]


def geomean_vs_faster_fp8(rows: list[dict]) -> dict[str, dict]:
    """{FP8 dtype: {"ratio": geomean of (fastest torch FP8 baseline of the same shape in this run) / us, "min",
    "n_below_1", "n"}} for FP8 dtypes whose shapes ran with another FP8 recipe too; {} otherwise."""
    plain = [r for r in summary_rows(rows) if r["dtype"] in FP8_RECIPES and not r.get("epilogue")]
    ok = [r for r in plain if r["status"] == "ok" and r.get("us") and r.get("baseline_us")]
    # A shape counts only where every FP8 recipe that ran there has a timed baseline: a failed row's baseline is
    # not timed, and "the faster torch recipe" without it would raise the other recipes' ratios silently.
    attempted: dict[tuple, set] = {}
    for r in plain:
        attempted.setdefault(_shape(r), set()).add(r["dtype"])
    fastest: dict[tuple, float] = {}
    recipes: dict[tuple, set] = {}
    for r in ok:
        fastest[_shape(r)] = min(fastest.get(_shape(r), math.inf), r["baseline_us"])
        recipes.setdefault(_shape(r), set()).add(r["dtype"])
    ok = [r for r in ok if recipes[_shape(r)] == attempted[_shape(r)]]
    out: dict[str, dict] = {}
    for dtype in dict.fromkeys(r["dtype"] for r in ok):
        ratios = [fastest[_shape(r)] / r["us"] for r in ok if r["dtype"] == dtype and len(recipes[_shape(r)]) > 1]
        if ratios:
            out[dtype] = {"ratio": metrics.geomean(ratios), "min": min(ratios),
                          "n_below_1": sum(x < 1 for x in ratios), "n": len(ratios)}
    return out


def _faster_fp8_summary(dtype: str, g: dict) -> str:
    return (f"{dtype} vs the faster torch FP8 recipe of the same shape: ratio {_f(g['ratio'], '.3f')} over {g['n']} "
            f"rows, min {_f(g['min'], '.3f')}, {g['n_below_1']} below 1")


def geomean_by_epilogue(rows: list[dict]) -> dict[tuple[str, str], dict]:
    """{(dtype, epilogue): {"ratio": geomean of ratio (vs cuBLAS + separate ops), "n" (rows with a ratio),
    "overhead": geomean of us / plain_us, "max_overhead", "max_overhead_shape" ((M, N, K) of the max),
    "n_overhead", "n_ok", "n_bad"}} over the epilogue rows."""
    out: dict[tuple[str, str], dict] = {}
    rows = [r for r in summary_rows(rows) if r.get("epilogue")]
    for key in dict.fromkeys((r["dtype"], r["epilogue"]) for r in rows):
        rs = [r for r in rows if (r["dtype"], r["epilogue"]) == key]
        ok = [r for r in rs if r["status"] == "ok"]
        paired = [r for r in ok if r.get("ratio")]
        with_plain = [r for r in ok if r.get("overhead")]
        worst = max(with_plain, key=lambda r: r["overhead"], default=None)
        out[key] = {
            "ratio": metrics.geomean(r["ratio"] for r in paired), "n": len(paired),
            "overhead": metrics.geomean(r["overhead"] for r in with_plain),
            "max_overhead": None if worst is None else worst["overhead"],
            "max_overhead_shape": None if worst is None else (worst["m"], worst["n"], worst["k"]),
            "n_overhead": len(with_plain), "n_ok": len(ok), "n_bad": len(rs) - len(ok),
        }
    return out


def _epilogue_summary(dtype: str, epilogue: str, g: dict) -> str:
    shape = g["max_overhead_shape"]
    at = "" if shape is None else f" at M={shape[0]} N={shape[1]} K={shape[2]}"
    return (f"{dtype} {epilogue}: ratio vs cuBLAS + separate ops {_f(g['ratio'], '.3f')} over {g['n']} rows; "
            f"overhead vs our plain GEMM {_f(g['overhead'], '.3f')} geomean, max {_f(g['max_overhead'], '.3f')}"
            f"{at} over {g['n_overhead']} rows; {g['n_ok']} ok, {g['n_bad']} not")


def _f(x, fmt: str, none: str = "-") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none
    return format(x, fmt)


def _err_text(r: dict) -> str:
    """A failed row without a finite error had a non-finite output (NaN is stored as null in the JSON)."""
    err = r.get("err")
    if err is None or (isinstance(err, float) and math.isnan(err)):
        return "NaN" if r["status"] == "fail" else "-"
    return _f(err, ".1e")


def _tol_text(rows: list[dict], prefix: str) -> str:
    """The tolerance(s) of the rows whose dtype starts with `prefix`, e.g. '0.03'."""
    tols = sorted({r["tol"] for r in rows if str(r["dtype"]).startswith(prefix) and r.get("tol") is not None})
    return "/".join(f"{t:g}" for t in tols) or "-"


def _cos_text(r: dict) -> str:
    """'ours / baseline' cos differences of an FP8 row, '-' elsewhere."""
    if r.get("err_cos") is None and r.get("baseline_err_cos") is None:
        return "-"
    return f"{_f(r.get('err_cos'), '.1e')} / {_f(r.get('baseline_err_cos'), '.1e')}"



def status_cell(row: dict, limit: int) -> str:
    """A row's status for a markdown table: bold unless ok, then its error or note (at most `limit` characters,
    pipes escaped, on one line)."""
    status = row["status"] if row["status"] == "ok" else f"**{row['status']}**"
    detail = row.get("error") or row.get("note") or ""
    if detail:
        status += ": " + detail.replace("|", "\\|").replace("\n", " ")[:limit]
    return status

def render_markdown(header: dict, rows: list[dict]) -> str:
    has_cos = any(r.get("err_cos") is not None for r in rows)
    has_epi = any(r.get("epilogue") for r in rows)
    lines = [
        f"# deepgemm-jit bench: {'+'.join(header.get('suites', []))}",
        "",
        f"{header.get('date')} · {header.get('gpu')} ({header.get('sm_count')} SMs) · driver "
        f"{header.get('driver')} runtime {header.get('runtime')} · CuPy {header.get('cupy')} NVRTC "
        f"{header.get('nvrtc')} · torch {header.get('torch')} · commit {header.get('git_commit') or '-'}"
        f"{' (dirty)' if header.get('git_dirty') else ''} · src {str(header.get('source_sha256'))[:12]}",
        "",
        f"`{header.get('command')}` · median of {header.get('reps')} reps, L2 flushed "
        f"({(header.get('flush_bytes') or 0) >> 20} MiB written) before each, ours and baseline interleaved. "
        "ratio = baseline µs / our µs (> 1: we are faster). GB/s counts A + B + D once (and the FP8 scales); "
        "TFLOPS are TOPS for int8.",
        "",
    ]
    if has_cos:
        lines += [f"FP8 rows: err = ‖d − ref‖/‖ref‖ against the float64 product of the dequantized operands "
                  f"(tol {_tol_text(rows, 'fp8')}); cos = DeepGEMM's 1 − 2⟨x,y⟩/(‖x‖²+‖y‖²) against the product "
                  "of the BF16 inputs, ours / baseline (DeepGEMM accepts < 1e-3).", ""]
    if has_epi:
        lines += ["Epilogue rows: err against the unfused float64 reference act(alpha·acc + beta·C + bias) + "
                  "residual; plain µs = our same GEMM without the epilogue, same operands, same interleaved loop; "
                  "overhead = µs / plain µs (issue 5: ≤ 1.03 at M = 4096); ratio against torch's cuBLAS + "
                  "separate ops (> 1 everywhere). GB/s counts bias, C and residual too.", ""]
    cos_head, cos_rule = (" cos |", "--:|") if has_cos else ("", "")
    epi_head, epi_rule = (" epilogue |", "---|") if has_epi else ("", "")
    ovh_head, ovh_rule = (" plain µs | overhead |", "--:|--:|") if has_epi else ("", "")
    lines += [
        f"| dtype | layout | M | N | K |{epi_head} µs | TFLOPS | GB/s | baseline | base µs | base TFLOPS | ratio |"
        f"{ovh_head} err |{cos_head} ref | family | config | status |",
        f"|---|---|--:|--:|--:|{epi_rule}--:|--:|--:|---|--:|--:|--:|{ovh_rule}--:|{cos_rule}---|---|---|---|",
    ]
    for r in rows:
        status = status_cell(r, 200)
        epi_cell = f" {r.get('epilogue') or '-'} |" if has_epi else ""
        ovh_cell = f" {_f(r.get('plain_us'), '.1f')} | {_f(r.get('overhead'), '.3f')} |" if has_epi else ""
        lines.append(
            f"| {r['dtype']} | {r['layout']} | {r['m']} | {r['n']} | {r['k']} |{epi_cell} {_f(r['us'], '.1f')} "
            f"| {_f(r['tflops'], '.1f')} | {_f(r['gbps'], '.0f')} | {r.get('baseline') or '-'} "
            f"| {_f(r['baseline_us'], '.1f')} | {_f(r.get('baseline_tflops'), '.1f')} | {_f(r['ratio'], '.3f')} "
            f"|{ovh_cell} {_err_text(r)} |{f' {_cos_text(r)} |' if has_cos else ''} {r.get('ref') or '-'} "
            f"| {r.get('family') or '-'} "
            f"| {str(r.get('config') or '-').replace('|', '/')} | {status} |")
    lines.append("")
    for dtype, g in geomean_by_dtype(rows).items():
        unit = bench_dtypes.DTYPES[dtype].unit if dtype in bench_dtypes.DTYPES else "TFLOPS"
        lines.append(f"- **geomean {dtype}**: ratio {_f(g['ratio'], '.3f')} over {g['n']} rows with a baseline; "
                     f"ours {_f(g['tflops'], '.1f')} {unit} vs baseline {_f(g['baseline_tflops'], '.1f')} "
                     f"(geomean); {g['n_ok']} ok, {g['n_bad']} failed/errored/skipped")
    for (dtype, epilogue), g in geomean_by_epilogue(rows).items():
        lines.append(f"- **geomean {_epilogue_summary(dtype, epilogue, g).replace(':', '**:', 1)}")
    for dtype, g in geomean_vs_faster_fp8(rows).items():
        lines.append(f"- **geomean {_faster_fp8_summary(dtype, g).replace(':', '**:', 1)}")
    return "\n".join(lines) + "\n"


def render_short_table(rows: list[dict]) -> str:
    """The table printed at the end of a run (the device tool returns only the tail of stdout)."""
    has_epi = any(r.get("epilogue") for r in rows)
    epi_width = max([len(str(r.get("epilogue") or "-")) for r in rows] + [8]) if has_epi else 0
    epi_head = f" {'epilogue':{epi_width}}" if has_epi else ""
    ovh_head = f" {'plain_us':>9} {'overhd':>6}" if has_epi else ""
    lines = [f"{'dtype':10} {'lay':3} {'M':>5} {'N':>6} {'K':>6}{epi_head} {'us':>9} {'TFLOPS':>7} {'base_us':>9} "
             f"{'ratio':>6}{ovh_head} {'err':>8} status"]
    for r in rows:
        status = r["status"]
        if r["status"] != "ok":
            status += " " + (r.get("error") or r.get("note") or "")[:60].replace("\n", " ")
        elif r.get("note"):
            status += " *"
        epi_cell = f" {str(r.get('epilogue') or '-'):{epi_width}}" if has_epi else ""
        ovh_cell = (f" {_f(r.get('plain_us'), '9.1f'):>9} {_f(r.get('overhead'), '6.3f'):>6}" if has_epi else "")
        lines.append(f"{r['dtype']:10} {r['layout']:3} {r['m']:>5} {r['n']:>6} {r['k']:>6}{epi_cell} "
                     f"{_f(r['us'], '9.1f'):>9} {_f(r['tflops'], '7.1f'):>7} {_f(r['baseline_us'], '9.1f'):>9} "
                     f"{_f(r['ratio'], '6.3f'):>6}{ovh_cell} {_err_text(r):>8} {status}")
    for dtype, g in geomean_by_dtype(rows).items():
        lines.append(f"geomean {dtype}: ratio {_f(g['ratio'], '.3f')} over {g['n']} rows "
                     f"({g['n_ok']} ok, {g['n_bad']} not)")
    for (dtype, epilogue), g in geomean_by_epilogue(rows).items():
        lines.append("geomean " + _epilogue_summary(dtype, epilogue, g))
    for dtype, g in geomean_vs_faster_fp8(rows).items():
        lines.append("geomean " + _faster_fp8_summary(dtype, g))
    if any(r["status"] == "ok" and r.get("note") for r in rows):
        lines.append("* = the row has a note in the .md/.json")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------------------- plot
def write_plot(path: Path, header: dict, rows: list[dict]) -> str | None:
    """Roofline PNG: achieved TFLOPS vs FLOP/byte, log-log, one panel per dtype. Returns None, or why not."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"no plot: matplotlib unavailable ({exc.__class__.__name__}: {exc})"
    ok = [r for r in rows if r["status"] == "ok" and r.get("intensity")]
    panels = list(dict.fromkeys((r["dtype"], r.get("epilogue")) for r in ok))   # one per dtype (and epilogue)
    if not panels:
        return "no plot: no timed rows"
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 5.0), squeeze=False)
    for ax, (dtype, epilogue) in zip(axes[0], panels):
        info = bench_dtypes.get(dtype)
        rs = [r for r in ok if (r["dtype"], r.get("epilogue")) == (dtype, epilogue)]
        xs = [r["intensity"] for r in rs]
        lo, hi = min(xs) / 2, max(xs) * 2
        peak = info.peak_tflops
        if peak:
            lo = min(lo, peak / bench_dtypes.COPY_TBPS / 4)
            hi = max(hi, peak / bench_dtypes.COPY_TBPS * 4)
            grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
            ax.plot(grid, [metrics.roofline_tflops(x, peak, bench_dtypes.COPY_TBPS) for x in grid], "k-", lw=1,
                    label=f"roof: {bench_dtypes.COPY_TBPS} TB/s copy, {peak:g} {info.unit} datasheet")
        if info.cublas_tflops:
            ax.axhline(info.cublas_tflops, color="gray", ls="--", lw=1,
                       label=f"cuBLAS measured ceiling ~{info.cublas_tflops:g}")
        ax.scatter(xs, [r["tflops"] for r in rs], marker="o", s=28, color="tab:blue", zorder=3,
                   label="deepgemm-jit")
        based = [r for r in rs if r.get("baseline_tflops")]
        if based:
            ax.scatter([r["intensity"] for r in based], [r["baseline_tflops"] for r in based], marker="x", s=34,
                       color="tab:red", zorder=3, label=str(based[0].get("baseline") or "baseline"))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_xlabel("arithmetic intensity (FLOP / byte, A + B + D once)")
        ax.set_ylabel(f"achieved {info.unit} (2MNK / t)")
        ax.set_title(f"{dtype}{f' + {epilogue}' if epilogue else ''}: {len(rs)} shapes")
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{header.get('gpu')} · {header.get('date')} · {str(header.get('git_commit') or '')[:7]}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def write_all(out_dir: Path, header: dict, rows: list[dict]) -> dict[str, Path | str]:
    """JSON + markdown + PNG with one stem; returns their paths (and "plot_skipped" with the reason)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = result_stem(header["date"], header["suites"], header.get("git_commit"), header.get("git_dirty"),
                       header["source_sha256"])
    paths: dict[str, Path | str] = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md"}
    paths["json"].write_text(to_json(header, rows))
    paths["md"].write_text(render_markdown(header, rows))
    png = out_dir / f"{stem}.png"
    why = write_plot(png, header, rows)
    if why is None:
        paths["png"] = png
    else:
        paths["plot_skipped"] = why
    return paths
