#!/usr/bin/env python3
"""Prints a GGUF file's tensor table as read by the `gguf` Python package (gguf-py, ggml's own
reader), as JSON on stdout: the oracle of tests/synth.rs.

    python3 tests/oracle/gguf_tensors.py FILE

Output:
    {"gguf": version of the gguf package, "alignment": ..., "data_offset": ...,
     "n_tokens": entries of tokenizer.ggml.tokens, "n_merges": entries of tokenizer.ggml.merges,
     "block_count": llama.block_count,
     "tensors": [{"name", "shape" (ggml order, contiguous dim first), "type" (ggml type name),
                  "offset" (absolute, in bytes), "n_bytes"}, ...]}

Needs `pip install gguf==0.19.0` (scripts/test.sh installs it).
"""

import importlib.metadata
import json
import sys

import gguf


def field_len(reader, key):
    f = reader.fields.get(key)
    return None if f is None else len(f.data)


def scalar(reader, key):
    f = reader.fields.get(key)
    return None if f is None else int(f.parts[f.data[0]][0])


def main():
    reader = gguf.GGUFReader(sys.argv[1])
    out = {
        "gguf": importlib.metadata.version("gguf"),
        "alignment": int(reader.alignment),
        "data_offset": int(reader.data_offset),
        "n_tokens": field_len(reader, "tokenizer.ggml.tokens"),
        "n_merges": field_len(reader, "tokenizer.ggml.merges"),
        "block_count": scalar(reader, "llama.block_count"),
        "tensors": [
            {
                "name": t.name,
                "shape": [int(d) for d in t.shape],
                "type": t.tensor_type.name,
                "offset": int(t.data_offset),
                "n_bytes": int(t.n_bytes),
            }
            for t in reader.tensors
        ],
    }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
