"""Perplexity under page selection, by an independent NumPy forward pass (the default model, read
and dequantized with gguf-py): a research oracle for how `--kv-select` ranks pages.

The engine prefills the first half of each chunk exactly and decodes the scored half one token
at a time, selecting pages per layer (the first `--dense` layers exact). The selection of a row
depends only on that row's query and the keys before it, so it is computed here for all scored
rows at once, as masks of a batched forward pass. Page p is attended when it is the sink (p 0),
in the recent window (p + win > the row's page) or among the kept candidates
(ceil(pct% of the candidates)); keys are rounded to f16 as the engine stores them. Variants:
  exact       every page
  base        rank by the largest Quest bound over the heads
  mass        rank by the sum over heads of exp(scale (bound - the head's best bound))
  subN...     bounds from N-token sub-pages (page bound: the best sub-page)
  cent[W]...  W x centroid score + (1 - W) x bound
  rrkv, rrq   each KV head's (rrkv) or query head's (rrq) own mass ranking, merged round robin
              into one selection of the same size
  ...perkv    each KV head selects its own pages (reads their union)
  ...massall  mass relative to the best bound including the sink and window; ...T<x> scales it
  oracle      rank by the true attention mass of each page (sum over heads of its softmax share,
              from the exact scores): the best any ranking of these pages could do
  ...summ     pages not kept still count, as one pseudo-key each: the page's mean key (logit
              + ln(page tokens)) carrying its mean value; ...summv adds the second-order term
              (1/2) sum_d q_d^2 var(k_d) of the page's per-channel key variance

Usage (ids: the text's token ids, comma-separated, from the engine's tokenizer):
    quest_sim.py --model M.gguf --ids ids.txt --ctx 4096 --chunks 2 --page 64 --win 2 \
        --variants exact,base,mass
"""
import sys, math, time, json, argparse, re, os
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from arch_forward import Model

ap = argparse.ArgumentParser()
ap.add_argument("--model", required=True)
ap.add_argument("--ids", required=True)
ap.add_argument("--ctx", type=int, default=4096)
ap.add_argument("--chunks", type=int, default=2)
ap.add_argument("--variants", default="exact,base")
ap.add_argument("--page", type=int, default=64)
ap.add_argument("--win", type=int, default=2)
ap.add_argument("--pct", type=float, default=25.0)
ap.add_argument("--dense", type=int, default=2)
a = ap.parse_args()

m = Model(a.model, a.ctx)
f = np.float32
for L in m.layers:
    for k in list(L):
        L[k] = L[k].astype(f)
embd = m.embd.astype(f); out = m.out.astype(f); onorm = m.out_norm.astype(f)
ids = [int(x) for x in open(a.ids).read().split(",")]
H, KVH, hd = m.n_head, m.n_head_kv, m.head_dim
G = H // KVH
base_, scale_, _, _ = m.rope_global
P = a.page

def rms(x, w):
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + m.eps)) * w

