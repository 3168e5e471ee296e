//! Every shader variant the engine uses compiles on the adapter.
mod common;

use flashlm::gguf::GgmlType;
use flashlm::gpu::Defines;
use flashlm::kernels::weight_type_defines;

/// Flags combined with every matrix kernel variant: plain, fused residual, SwiGLU, GeGLU.
const EXTRAS: [&[&str]; 4] = [&[], &["ACC"], &["SWIGLU"], &["SWIGLU", "GELU"]];

#[test]
fn all_shader_variants_compile() {
    let Some(ctx) = common::gpu() else { return };
    for ty in GgmlType::ALL {
        for tt in [1, 8] {
            for extra in EXTRAS {
                let mut d = weight_type_defines(ty)
                    .val("ROWS_PER_WG", "4u")
                    .val("TPR", "16u")
                    .val("TT", format!("{tt}u"));
                for e in extra {
                    d = d.flag(e);
                }
                ctx.pipelines
                    .get(&ctx.device, "matmul", "main", &d)
                    .unwrap_or_else(|e| panic!("{ty} {tt} {extra:?}: {e}"));
            }
        }
    }
    // The thread-per-row block path of the quantized types, with and without shared X.
    for ty in GgmlType::ALL.into_iter().filter(|t| t.is_quantized()) {
        for tt in [1, 8] {
            for extra in EXTRAS {
                for share in [false, true] {
                    if share && !ctx.subgroups8 {
                        continue;
                    }
                    let mut d = weight_type_defines(ty)
                        .flag("BLOCKS")
                        .val("ROWS_PER_WG", "8u")
                        .val("TPR", "1u")
                        .val("TT", format!("{tt}u"));
                    if share {
                        d = d.flag("SHARE_X");
                    }
                    for e in extra {
                        d = d.flag(e);
                    }
                    ctx.pipelines
                        .get(&ctx.device, "matmul", "main", &d)
                        .unwrap_or_else(|e| panic!("{ty} {tt} {extra:?} share={share}: {e}"));
                }
            }
        }
    }
    for flags in [&[][..], &["INPLACE"], &["ACC"], &["INPLACE", "ACC"]] {
        let d = flags.iter().fold(Defines::new(), |d, f| d.flag(f));
        ctx.pipelines
            .get(&ctx.device, "rmsnorm", "main", &d)
            .unwrap_or_else(|e| panic!("rmsnorm {flags:?}: {e}"));
    }
    ctx.pipelines
        .get(&ctx.device, "rope", "main", &Defines::new())
        .unwrap();
    for dpt in [1, 2, 4] {
        for vec4 in [false, true] {
            for f16 in [false, true] {
                let mut d = Defines::new().val("DPT", format!("{dpt}u"));
                if vec4 {
                    d = d.flag("VEC4");
                }
                if f16 {
                    d = d.flag("KV_F16");
                }
                for flags in [&[][..], &["SOFTCAP"], &["SWA"], &["SOFTCAP", "SWA"]] {
                    let d = flags.iter().fold(d.clone(), |d, f| d.flag(f));
                    ctx.pipelines
                        .get(&ctx.device, "attention", "main", &d)
                        .unwrap_or_else(|e| {
                            panic!("attention dpt={dpt} vec4={vec4} f16={f16} {flags:?}: {e}")
                        });
                }
                ctx.pipelines
                    .get(&ctx.device, "attention", "merge", &d.clone().flag("MERGE"))
                    .unwrap_or_else(|e| panic!("merge dpt={dpt} vec4={vec4} f16={f16}: {e}"));
            }
        }
    }
    for f16 in [false, true] {
        let k = |flag: &str| {
            let d = Defines::new().flag(flag);
            if f16 { d.flag("KV_F16") } else { d }
        };
        ctx.pipelines
            .get(&ctx.device, "kv", "store", &k("STORE"))
            .unwrap();
        ctx.pipelines
            .get(&ctx.device, "kv", "page_meta", &k("META"))
            .unwrap();
    }
    ctx.pipelines
        .get(&ctx.device, "kv", "score", &Defines::new().flag("SCORE"))
        .unwrap();
    ctx.pipelines
        .get(&ctx.device, "elementwise", "add_bias", &Defines::new())
        .unwrap();
    // Cached: asking again compiles nothing new.
    let n = ctx.pipelines.len();
    ctx.pipelines
        .get(&ctx.device, "rmsnorm", "main", &Defines::new())
        .unwrap();
    assert_eq!(ctx.pipelines.len(), n);
    ctx.check().unwrap();
}
