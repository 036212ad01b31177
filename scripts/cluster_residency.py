"""How many thread-block clusters of each size the GPU keeps resident at once (cuOccupancyMaxActiveClusters) for the
sm90 GEMM kernels whose group quantization runs in clusters (sm90_tiles.sm90_quant_cluster): the cost model's
SM90_QUANT_CLUSTER_RESIDENT comes from this. Prints one JSON line.
    python3 scripts/cluster_residency.py"""
import json

from deepgemm_jit import config, device, jit, launch
from deepgemm_jit.spec import GemmSpec


def main() -> None:
    found = {"num_sms": device.num_sms(0)}
    for dtype, scaling in (("bf16", None), ("fp8", "block")):
        spec = GemmSpec.create(4096, 7168, dtype=dtype, scaling=scaling, epilogue="quant_fp8_g128")
        for block_n in (64, 32, 16):
            cfg = config.sm90_config(spec, 64, block_n)
            art = jit.get_kernel(spec, cfg, "sm_90a")
            sym = launch.sm90_symbols(art)
            kernel = launch.load(art, spec, 0)
            cluster = 128 // block_n
            found[f"{dtype} 64x{block_n} c{cluster}"] = kernel.max_active_clusters(cluster, (sym["num_threads"], 1, 1))
    print(json.dumps(found))


if __name__ == "__main__":
    main()
