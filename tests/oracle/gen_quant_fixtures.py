#!/usr/bin/env python3
"""Writes the dequantization and quantization fixtures of tests/quant_oracle.rs.

The oracle is the `gguf` Python package (gguf-py, ggml's own Python reader): for every
block-quantized type flashlm reads, random blocks (random bytes whose f16 scale fields are
random finite halves, subnormals, zeros and negatives included) are dequantized with
`gguf.quants.dequantize`; for the types gguf can also quantize, random values are quantized
with `gguf.quants.quantize`. The Rust test compares flashlm against these files bit for bit and
needs no Python.

Regenerate (the output is deterministic for a given gguf and numpy):

    python3 -m venv /tmp/gguf-venv
    /tmp/gguf-venv/bin/pip install gguf==0.19.0 numpy==2.4.6
    /tmp/gguf-venv/bin/python tests/oracle/gen_quant_fixtures.py

Files written to tests/fixtures/quants/ (all little-endian):
    NAME.blocks  N raw blocks of type NAME
    NAME.deq     their dequantization, f32
    NAME.qin     (types gguf quantizes) input values, f32
    NAME.qout    gguf's quantization of NAME.qin
    manifest.json  versions, seed, and per type the block counts and which files exist
"""

import importlib.metadata
import json
import pathlib

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

SEED = 20240601
OUT = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "quants"

# Byte offsets of the f16 fields within one block of each type.
HALF_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
}

# Types gguf-py can quantize (its quantizers follow ggml's reference ones).
QUANTIZABLE = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]


def random_halves(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite f16 values spanning subnormals to ~16, both signs, with a few exact zeros."""
    mag = np.exp2(rng.uniform(-20.0, 4.0, n))
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    v = (mag * sign).astype(np.float16)
    v[rng.random(n) < 0.05] = np.float16(0.0)
    assert np.all(np.isfinite(v))
    return v


def random_blocks(rng: np.random.Generator, qtype: T, n_blocks: int) -> np.ndarray:
    _, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in HALF_FIELDS[qtype]:
        raw[:, off : off + 2] = random_halves(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def random_values(rng: np.random.Generator, n_blocks: int, block: int) -> np.ndarray:
    """Per block: a random magnitude, a uniform or normal spread, plus special blocks."""
    out = []
    for b in range(n_blocks):
        scale = np.float32(10.0 ** rng.uniform(-4.0, 2.0))
        if b % 3 == 0:
            v = rng.normal(0.0, 1.0, block) * scale
        else:
            v = rng.uniform(-1.0, 1.0, block) * scale
        if b == 1:
            v[:] = 0.0  # all zero: d = 0
        if b == 2:
            v[:] = 0.75  # constant
        if b == 4:
            v = np.abs(v)  # one-signed
        out.append(v.astype(np.float32))
    return np.concatenate(out)


def main() -> None:
    rng = np.random.default_rng(SEED)
    OUT.mkdir(parents=True, exist_ok=True)
    manifest = {
        "generator": "tests/oracle/gen_quant_fixtures.py",
        "gguf": importlib.metadata.version("gguf"),
        "numpy": np.__version__,
        "seed": SEED,
        "types": {},
    }
    for qtype, _ in HALF_FIELDS.items():
        block, _ = GGML_QUANT_SIZES[qtype]
        n_blocks = 12 if block == 32 else 5
        blocks = random_blocks(rng, qtype, n_blocks)
        deq = gguf.quants.dequantize(blocks, qtype).astype(np.float32).reshape(-1)
        assert deq.size == n_blocks * block
        (OUT / f"{qtype.name}.blocks").write_bytes(blocks.tobytes())
        (OUT / f"{qtype.name}.deq").write_bytes(deq.astype("<f4").tobytes())
        entry = {"block": block, "blocks": n_blocks, "quantized": False}
        if qtype in QUANTIZABLE:
            nq = 16
            x = random_values(rng, nq, block)
            q = gguf.quants.quantize(x.reshape(nq, block), qtype).reshape(-1)
            (OUT / f"{qtype.name}.qin").write_bytes(x.astype("<f4").tobytes())
            (OUT / f"{qtype.name}.qout").write_bytes(q.astype(np.uint8).tobytes())
            entry.update(quantized=True, quant_blocks=nq)
        manifest["types"][qtype.name] = entry
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


if __name__ == "__main__":
    main()
