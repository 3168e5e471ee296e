#!/usr/bin/env python3
"""An independent forward pass over a GGUF model in NumPy: the oracle of tests/arch.rs.

It reads the file with the `gguf` package (gguf-py, ggml's own reader and dequantizers) and
computes what llama.cpp computes for the architectures llama (and the Mistral files the
converter writes as llama / mistral3), qwen2, qwen3, phi3, gemma2 and gemma3, in float64, one
position at a time with a plain (unpaged) KV cache:

    x = token_embd[t]                       (gemma: x * sqrt(n_embd))
    per layer:
        h = rmsnorm(x) * attn_norm
        q, k, v = Wq h, Wk h, Wv h (+ biases) (phi3: rows of attn_qkv)
        qwen3, gemma3: q, k = rmsnorm per head * attn_q_norm / attn_k_norm
        rope(q), rope(k): pair i turns by pos * freq_scale * base^(-2i/n_rot) / factor_i, the
            pair scaled by rope.scaling.attn_factor; NORMAL pairs (2i, 2i+1) for llama, NEOX
            pairs (i, i + n_rot/2) for the others; gemma3 local layers: base
            rope.freq_base_swa (10000), no scaling
        scores = q.k * scale (gemma2: cap * tanh(s / cap)); local layers keep keys with
            pos - key_pos < window; softmax; o = Wo (scores . V)
        x += o                              (gemma: x += rmsnorm(o) * post_attention_norm)
        h = rmsnorm(x) * ffn_norm
        d = Wdown (act(Wgate h) * Wup h)    (act: silu; gemma: tanh-GELU; phi3: gate and up
                                             are the two halves of ffn_up)
        x += d                              (gemma: x += rmsnorm(d) * post_ffw_norm)
    logits = Wout (rmsnorm(x) * output_norm) (gemma2: cap * tanh(l / cap))

Usage:
    arch_forward.py MODEL.gguf --tokens 1,2,3 [--steps 16] [--ctx N] [--kv-f16]

Prints JSON: {"prompt_logits": [...], "greedy": [ids], "step_logits": [[...], ...]}: the
logits after the last prompt token, then `steps` greedy ids (argmax, lowest id on ties) with
the logits after feeding each of them. `--ctx` is the context the engine runs with (it picks
Phi-3's long or short RoPE factors); `--kv-f16` rounds cached keys and values to f16.
"""

import argparse
import json
import math
import sys

import numpy as np
import gguf
from gguf import GGUFReader


