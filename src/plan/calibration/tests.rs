use super::*;

pub(crate) fn cal() -> Calibration {
    Calibration {
        adapter: "test".into(),
        flash: vec![
            FlashRate {
                mode: "direct".into(),
                piece: 1 << 20,
                threads: 4,
                gb_s: 2.0,
            },
            FlashRate {
                mode: "direct".into(),
                piece: 64 << 10,
                threads: 4,
                gb_s: 0.5,
            },
        ],
        upload_gb_s: 10.0,
        matvec_gb_s: [("Q4_1".to_string(), 1.0), ("Q8_0".to_string(), 2.0)].into(),
        prefill_gb_s: [("Q4_1".to_string(), 8.0)].into(),
        dispatch_s: 20e-6,
        attn_gb_s: 4.0,
        overlap_beta: 0.25,
        ..Default::default()
    }
}

pub(crate) fn mat(ty: &str, bytes: u64) -> MatrixWork {
    MatrixWork {
        ty: ty.into(),
        rows: 1000,
        cols: bytes / 1000,
        bytes,
    }
}

#[test]
fn product_rates_by_shape() {
    let pt = |rows: u32, cols: u32, bytes: u64, d: f64, model: bool| MatmulPoint {
        ty: "Q4_K".into(),
        rows,
        cols,
        bytes,
        decode_gb_s: d,
        prefill_gb_s: 2.0 * d,
        model,
    };
    let mut c = cal();
    c.matmul_points = vec![
        pt(512, 512, 1_000, 0.5, false),
        pt(4096, 4096, 100_000, 1.5, false),
        pt(300, 700, 50_000, 3.0, true),
    ];
    let m = |rows: u64, cols: u64, bytes: u64| MatrixWork {
        ty: "Q4_K".into(),
        rows,
        cols,
        bytes,
    };
    // Its own shape: the point measured on it, whatever the interpolation would say.
    assert_eq!(c.product_gb_s(&m(300, 700, 50_000), false), 3.0);
    // Rows past the cap are measured on the cap.
    assert_eq!(c.product_gb_s(&m(90_000, 4096, 100_000), true), 3.0);
    // Between points, linear in log(bytes): 10 000 bytes lie halfway from 1 000 to 100 000
    // (the 50 000-byte point is a shape of its own, but counts as a point too): between
    // 1 000 (0.5) and 50 000 (3.0), at ln(10)/ln(50) of the way.
    let f = 10f64.ln() / 50f64.ln();
    let r = c.product_gb_s(&m(100, 100, 10_000), false);
    assert!((r - (0.5 + f * 2.5)).abs() < 1e-12, "{r}");
    // Outside: held at the ends.
    assert_eq!(c.product_gb_s(&m(10, 10, 10), false), 0.5);
    assert_eq!(c.product_gb_s(&m(9000, 9000, 1 << 30), false), 1.5);
    // A type without points: the per-type rate, else the slowest measured type.
    assert_eq!(c.product_gb_s(&mat("Q8_0", 5), false), 2.0);
    assert_eq!(c.product_gb_s(&mat("Q6_K", 5), false), 1.0);
    // Seconds: 1 MB at 1 GB/s + 2 MB of Q8_0 at 2 GB/s.
    let s = c.products_s(&[mat("Q4_1", 1_000_000), mat("Q8_0", 2_000_000)], false);
    assert!((s - 2e-3).abs() < 1e-15, "{s}");
}

#[test]
fn a_probe_carries_compute_and_flash_to_the_machines_speed_now() {
    let then = Probe {
        model: "m.gguf".into(),
        resident_ms: 100.0,
        flash_small_gb_s: 0.5,
        flash_large_gb_s: 1.0,
    };
    let now = Probe {
        model: "m.gguf".into(),
        resident_ms: 150.0,
        flash_small_gb_s: 0.25,
        flash_large_gb_s: 1.2,
    };
    // No probe of its own: nothing to compare with, unchanged.
    let c = cal();
    assert_eq!(c.rescaled(&now), c);
    let mut c = cal();
    c.compute_scale = 0.8;
    c.prefill_scale = 0.6;
    c.prefill_points = vec![PrefillPoint {
        pass_bytes: 1 << 20,
        scale: 0.4,
    }];
    c.probe = Some(then.clone());
    let r = c.rescaled(&now);
    // Resident decode 1.5x slower: the factor 0.8 becomes 1.2 (the prefill's 0.6, 0.9);
    // matrix rates stay; attention, which takes no factor, runs at 1 / 1.5 of its rates.
    assert!((r.compute_scale - 1.2).abs() < 1e-12, "{}", r.compute_scale);
    assert!(
        (r.attn_gb_s - c.attn_gb_s / 1.5).abs() < 1e-12,
        "{}",
        r.attn_gb_s
    );
    assert!((r.prefill_attn() - c.prefill_attn() / 1.5).abs() < 1e-12);
    assert!((r.prefill_scale - 0.9).abs() < 1e-12, "{}", r.prefill_scale);
    assert!((r.prefill_points[0].scale - 0.6).abs() < 1e-12);
    assert_eq!(r.matvec_gb_s, c.matvec_gb_s);
    // 1 MiB pieces follow the large probe (x1.2), 64 KiB ones the small (x0.5).
    assert!((r.flash_gb_s("direct", 1 << 20, 4) - 2.4).abs() < 1e-12);
    assert!((r.flash_gb_s("direct", 64 << 10, 4) - 0.25).abs() < 1e-12);
    assert_eq!(r.probe, Some(now.clone()));
    // A probe that failed (0) moves nothing; a stalled one is bounded at 5x.
    let failed = Probe {
        resident_ms: 0.0,
        ..now.clone()
    };
    assert!((c.rescaled(&failed).compute_scale - 0.8).abs() < 1e-12);
    let stalled = Probe {
        resident_ms: 1e6,
        ..now.clone()
    };
    assert!((c.rescaled(&stalled).compute_scale - 4.0).abs() < 1e-12);
}

/// A flash rate is the median of its point and the next smaller and larger pieces' at its
/// thread count: one timing far off its neighbours does not decide it, a rising run of
/// points is read as measured, and the table's ends are read as measured.
#[test]
fn flash_rates_pass_over_one_off_timing() {
    let r = |piece: u64, threads: usize, gb_s: f64| FlashRate {
        mode: "direct".into(),
        piece,
        threads,
        gb_s,
    };
    let c = Calibration {
        flash: vec![
            r(64 << 10, 1, 0.6),
            r(256 << 10, 1, 1.0),
            r(1 << 20, 1, 1.3),
            r(4 << 20, 1, 1.35),
            r(64 << 10, 4, 0.9),
            r(256 << 10, 4, 1.2),
            r(1 << 20, 4, 0.7),
            r(4 << 20, 4, 1.25),
        ],
        ..Calibration::default()
    };
    // The dip at 1 MiB over 4 readers reads as the lower of its neighbours.
    assert_eq!(c.flash_gb_s("direct", 1 << 20, 4), 1.2);
    // Rising runs, and the ends, as measured.
    assert_eq!(c.flash_gb_s("direct", 256 << 10, 1), 1.0);
    assert_eq!(c.flash_gb_s("direct", 1 << 20, 1), 1.3);
    assert_eq!(c.flash_gb_s("direct", 64 << 10, 1), 0.6);
    assert_eq!(c.flash_gb_s("direct", 4 << 20, 4), 1.25);
    // The nearest point still decides which row and piece: 48 KiB pieces read at 64 KiB's.
    assert_eq!(c.flash_gb_s("direct", 48 << 10, 1), 0.6);
}
