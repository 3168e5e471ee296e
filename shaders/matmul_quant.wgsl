// Weight decoders of matmul.wgsl for Q5_0, Q5_1, IQ4_NL (32-weight blocks) and Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K, IQ4_XS (256-weight super-blocks). Block layouts are described in
// src/gguf/quant/{q5,kquant,iquant}.rs; each decoder computes the same f32 weights as the CPU.
//
// Flags: EXT (one of these types), SUPER (a super-block type), and the type's name.
//
// ext_unit (generic entry): the 8 weights of row r, columns [8u, 8u + 8).
// ext_block (BLOCKS entry, 32-weight blocks): the 32 weights of block k of the row at byte rb,
// loading each of its words once.
// ext_header / ext_chunk (BLOCKS entry, super-blocks): the fields that a run of HDR_EVERY
// 32-weight chunks share (scales, factors, high bits), loaded once for the run, and the 32
// weights of chunk k (chunk k % 8 of super-block k / 8) given them.
//
// Every block starts at an even byte. Types whose block size is a multiple of 4 (Q5_1, Q2_K,
// Q4_K, Q5_K, IQ4_XS) have word-aligned rows and read words directly; the others read through
// word_at2 / run8, which splice two words when a field starts 2 bytes into a word.

#ifdef EXT
// Four bytes as f32s.
fn u8x4(q: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8(q));
}

// Bits 0..3 of x moved to bit 0 of bytes 0..3.
fn spread4(x: u32) -> u32 {
    return ((x & 15u) * 0x00204081u) & 0x01010101u;
}

// The byte at any offset.
fn byte_at(s: u32, off: u32) -> u32 {
    return (word(s, off >> 2u) >> ((off & 3u) * 8u)) & 0xffu;
}

// The IQ4 code book as signed bytes, four per word.
const IQ4_W0: u32 = 0xbfad9881u;
const IQ4_W1: u32 = 0xf6eaddcfu;
const IQ4_W2: u32 = 0x26190d01u;
const IQ4_W3: u32 = 0x71594535u;

// Code book values of four codes held in the low nibbles of q's bytes.
fn iq4(q: u32) -> vec4<f32> {
    let n = unpack4xU8(q);
    let mid = (n & vec4<u32>(4u)) != vec4<u32>(0u);
    let hi = (n & vec4<u32>(8u)) != vec4<u32>(0u);
    let lo_w = select(vec4<u32>(IQ4_W0), vec4<u32>(IQ4_W1), mid);
    let hi_w = select(vec4<u32>(IQ4_W2), vec4<u32>(IQ4_W3), mid);
    let b = (select(lo_w, hi_w, hi) >> ((n & vec4<u32>(3u)) * 8u)) << vec4<u32>(24u);
    return vec4<f32>(bitcast<vec4<i32>>(b) >> vec4<u32>(24u));
}

// A signed byte as f32.
fn i8f(b: u32) -> f32 {
    return f32(bitcast<i32>(b << 24u) >> 24u);
}

// Scale and min (6 bits each) of sub-block j of a Q4_K / Q5_K super-block, from the three
// words of its 12 scale bytes.
fn k4_scale_min(j: u32, s0: u32, s1: u32, s2: u32) -> vec2<f32> {
    let sh = (j & 3u) * 8u;
    let a = s0 >> sh;
    let m = s1 >> sh;
    if (j < 4u) {
        return vec2<f32>(f32(a & 63u), f32(m & 63u));
    }
    let c = s2 >> sh;
    return vec2<f32>(f32((c & 15u) | ((a >> 2u) & 0x30u)), f32(((c >> 4u) & 15u) | ((m >> 2u) & 0x30u)));
}

// Signed 6-bit scale (less 32) of sub-block g of a Q3_K super-block at byte sb.
fn q3k_scale(s: u32, sb: u32, g: u32) -> f32 {
    let low = (byte_at(s, sb + 96u + (g & 7u)) >> ((g >> 3u) * 4u)) & 15u;
    let high = (byte_at(s, sb + 104u + (g & 3u)) >> ((g >> 2u) * 2u)) & 3u;
    return f32(i32(low | (high << 4u)) - 32);
}