def rope(x, nh, pos):
    # x [T, nh*hd], NORMAL pairs
    T = x.shape[0]
    x = x.reshape(T, nh, hd).copy()
    i = np.arange(hd // 2)
    theta = scale_ * base_ ** (-2.0 * i / hd)
    ang = pos[:, None] * theta[None, :]
    c = np.cos(ang).astype(f)[:, None, :]; s = np.sin(ang).astype(f)[:, None, :]
    x0 = x[:, :, 0::2].copy(); x1 = x[:, :, 1::2].copy()
    x[:, :, 0::2] = x0 * c - x1 * s
    x[:, :, 1::2] = x0 * s + x1 * c
    return x.reshape(T, nh * hd)

def select_mask(variant, q, K, first, T):
    """Per scored row j > first: mask [R, G_or_1, T] of attended keys."""
    rows = np.arange(first + 1, T)
    R = len(rows)
    npages = (T + P - 1) // P
    sub = P
    if variant.startswith("sub"):
        sub = int(re.match(r"sub(\d+)", variant).group(1))
    nsub = P // sub
    Kp = K.reshape(T, KVH, hd)
    # metadata per sub-page
    ns = (T + sub - 1) // sub
    lo = np.full((ns, KVH, hd), np.inf, f); hi = np.full((ns, KVH, hd), -np.inf, f)
    for s_ in range(ns):
        blk = Kp[s_ * sub:(s_ + 1) * sub]
        lo[s_] = blk.min(0); hi[s_] = blk.max(0)
    qh = q[rows].reshape(R, H, hd)
    kv_of = np.arange(H) // G
    loh = lo[:, kv_of, :]; hih = hi[:, kv_of, :]  # [ns, H, hd]
    qp = np.maximum(qh, 0); qn = qh - qp
    sc = np.einsum("rhd,shd->rsh", qp, hih) + np.einsum("rhd,shd->rsh", qn, loh)  # [R, ns, H]
    sc = sc.reshape(R, npages, nsub, H).max(2)  # page score per head
    if variant.startswith("oracle"):
        # exact per-page mass: log-sum-exp of the row's scores over the page's keys, per head
        Kf = Kp[:, kv_of, :]  # [T, H, hd]
        sc = np.full((R, npages, H), -np.inf, f)
        for p_ in range(npages):
            blk = Kf[p_ * P:(p_ + 1) * P]  # [P, H, hd]
            z = np.einsum("rhd,jhd->rjh", qh, blk) * f(m.scale)
            zm = z.max(1)
            sc[:, p_, :] = (zm + np.log(np.exp(z - zm[:, None, :]).sum(1))) / f(m.scale)
    if "cent" in variant:
        cen = np.stack([Kp[p * P:(p + 1) * P].mean(0) for p in range(npages)])[:, kv_of, :]
        sc2 = np.einsum("rhd,phd->rph", qh, cen)
        w = float(re.search(r"cent([0-9.]+)", variant).group(1)) if re.search(r"cent[0-9]", variant) else 1.0
        sc = w * sc2 + (1 - w) * sc
    temp = float(re.search(r"T([0-9.]+)", variant).group(1)) if "T" in variant else 1.0
    top = rows // P
    mask_pages = np.zeros((R, npages), bool)
    per_kv = variant.endswith("perkv")
    if per_kv:
        mask_pages = np.zeros((R, KVH, npages), bool)
    sel_count = 0
    for r in range(R):
        t = top[r]
        cand = [p for p in range(0, t) if not (p == 0 or p + a.win > t)]
        keep = min(len(cand), math.ceil(len(cand) * a.pct / 100.0))
        always = [p for p in range(0, t + 1) if p == 0 or p + a.win > t]
        if per_kv:
            for kvh in range(KVH):
                s = sc[r, cand][:, kvh * G:(kvh + 1) * G]
                if "norm" in variant:
                    s = s - s.max(0, keepdims=True)
                if "mass" in variant:
                    z = s * m.scale
                    z = z - z.max(0, keepdims=True)
                    ps = np.exp(z).sum(1)
                else:
                    ps = s.max(1)
                order = sorted(range(len(cand)), key=lambda i: (-ps[i], cand[i]))[:keep]
                mask_pages[r, kvh, always] = True
                mask_pages[r, kvh, [cand[i] for i in order]] = True
            sel_count += mask_pages[r].any(0).sum()
            continue
        if variant.startswith("rr") and len(cand):
            # round robin over groups of heads: each group's ranking by its own mass, merged
            # level by level into `keep` pages (the bytes of one shared selection)
            grp = G if variant.startswith("rrkv") else 1
            z = sc[r, cand] * m.scale
            z = z - z.max(0, keepdims=True)
            ranks = []
            for g0 in range(0, H, grp):
                ps = np.exp(z[:, g0:g0 + grp]).sum(1)
                ranks.append(sorted(range(len(cand)), key=lambda i: (-ps[i], cand[i])))
            chosen, seen, lvl = [], set(), 0
            while len(chosen) < keep:
                for rk in ranks:
                    if rk[lvl] not in seen and len(chosen) < keep:
                        seen.add(rk[lvl]); chosen.append(rk[lvl])
                lvl += 1
            mask_pages[r, always] = True
            mask_pages[r, [cand[i] for i in chosen]] = True
            sel_count += mask_pages[r].sum()
            continue
        s = sc[r, cand]  # [nc, H]
        if len(cand) and "norm" in variant:
            s = s - s.max(0, keepdims=True)
        if len(cand) and "mass" in variant:
            z = s * m.scale * temp
            if "massall" in variant:
                al = [p for p in always if p != t]
                mx = np.maximum(z.max(0), (sc[r, al] * m.scale * temp).max(0))
            else:
                mx = z.max(0)
            z = z - mx[None, :]
            ps = np.exp(z).sum(1)
        else:
            ps = s.max(1) if len(cand) else np.zeros(0)
        order = sorted(range(len(cand)), key=lambda i: (-ps[i], cand[i]))[:keep]
        mask_pages[r, always] = True
        mask_pages[r, [cand[i] for i in order]] = True
        sel_count += mask_pages[r].sum()
    tokmask = np.repeat(mask_pages, P, axis=-1)[..., :T]
    # candidates left out: summarised pages (complete, before the window)
    unsel = np.zeros((R, npages), bool)
    if not per_kv:
        for r in range(R):
            t = top[r]
            for p in range(1, t):
                if p + a.win <= t and not mask_pages[r, p]:
                    unsel[r, p] = True
    return rows, tokmask, sel_count / R, unsel

def forward(tokens, variant):
    T = len(tokens)
    first = T // 2
    pos = np.arange(T, dtype=np.float64)
    x = embd[tokens].copy()
    causal = np.tril(np.ones((T, T), bool))
    att_pages = []
    for l, L in enumerate(m.layers):
        h = rms(x, L["attn_norm"])
        q = h @ L["wq"].T; k = h @ L["wk"].T; v = h @ L["wv"].T
        q = rope(q, H, pos); k = rope(k, KVH, pos)
        k = k.astype(np.float16).astype(f); v = v.astype(np.float16).astype(f)
        Kh = k.reshape(T, KVH, hd); Vh = v.reshape(T, KVH, hd); Qh = q.reshape(T, H, hd)
        if variant != "exact" and l >= a.dense:
            rows, tm, avg, unsel = select_mask(variant, q, k, first, T)
            att_pages.append(avg)
        else:
            rows, tm, unsel = None, None, None
        summ = rows is not None and "summ" in variant
        if summ:
            npg = T // P
            Km = Kh[:npg * P].reshape(npg, P, KVH, hd)
            kmean = Km.mean(1); kvar = Km.var(1)
            vmean = Vh[:npg * P].reshape(npg, P, KVH, hd).mean(1)
            un = unsel[:, :npg]
        o = np.zeros((T, H, hd), f)
        for hh in range(H):
            kvh = hh // G
            S = (Qh[:, hh, :] @ Kh[:, kvh, :].T) * f(m.scale)
            msk = causal.copy()
            if rows is not None:
                sm = tm[:, kvh, :] if tm.ndim == 3 else tm
                msk[rows] &= sm
            S = np.where(msk, S, -np.inf)
            if summ:
                qr = Qh[rows, hh, :]
                Ss = (qr @ kmean[:, kvh, :].T) * f(m.scale) + f(math.log(P))
                if "summv" in variant:
                    Ss = Ss + 0.5 * (qr * qr) @ kvar[:, kvh, :].T * f(m.scale) ** 2
                Ss = np.where(un, Ss, -np.inf)
                mx = np.maximum(S.max(1), np.concatenate([np.full(first + 1, -np.inf, f), Ss.max(1)]))
                Pm = np.exp(S - mx[:, None])
                Ps = np.exp(Ss - mx[rows][:, None])
                den = Pm.sum(1); den[rows] += Ps.sum(1)
                acc = Pm @ Vh[:, kvh, :]
                acc[rows] += Ps @ vmean[:, kvh, :]
                o[:, hh, :] = acc / den[:, None]
                continue
            S = S - S.max(1, keepdims=True)
            Pm = np.exp(S); Pm /= Pm.sum(1, keepdims=True)
            o[:, hh, :] = Pm @ Vh[:, kvh, :]
        x = x + o.reshape(T, H * hd) @ L["wo"].T
        h = rms(x, L["ffn_norm"])
        g = h @ L["wg"].T; u = h @ L["wu"].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ L["wd"].T
    hN = rms(x[first:T - 1], onorm)
    logits = hN @ out.T
    tg = np.array(tokens[first + 1:T])
    mx = logits.max(1, keepdims=True)
    lse = np.log(np.exp(logits - mx).sum(1)) + mx[:, 0]
    nll = lse - logits[np.arange(len(tg)), tg]
    return nll.astype(np.float64), (np.mean(att_pages) if att_pages else 0)

res = {}
for var in a.variants.split(","):
    nlls = []
    t0 = time.time()
    pg = []
    for c in range(a.chunks):
        toks = ids[c * a.ctx:(c + 1) * a.ctx]
        n, ap_ = forward(toks, var)
        nlls.append(n); pg.append(ap_)
    allnll = np.concatenate(nlls)
    ppl = math.exp(allnll.mean())
    res[var] = ppl
    print(f"{var}: ppl {ppl:.4f} pages/sel {np.mean(pg):.1f} ({time.time()-t0:.0f}s)", flush=True)
base = res.get("exact")
if base:
    for k, v in res.items():
        print(f"{k}: {100*(v/base-1):+.2f}%")