class Model:
    def __init__(self, path, ctx):
        self.r = GGUFReader(path)
        self.tensors = {t.name: t for t in self.r.tensors}
        self.arch = self.meta("general.architecture")
        fam = {"llama": "llama", "mistral": "llama", "mistral3": "llama", "qwen2": "qwen2",
               "qwen3": "qwen3", "phi3": "phi3", "gemma2": "gemma2", "gemma3": "gemma3"}
        if self.arch not in fam:
            raise SystemExit(f"unsupported architecture {self.arch}")
        self.fam = fam[self.arch]
        self.gemma = self.fam in ("gemma2", "gemma3")
        a = self.arch
        self.n_layer = self.meta(f"{a}.block_count")
        self.n_embd = self.meta(f"{a}.embedding_length")
        self.n_ff = self.meta(f"{a}.feed_forward_length")
        self.n_head = self.meta(f"{a}.attention.head_count")
        self.n_head_kv = self.meta(f"{a}.attention.head_count_kv", self.n_head)
        self.head_dim = self.meta(f"{a}.attention.key_length", self.n_embd // self.n_head)
        self.n_rot = self.meta(f"{a}.rope.dimension_count", self.head_dim)
        self.eps = self.meta(f"{a}.attention.layer_norm_rms_epsilon")
        self.ctx = ctx if ctx else self.meta(f"{a}.context_length")
        self.neox = self.fam != "llama"

        # Sliding window layers.
        self.window = None
        self.local = [False] * self.n_layer
        win = self.meta(f"{a}.attention.sliding_window", None)
        period = None
        if self.fam == "gemma2":
            self.window = win if win is not None else 4096
            period = 2
        elif self.fam == "gemma3" and win:
            self.window = win
            period = 6
        if period:
            self.local = [(l % period) < period - 1 for l in range(self.n_layer)]

        # Attention scale and soft caps.
        self.scale = 1.0 / math.sqrt(self.head_dim)
        if (self.fam, self.n_layer) in (("gemma2", 46), ("gemma3", 62)):
            self.scale = 1.0 / math.sqrt(self.n_embd // self.n_head)
        if a == "mistral3" and self.meta(f"{a}.attention.scale", 0.0):
            self.scale = self.meta(f"{a}.attention.scale")
        self.attn_cap = None
        self.final_cap = None
        if self.fam == "gemma2":
            self.attn_cap = self.meta(f"{a}.attn_logit_softcapping", 50.0)
            self.final_cap = self.meta(f"{a}.final_logit_softcapping", 30.0)
        elif self.fam == "gemma3" and self.window is None:
            self.final_cap = self.meta(f"{a}.final_logit_softcapping", None)

        # RoPE of global and local layers.
        base = self.meta(f"{a}.rope.freq_base", 10000.0)
        kind = self.meta(f"{a}.rope.scaling.type", "linear")
        factor = self.meta(f"{a}.rope.scaling.factor", 0.0) or self.meta(f"{a}.rope.scale_linear", 0.0)
        scale = 1.0 if kind == "none" or not factor else 1.0 / factor
        mscale = self.meta(f"{a}.rope.scaling.attn_factor", 1.0)
        ff = None
        if kind == "llama3":
            scale = 1.0
            ff = llama3_factors(base, self.n_rot, factor or 8.0,
                                self.meta(f"{a}.rope.scaling.low_freq_factor", 1.0),
                                self.meta(f"{a}.rope.scaling.high_freq_factor", 4.0),
                                self.meta(f"{a}.rope.scaling.original_context_length", 8192))
        elif kind not in ("none", "linear", "longrope"):
            raise SystemExit(f"rope scaling {kind} is not implemented here")
        if "rope_freqs.weight" in self.tensors:
            ff = self.vec("rope_freqs.weight")
        if "rope_factors_long.weight" in self.tensors:
            orig = self.meta(f"{a}.rope.scaling.original_context_length", self.meta(f"{a}.context_length"))
            name = "rope_factors_long.weight" if self.ctx > orig else "rope_factors_short.weight"
            ff = self.vec(name)
        self.rope_global = (base, scale, mscale, ff)
        if self.fam == "gemma3" and self.window:
            self.rope_local = (self.meta(f"{a}.rope.freq_base_swa", 10000.0), 1.0, mscale, None)
        else:
            self.rope_local = self.rope_global

        self.embd = self.mat("token_embd.weight")
        self.out = self.mat("output.weight") if "output.weight" in self.tensors else self.embd
        self.out_norm = self.vec("output_norm.weight")
        self.layers = [self.load_layer(l) for l in range(self.n_layer)]

    def meta(self, key, default=KeyError):
        f = self.r.fields.get(key)
        if f is None:
            if default is KeyError:
                raise SystemExit(f"missing metadata {key}")
            return default
        v = f.contents()
        return v

    def mat(self, name):
        t = self.tensors[name]
        w = gguf.quants.dequantize(t.data, t.tensor_type)
        rows, cols = int(t.shape[1]), int(t.shape[0])
        return np.asarray(w, dtype=np.float64).reshape(rows, cols)

    def vec(self, name):
        t = self.tensors[name]
        return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(-1)

    def load_layer(self, l):
        p = f"blk.{l}."
        has = lambda n: (p + n) in self.tensors  # noqa: E731
        L = {"attn_norm": self.vec(p + "attn_norm.weight"), "ffn_norm": self.vec(p + "ffn_norm.weight")}
        q_dim = self.n_head * self.head_dim
        kv_dim = self.n_head_kv * self.head_dim
        if has("attn_qkv.weight"):
            w = self.mat(p + "attn_qkv.weight")
            L["wq"], L["wk"], L["wv"] = w[:q_dim], w[q_dim:q_dim + kv_dim], w[q_dim + kv_dim:]
        else:
            L["wq"], L["wk"], L["wv"] = (self.mat(p + n) for n in
                                         ("attn_q.weight", "attn_k.weight", "attn_v.weight"))
        for n in ("q", "k", "v"):
            if has(f"attn_{n}.bias"):
                L["b" + n] = self.vec(p + f"attn_{n}.bias")
        if has("attn_q_norm.weight"):
            L["q_norm"] = self.vec(p + "attn_q_norm.weight")
            L["k_norm"] = self.vec(p + "attn_k_norm.weight")
        L["wo"] = self.mat(p + "attn_output.weight")
        if has("ffn_gate.weight"):
            L["wg"], L["wu"] = self.mat(p + "ffn_gate.weight"), self.mat(p + "ffn_up.weight")
        else:
            w = self.mat(p + "ffn_up.weight")
            L["wg"], L["wu"] = w[:self.n_ff], w[self.n_ff:]
        L["wd"] = self.mat(p + "ffn_down.weight")
        if has("post_attention_norm.weight"):
            L["post_attn"] = self.vec(p + "post_attention_norm.weight")
            L["post_ffw"] = self.vec(p + "post_ffw_norm.weight")
        return L


def llama3_factors(base, n_rot, factor, low, high, orig):
    out = []
    for i in range(n_rot // 2):
        freq = float(np.float32(1.0 / base ** (2 * i / n_rot)))
        wavelen = 2 * math.pi / freq
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32).astype(np.float64)


def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x) + eps) * w