// Scale of sub-block j (32 weights) of an IQ4_XS super-block: words 0 and 1 of the block.
fn iq4xs_scale(j: u32, w0: u32, w1: u32) -> f32 {
    let ls = ((w1 >> (4u * j)) & 15u) | (((w0 >> (16u + 2u * j)) & 3u) << 4u);
    return unpack2x16float(w0).x * f32(i32(ls) - 32);
}
#endif

#ifdef EXT
#ifndef BLOCKS
// Two words (8 bytes) at an even byte offset.
fn bytes8(s: u32, off: u32) -> vec2<u32> {
    return vec2<u32>(word_at2(s, off), word_at2(s, off + 4u));
}

fn ext_unit(s: u32, r: u32, u: u32) -> Unit {
    let rb = row_byte(s, r);
#ifdef Q5_0
    let blk = rb + (u >> 2u) * 22u;
    let sub = u & 3u;
    let d = unpack2x16float(half_at(s, blk)).x;
    let qh = word_at2(s, blk + 2u) >> (sub * 8u);
    let q = (bytes8(s, blk + 6u + (sub & 1u) * 8u) >> vec2<u32>((sub >> 1u) * 4u)) & vec2<u32>(0x0f0f0f0fu);
    return Unit(
        (u8x4(q.x | (spread4(qh) << 4u)) - 16.0) * d,
        (u8x4(q.y | (spread4(qh >> 4u) << 4u)) - 16.0) * d
    );
#endif
#ifdef Q5_1
    let wi = (rb + (u >> 2u) * 24u) >> 2u;
    let sub = u & 3u;
    let dm = unpack2x16float(word(s, wi));
    let qh = word(s, wi + 1u) >> (sub * 8u);
    let qi = wi + 2u + (sub & 1u) * 2u;
    let sh = (sub >> 1u) * 4u;
    let q0 = ((word(s, qi) >> sh) & 0x0f0f0f0fu) | (spread4(qh) << 4u);
    let q1 = ((word(s, qi + 1u) >> sh) & 0x0f0f0f0fu) | (spread4(qh >> 4u) << 4u);
    return Unit(u8x4(q0) * dm.x + dm.y, u8x4(q1) * dm.x + dm.y);
#endif
#ifdef IQ4_NL
    let blk = rb + (u >> 2u) * 18u;
    let sub = u & 3u;
    let d = unpack2x16float(half_at(s, blk)).x;
    let q = (bytes8(s, blk + 2u + (sub & 1u) * 8u) >> vec2<u32>((sub >> 1u) * 4u)) & vec2<u32>(0x0f0f0f0fu);
    return Unit(iq4(q.x) * d, iq4(q.y) * d);
#endif
#ifdef SUPER
    // Unit ui of the super-block holds weights e = 8 ui + [0, 8): offset l0 in chunk j = ui / 4
    // (32 weights) and in sub-block g = ui / 2 (16 weights).
    let ui = u & 31u;
    let j = ui >> 2u;
    let l0 = (ui & 3u) * 8u;
#endif
#ifdef Q2_K
    let sb = rb + (u >> 5u) * 84u;
    let wi = sb >> 2u;
    let sc = byte_at(s, sb + (ui >> 1u));
    let dd = unpack2x16float(word(s, wi + 20u));
    let dl = dd.x * f32(sc & 15u);
    let ml = dd.y * f32(sc >> 4u);
    let qi = wi + 4u + (j >> 2u) * 8u + (l0 >> 2u);
    let sh = (j & 3u) * 2u;
    return Unit(
        u8x4((word(s, qi) >> sh) & 0x03030303u) * dl - ml,
        u8x4((word(s, qi + 1u) >> sh) & 0x03030303u) * dl - ml
    );
#endif
#ifdef Q3_K
    let sb = rb + (u >> 5u) * 110u;
    let dl = unpack2x16float(half_at(s, sb + 108u)).x * q3k_scale(s, sb, ui >> 1u);
    let hm = (bytes8(s, sb + l0) >> vec2<u32>(j)) & vec2<u32>(0x01010101u);
    let q = (bytes8(s, sb + 32u + (j >> 2u) * 32u + l0) >> vec2<u32>((j & 3u) * 2u)) & vec2<u32>(0x03030303u);
    let c = q | (hm << vec2<u32>(2u));
    return Unit((u8x4(c.x) - 4.0) * dl, (u8x4(c.y) - 4.0) * dl);
#endif
#ifdef Q4_K
    let wi = (rb + (u >> 5u) * 144u) >> 2u;
    let dd = unpack2x16float(word(s, wi));
    let sm = k4_scale_min(j, word(s, wi + 1u), word(s, wi + 2u), word(s, wi + 3u));
    let dl = dd.x * sm.x;
    let ml = dd.y * sm.y;
    let qi = wi + 4u + (j >> 1u) * 8u + (l0 >> 2u);
    let sh = (j & 1u) * 4u;
    return Unit(
        u8x4((word(s, qi) >> sh) & 0x0f0f0f0fu) * dl - ml,
        u8x4((word(s, qi + 1u) >> sh) & 0x0f0f0f0fu) * dl - ml
    );
#endif
#ifdef Q5_K
    let wi = (rb + (u >> 5u) * 176u) >> 2u;
    let dd = unpack2x16float(word(s, wi));
    let sm = k4_scale_min(j, word(s, wi + 1u), word(s, wi + 2u), word(s, wi + 3u));
    let dl = dd.x * sm.x;
    let ml = dd.y * sm.y;
    let hi = wi + 4u + (l0 >> 2u);
    let qi = wi + 12u + (j >> 1u) * 8u + (l0 >> 2u);
    let sh = (j & 1u) * 4u;
    let q0 = ((word(s, qi) >> sh) & 0x0f0f0f0fu) | (((word(s, hi) >> j) & 0x01010101u) << 4u);
    let q1 = ((word(s, qi + 1u) >> sh) & 0x0f0f0f0fu) | (((word(s, hi + 1u) >> j) & 0x01010101u) << 4u);
    return Unit(u8x4(q0) * dl - ml, u8x4(q1) * dl - ml);
#endif
#ifdef Q6_K
    let sb = rb + (u >> 5u) * 210u;
    let h = j >> 2u;
    let sub = j & 3u;
    let dl = unpack2x16float(half_at(s, sb + 208u)).x * i8f(byte_at(s, sb + 192u + (ui >> 1u)));
    let lo = (bytes8(s, sb + h * 64u + (sub & 1u) * 32u + l0) >> vec2<u32>((sub >> 1u) * 4u)) & vec2<u32>(0x0f0f0f0fu);
    let hi = (bytes8(s, sb + 128u + h * 32u + l0) >> vec2<u32>(sub * 2u)) & vec2<u32>(0x03030303u);
    let c = lo | (hi << vec2<u32>(4u));
    return Unit((u8x4(c.x) - 32.0) * dl, (u8x4(c.y) - 32.0) * dl);
#endif
#ifdef IQ4_XS
    let wi = (rb + (u >> 5u) * 136u) >> 2u;
    let dl = iq4xs_scale(j, word(s, wi), word(s, wi + 1u));
    // Chunk j is 16 bytes in IQ4_NL's order: l0 / 8 picks the bytes and the nibble.
    let sub = ui & 3u;
    let qi = wi + 2u + j * 4u + (sub & 1u) * 2u;
    let sh = (sub >> 1u) * 4u;
    return Unit(iq4((word(s, qi) >> sh) & 0x0f0f0f0fu) * dl, iq4((word(s, qi + 1u) >> sh) & 0x0f0f0f0fu) * dl);
#endif
}
#endif
#endif

