"""Peak memory bandwidth and matrix-multiply rates of common accelerators, for what-if predictions.

Each figure is the vendor's published peak (dense: without the 2:4 structured-sparsity doubling NVIDIA
quotes beside it), in bytes/s and FLOP/s (int8: operations/s), with its source. Peaks are ceilings no
real kernel reaches; a roofline built on them is an upper bound. Where a vendor publishes no figure the
entry is None, and Apple's GPU FLOP/s are derived (cores x 128 FP32 lanes x 2 x clock), as marked.

``bytes_per_s``: memory bandwidth. ``flop_per_s``: {dtype: FLOP/s} for float32 (CUDA cores / GPU
ALUs, no tensor cores), bfloat16 and int8 (tensor cores where present).
"""

from __future__ import annotations

T = 1e12

ACCELERATORS: dict[str, dict] = {
    "H100 SXM": {
        "bytes_per_s": 3.35 * T,
        "flop_per_s": {"float32": 67 * T, "bfloat16": 989.5 * T, "int8": 1979 * T},
        "memory_bytes": 80e9,
        "source": "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column; tensor figures halved: the datasheet "
        "quotes them with sparsity)",
    },
    "H200 SXM": {
        "bytes_per_s": 4.8 * T,
        "flop_per_s": {"float32": 67 * T, "bfloat16": 989.5 * T, "int8": 1979 * T},
        "memory_bytes": 141e9,
        "source": "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column; tensor figures halved: the datasheet "
        "quotes them with sparsity)",
    },
    "A100 SXM 80GB": {
        "bytes_per_s": 2.039 * T,
        "flop_per_s": {"float32": 19.5 * T, "bfloat16": 312 * T, "int8": 624 * T},
        "memory_bytes": 80e9,
        "source": "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column, dense figures)",
    },
    "L4": {
        "bytes_per_s": 300e9,
        "flop_per_s": {"float32": 30.3 * T, "bfloat16": 121 * T, "int8": 242.5 * T},
        "memory_bytes": 24e9,
        "source": "NVIDIA L4 Tensor Core GPU datasheet (tensor figures halved: the datasheet quotes them with "
        "sparsity)",
    },
    "RTX 4090": {
        "bytes_per_s": 1008e9,
        "flop_per_s": {"float32": 82.6 * T, "bfloat16": 165.2 * T, "int8": 660.6 * T},
        "memory_bytes": 24e9,
        "source": "NVIDIA Ada Lovelace GPU Architecture whitepaper, appendix table for GeForce RTX 4090 (dense; "
        "bfloat16 with FP32 accumulate)",
    },
    "Apple M2 Max (38-core GPU)": {
        "bytes_per_s": 400e9,
        "flop_per_s": {"float32": 13.6 * T, "bfloat16": None, "int8": None},
        "memory_bytes": 96e9,
        "source": "bandwidth and memory: Apple newsroom, 'Apple unveils MacBook Pro featuring M2 Pro and M2 Max' "
        "(17 Jan 2023); float32: derived, 38 GPU cores x 128 lanes x 2 x 1.398 GHz (not an Apple figure)",
    },
    "Apple M4 Max (40-core GPU)": {
        "bytes_per_s": 546e9,
        "flop_per_s": {"float32": None, "bfloat16": None, "int8": None},
        "memory_bytes": 128e9,
        "source": "bandwidth and memory: Apple newsroom, 'new MacBook Pro features M4 family of chips' (30 Oct "
        "2024); Apple publishes no FLOP/s figure",
    },
}


def accelerator_table():
    """The table as a pandas DataFrame: name, bandwidth_gbps, float32/bfloat16/int8 TFLOP/s, memory_gb, source."""
    import pandas as pd

    rows = []
    for name, a in ACCELERATORS.items():
        f = a["flop_per_s"]
        rows.append(
            {
                "name": name,
                "bandwidth_gbps": a["bytes_per_s"] / 1e9,
                **{f"{k}_tflops": (v / T if v else None) for k, v in f.items()},
                "memory_gb": a["memory_bytes"] / 1e9,
                "source": a["source"],
            }
        )
    return pd.DataFrame(rows)