def rope(x, n_heads, head_dim, n_rot, pos, params, neox):
    base, scale, mscale, ff = params
    x = x.reshape(n_heads, head_dim).copy()
    half = n_rot // 2
    i = np.arange(half)
    theta = scale * base ** (-2.0 * i / n_rot)
    if ff is not None:
        theta = theta / ff[:half]
    c = np.cos(pos * theta) * mscale
    s = np.sin(pos * theta) * mscale
    if neox:
        a, b = i, i + half
    else:
        a, b = 2 * i, 2 * i + 1
    x0, x1 = x[:, a].copy(), x[:, b].copy()
    x[:, a] = x0 * c - x1 * s
    x[:, b] = x0 * s + x1 * c
    return x.reshape(-1)


def gelu_tanh(g):
    return 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3)))


def silu(g):
    return g / (1.0 + np.exp(-g))


class Run:
    def __init__(self, m, kv_f16):
        self.m = m
        self.kv_f16 = kv_f16
        self.k = [[] for _ in range(m.n_layer)]
        self.v = [[] for _ in range(m.n_layer)]

    def step(self, token, pos):
        m = self.m
        hd = m.head_dim
        x = m.embd[token].copy()
        if m.gemma:
            x = x * float(np.float32(math.sqrt(m.n_embd)))
        for l, L in enumerate(m.layers):
            h = rmsnorm(x, L["attn_norm"], m.eps)
            q, k, v = L["wq"] @ h, L["wk"] @ h, L["wv"] @ h
            if "bq" in L:
                q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
            if "q_norm" in L:
                q = np.concatenate([rmsnorm(qh, L["q_norm"], m.eps) for qh in q.reshape(-1, hd)])
                k = np.concatenate([rmsnorm(kh, L["k_norm"], m.eps) for kh in k.reshape(-1, hd)])
            params = m.rope_local if m.local[l] else m.rope_global
            q = rope(q, m.n_head, hd, m.n_rot, pos, params, m.neox)
            k = rope(k, m.n_head_kv, hd, m.n_rot, pos, params, m.neox)
            if self.kv_f16:
                k = k.astype(np.float16).astype(np.float64)
                v = v.astype(np.float16).astype(np.float64)
            self.k[l].append(k)
            self.v[l].append(v)
            K = np.stack(self.k[l]).reshape(pos + 1, m.n_head_kv, hd)
            V = np.stack(self.v[l]).reshape(pos + 1, m.n_head_kv, hd)
            first = 0
            if m.local[l]:
                first = max(0, pos + 1 - m.window)
            group = m.n_head // m.n_head_kv
            att = np.zeros(m.n_head * hd)
            for hh in range(m.n_head):
                kv = hh // group
                s = K[first:, kv, :] @ q[hh * hd:(hh + 1) * hd] * m.scale
                if m.attn_cap:
                    s = m.attn_cap * np.tanh(s / m.attn_cap)
                p = np.exp(s - s.max())
                p /= p.sum()
                att[hh * hd:(hh + 1) * hd] = p @ V[first:, kv, :]
            o = L["wo"] @ att
            if "post_attn" in L:
                o = rmsnorm(o, L["post_attn"], m.eps)
            x = x + o
            h = rmsnorm(x, L["ffn_norm"], m.eps)
            g, u = L["wg"] @ h, L["wu"] @ h
            act = gelu_tanh(g) if m.gemma else silu(g)
            d = L["wd"] @ (act * u)
            if "post_ffw" in L:
                d = rmsnorm(d, L["post_ffw"], m.eps)
            x = x + d
        h = rmsnorm(x, m.out_norm, m.eps)
        logits = m.out @ h
        if m.final_cap:
            logits = m.final_cap * np.tanh(logits / m.final_cap)
        return logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=0)
    ap.add_argument("--kv-f16", action="store_true")
    a = ap.parse_args()
    m = Model(a.model, a.ctx)
    run = Run(m, a.kv_f16)
    tokens = [int(t) for t in a.tokens.split(",") if t]
    logits = None
    for pos, t in enumerate(tokens):
        logits = run.step(t, pos)
    out = {"prompt_logits": logits.tolist(), "greedy": [], "step_logits": []}
    pos = len(tokens)
    for _ in range(a.steps):
        nxt = int(np.argmax(logits))
        out["greedy"].append(nxt)
        logits = run.step(nxt, pos)
        out["step_logits"].append(logits.tolist())
        pos += 1
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