#ifdef EXT
#ifdef BLOCKS
// Eight words of bytes.
struct W8 {
    a: vec4<u32>,
    b: vec4<u32>,
}

// The eight words starting at word i.
fn run8a(s: u32, i: u32) -> W8 {
    return W8(
        vec4<u32>(word(s, i), word(s, i + 1u), word(s, i + 2u), word(s, i + 3u)),
        vec4<u32>(word(s, i + 4u), word(s, i + 5u), word(s, i + 6u), word(s, i + 7u))
    );
}

// The 32 bytes at an even byte offset.
fn run8(s: u32, off: u32) -> W8 {
    let w = run8a(s, off >> 2u);
    if ((off & 2u) == 0u) {
        return w;
    }
    let a1 = vec4<u32>(w.a.yzw, w.b.x);
    let b1 = vec4<u32>(w.b.yzw, word(s, (off >> 2u) + 8u));
    return W8((w.a >> vec4<u32>(16u)) | (a1 << vec4<u32>(16u)), (w.b >> vec4<u32>(16u)) | (b1 << vec4<u32>(16u)));
}

// 32 weights from 32 code bytes: (code + bias) * s.x + s.y, with s0 for the first 16 weights
// and s1 for the last 16.
fn codes(q: W8, bias: f32, s0: vec2<f32>, s1: vec2<f32>) -> Blk {
    return Blk(
        (u8x4(q.a.x) + bias) * s0.x + s0.y, (u8x4(q.a.y) + bias) * s0.x + s0.y,
        (u8x4(q.a.z) + bias) * s0.x + s0.y, (u8x4(q.a.w) + bias) * s0.x + s0.y,
        (u8x4(q.b.x) + bias) * s1.x + s1.y, (u8x4(q.b.y) + bias) * s1.x + s1.y,
        (u8x4(q.b.z) + bias) * s1.x + s1.y, (u8x4(q.b.w) + bias) * s1.x + s1.y
    );
}

// Bytes of x masked by m, shifted right by sh.
fn field(x: W8, sh: u32, m: u32) -> W8 {
    return W8((x.a >> vec4<u32>(sh)) & vec4<u32>(m), (x.b >> vec4<u32>(sh)) & vec4<u32>(m));
}

fn or_shl(x: W8, y: W8, sh: u32) -> W8 {
    return W8(x.a | (y.a << vec4<u32>(sh)), x.b | (y.b << vec4<u32>(sh)));
}

// Q5_0 / Q5_1 codes: the 16 `qs` bytes as words q, the fifth bits in qh.
fn q5_codes(q: vec4<u32>, qh: u32) -> W8 {
    let lo = q & vec4<u32>(0x0f0f0f0fu);
    let hi = (q >> vec4<u32>(4u)) & vec4<u32>(0x0f0f0f0fu);
    let h0 = vec4<u32>(spread4(qh), spread4(qh >> 4u), spread4(qh >> 8u), spread4(qh >> 12u));
    let h1 = vec4<u32>(spread4(qh >> 16u), spread4(qh >> 20u), spread4(qh >> 24u), spread4(qh >> 28u));
    return W8(lo | (h0 << vec4<u32>(4u)), hi | (h1 << vec4<u32>(4u)));
}

// IQ4 weights of 16 nibble bytes (words q) in Q4_0's order, times d.
fn iq4_blk(q: vec4<u32>, d: f32) -> Blk {
    let lo = q & vec4<u32>(0x0f0f0f0fu);
    let hi = (q >> vec4<u32>(4u)) & vec4<u32>(0x0f0f0f0fu);
    return Blk(
        iq4(lo.x) * d, iq4(lo.y) * d, iq4(lo.z) * d, iq4(lo.w) * d,
        iq4(hi.x) * d, iq4(hi.y) * d, iq4(hi.z) * d, iq4(hi.w) * d
    );
}

#ifndef SUPER
fn ext_block(s: u32, rb: u32, k: u32) -> Blk {
#ifdef Q5_0
    // f16 d, u32 qh, 16 bytes qs: 22 bytes from an even offset lie in the six words from i.
    let b = rb + k * 22u;
    let i = b >> 2u;
    let odd = (b & 2u) != 0u;
    let w0 = word(s, i);
    let w1 = word(s, i + 1u);
    let w2 = word(s, i + 2u);
    let w3 = word(s, i + 3u);
    let w4 = word(s, i + 4u);
    let w5 = word(s, i + 5u);
    let d = unpack2x16float(select(w0, w0 >> 16u, odd)).x;
    let q = vec4<u32>(shifted(odd, w1, w2), shifted(odd, w2, w3), shifted(odd, w3, w4), shifted(odd, w4, w5));
    return codes(q5_codes(q, shifted(odd, w0, w1)), -16.0, vec2<f32>(d, 0.0), vec2<f32>(d, 0.0));
#endif
#ifdef Q5_1
    let i = (rb + k * 24u) >> 2u;
    let dm = unpack2x16float(word(s, i));
    let q = vec4<u32>(word(s, i + 2u), word(s, i + 3u), word(s, i + 4u), word(s, i + 5u));
    return codes(q5_codes(q, word(s, i + 1u)), 0.0, dm, dm);
#endif
#ifdef IQ4_NL
    let b = rb + k * 18u;
    let i = b >> 2u;
    let odd = (b & 2u) != 0u;
    let w0 = word(s, i);
    let w1 = word(s, i + 1u);
    let w2 = word(s, i + 2u);
    let w3 = word(s, i + 3u);
    let w4 = word(s, i + 4u);
    let d = unpack2x16float(select(w0, w0 >> 16u, odd)).x;
    return iq4_blk(vec4<u32>(shifted(odd, w0, w1), shifted(odd, w1, w2), shifted(odd, w2, w3), shifted(odd, w3, w4)), d);
#endif
}
#endif

#ifdef SUPER
// Fields of a super-block that several chunks share: a, b hold eight words of high bits (Q3_K
// hmask, Q5_K qh, Q6_K qh of the current 128 weights), c up to four words of sub-block scales,
// d the f16 factors, off the super-block's byte offset.
struct Hdr {
    a: vec4<u32>,
    b: vec4<u32>,
    c: vec4<u32>,
    d: vec2<f32>,
    off: u32,
}

#ifdef Q6_K
// Q6_K's high bits change every 128 weights.
const HDR_EVERY: u32 = 4u;
#else
const HDR_EVERY: u32 = 8u;
#endif

const NO_WORDS: W8 = W8(vec4<u32>(0u), vec4<u32>(0u));

// The shared fields for chunk k of the row at byte rb.
fn ext_header(s: u32, rb: u32, k: u32) -> Hdr {
#ifdef Q2_K
    let off = rb + (k >> 3u) * 84u;
    let i = off >> 2u;
    let sc = vec4<u32>(word(s, i), word(s, i + 1u), word(s, i + 2u), word(s, i + 3u));
    return Hdr(NO_WORDS.a, NO_WORDS.b, sc, unpack2x16float(word(s, i + 20u)), off);
#endif
#ifdef Q3_K
    let off = rb + (k >> 3u) * 110u;
    let hm = run8(s, off);
    let sc = vec4<u32>(word_at2(s, off + 96u), word_at2(s, off + 100u), word_at2(s, off + 104u), 0u);
    return Hdr(hm.a, hm.b, sc, unpack2x16float(half_at(s, off + 108u)), off);
#endif
#ifdef Q4_K
    let off = rb + (k >> 3u) * 144u;
    let i = off >> 2u;
    let sc = vec4<u32>(word(s, i + 1u), word(s, i + 2u), word(s, i + 3u), 0u);
    return Hdr(NO_WORDS.a, NO_WORDS.b, sc, unpack2x16float(word(s, i)), off);
#endif
#ifdef Q5_K
    let off = rb + (k >> 3u) * 176u;
    let i = off >> 2u;
    let sc = vec4<u32>(word(s, i + 1u), word(s, i + 2u), word(s, i + 3u), 0u);
    let qh = run8a(s, i + 4u);
    return Hdr(qh.a, qh.b, sc, unpack2x16float(word(s, i)), off);
#endif
#ifdef Q6_K
    let off = rb + (k >> 3u) * 210u;
    let qh = run8(s, off + 128u + ((k >> 2u) & 1u) * 32u);
    let sc = vec4<u32>(
        word_at2(s, off + 192u), word_at2(s, off + 196u), word_at2(s, off + 200u), word_at2(s, off + 204u)
    );
    return Hdr(qh.a, qh.b, sc, unpack2x16float(half_at(s, off + 208u)), off);
#endif
#ifdef IQ4_XS
    let off = rb + (k >> 3u) * 136u;
    let i = off >> 2u;
    let w0 = word(s, i);
    return Hdr(NO_WORDS.a, NO_WORDS.b, vec4<u32>(w0, word(s, i + 1u), 0u, 0u), unpack2x16float(w0), off);
#endif
}

// Byte n (0..16) of the header's scale words.
fn hdr_byte(h: Hdr, n: u32) -> u32 {
    return (h.c[n >> 2u] >> ((n & 3u) * 8u)) & 0xffu;
}

// The 32 weights of chunk k (chunk k % 8 of its super-block), given its header.
fn ext_chunk(s: u32, h: Hdr, k: u32) -> Blk {
    let j = k & 7u;
    let hw = W8(h.a, h.b);
#ifdef Q2_K
    let sc0 = hdr_byte(h, 2u * j);
    let sc1 = hdr_byte(h, 2u * j + 1u);
    let s0 = vec2<f32>(h.d.x * f32(sc0 & 15u), -(h.d.y * f32(sc0 >> 4u)));
    let s1 = vec2<f32>(h.d.x * f32(sc1 & 15u), -(h.d.y * f32(sc1 >> 4u)));
    let q = field(run8a(s, (h.off >> 2u) + 4u + (j >> 2u) * 8u), (j & 3u) * 2u, 0x03030303u);
    return codes(q, 0.0, s0, s1);
#endif
#ifdef Q3_K
    // Sub-blocks 2j and 2j + 1: low nibbles in bytes (2j) % 8 and + 1 (high nibbles from j = 4
    // on), top bits in bytes 8 + (2j) % 4 and + 1 at bit 2 (j / 2).
    let lo = (h.c[(j >> 1u) & 1u] >> ((j & 1u) * 16u)) >> ((j >> 2u) * 4u);
    let hi = (h.c.z >> ((j & 1u) * 16u)) >> ((j >> 1u) * 2u);
    let l0 = (lo & 15u) | ((hi & 3u) << 4u);
    let l1 = ((lo >> 8u) & 15u) | (((hi >> 8u) & 3u) << 4u);
    let s0 = vec2<f32>(h.d.x * f32(i32(l0) - 32), 0.0);
    let s1 = vec2<f32>(h.d.x * f32(i32(l1) - 32), 0.0);
    let q = field(run8(s, h.off + 32u + (j >> 2u) * 32u), (j & 3u) * 2u, 0x03030303u);
    return codes(or_shl(q, field(hw, j, 0x01010101u), 2u), -4.0, s0, s1);
#endif
#ifdef Q4_K
    let sm = k4_scale_min(j, h.c.x, h.c.y, h.c.z);
    let sc = vec2<f32>(h.d.x * sm.x, -(h.d.y * sm.y));
    return codes(field(run8a(s, (h.off >> 2u) + 4u + (j >> 1u) * 8u), (j & 1u) * 4u, 0x0f0f0f0fu), 0.0, sc, sc);
#endif
#ifdef Q5_K
    let sm = k4_scale_min(j, h.c.x, h.c.y, h.c.z);
    let sc = vec2<f32>(h.d.x * sm.x, -(h.d.y * sm.y));
    let q = field(run8a(s, (h.off >> 2u) + 12u + (j >> 1u) * 8u), (j & 1u) * 4u, 0x0f0f0f0fu);
    return codes(or_shl(q, field(hw, j, 0x01010101u), 4u), 0.0, sc, sc);
#endif
#ifdef Q6_K
    let sub = j & 3u;
    let s0 = vec2<f32>(h.d.x * i8f(hdr_byte(h, 2u * j)), 0.0);
    let s1 = vec2<f32>(h.d.x * i8f(hdr_byte(h, 2u * j + 1u)), 0.0);
    let lo = field(run8(s, h.off + (j >> 2u) * 64u + (sub & 1u) * 32u), (sub >> 1u) * 4u, 0x0f0f0f0fu);
    return codes(or_shl(lo, field(hw, sub * 2u, 0x03030303u), 4u), -32.0, s0, s1);
#endif
#ifdef IQ4_XS
    let dl = iq4xs_scale(j, h.c.x, h.c.y);
    let qi = (h.off >> 2u) + 2u + j * 4u;
    return iq4_blk(vec4<u32>(word(s, qi), word(s, qi + 1u), word(s, qi + 2u), word(s, qi + 3u)), dl);
#endif
}
#endif
#endif
#endif
