//! The staging ring moves bytes exactly, survives injected faults and leaks nothing.
mod common;

use common::Rng;
use flashlm::gpu::staging::{ChunkSource, Fault, StagingError, StagingRing};

struct FailingSource {
    data: Vec<u8>,
    fail_at: u64,
}

impl ChunkSource for FailingSource {
    fn read_into(
        &self,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        if offset + dst.len() as u64 > self.fail_at {
            return Err("short read: the file ended early".into());
        }
        self.data.as_slice().read_into(offset, dst)
    }
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut r = Rng(seed);
    (0..n).map(|_| r.next_u64() as u8).collect()
}

#[test]
fn ring_uploads_exact_bytes_over_many_chunks() {
    let Some(ctx) = common::gpu() else { return };
    let data = random_bytes(300_001, 1);
    let mut ring = StagingRing::new(&ctx, 3, 4096).unwrap();
    let dst = ctx.storage("dst", 400_000).unwrap();
    // Odd length from an odd source offset, to an aligned destination offset.
    let stats = ring
        .upload(&ctx, data.as_slice(), 7, 250_003, &dst, 1024)
        .unwrap();
    assert_eq!(stats.bytes, 250_003);
    // Slots hold 4 KiB plus 4 KiB of slack, packed full.
    assert_eq!(stats.chunks, 250_003u64.div_ceil(8192) as u32);
    assert_eq!(stats.wraps, 250_003u64.div_ceil(3 * 8192) as u32 - 1);
    let back = ctx.read_buffer(&dst, 1024 + 250_003).unwrap();
    assert!(back[..1024].iter().all(|&b| b == 0));
    assert_eq!(&back[1024..], &data[7..7 + 250_003]);
    // The ring keeps working for a second upload over the same slots.
    ring.upload(&ctx, data.as_slice(), 0, 8192, &dst, 0)
        .unwrap();
    assert_eq!(ctx.read_buffer(&dst, 8192).unwrap(), &data[..8192]);
}

#[test]
fn ring_reports_bad_destination() {
    let Some(ctx) = common::gpu() else { return };
    let data = random_bytes(100, 2);
    let mut ring = StagingRing::new(&ctx, 2, 4096).unwrap();
    let dst = ctx.storage("dst", 64).unwrap();
    let e = ring
        .upload(&ctx, data.as_slice(), 0, 100, &dst, 0)
        .unwrap_err();
    assert!(matches!(e, StagingError::Destination { .. }), "{e}");
    let e = ring
        .upload(&ctx, data.as_slice(), 0, 8, &dst, 2)
        .unwrap_err();
    assert!(matches!(e, StagingError::Destination { .. }), "{e}");
}

#[test]
fn ring_map_failure_is_an_error_and_leaks_nothing() {
    let Some(ctx) = common::gpu() else { return };
    let base = ctx.budget.in_use();
    let data = random_bytes(64 * 1024, 3);
    let dst = ctx.storage("dst", 64 * 1024).unwrap();
    let with_dst = ctx.budget.in_use();
    {
        let mut ring = StagingRing::new(&ctx, 2, 4096).unwrap();
        assert_eq!(ctx.budget.in_use(), with_dst + ring.device_bytes());
        ring.inject(Fault::MapFailure);
        // 16 chunks over 2 slots: the slot whose re-map fails is needed again.
        let e = ring
            .upload(&ctx, data.as_slice(), 0, data.len() as u64, &dst, 0)
            .unwrap_err();
        assert!(e.to_string().contains("map"), "{e}");
        // After the failure the ring recovers for the next upload.
        ring.upload(&ctx, data.as_slice(), 0, 8192, &dst, 0)
            .unwrap();
        assert_eq!(ctx.read_buffer(&dst, 8192).unwrap(), &data[..8192]);
    }
    assert_eq!(ctx.budget.in_use(), with_dst, "ring bytes released");
    drop(dst);
    assert_eq!(ctx.budget.in_use(), base);
}

#[test]
fn ring_short_read_is_an_error_and_ring_stays_usable() {
    let Some(ctx) = common::gpu() else { return };
    let src = FailingSource {
        data: random_bytes(40_000, 4),
        fail_at: 20_000,
    };
    let dst = ctx.storage("dst", 40_000).unwrap();
    let mut ring = StagingRing::new(&ctx, 2, 4096).unwrap();
    let e = ring.upload(&ctx, &src, 0, 40_000, &dst, 0).unwrap_err();
    match &e {
        StagingError::Read { offset, .. } => assert!(*offset < 20_000 && *offset + 4096 > 16_000),
        other => panic!("expected a read error, got {other}"),
    }
    ring.upload(&ctx, &src, 0, 12_000, &dst, 0).unwrap();
    assert_eq!(ctx.read_buffer(&dst, 12_000).unwrap(), &src.data[..12_000]);
}

/// A source that asks for 4 KiB placement and records where each read landed.
struct AlignedSource {
    data: Vec<u8>,
    landed: std::sync::Mutex<Vec<(u64, usize)>>,
}

impl ChunkSource for AlignedSource {
    fn read_into(
        &self,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.landed
            .lock()
            .unwrap()
            .push((offset, dst.as_ptr() as usize));
        self.data.as_slice().read_into(offset, dst)
    }
    fn preferred_alignment(&self) -> u64 {
        4096
    }
}

#[test]
fn ring_places_chunks_at_the_source_alignment() {
    let Some(ctx) = common::gpu() else { return };
    let src = AlignedSource {
        data: random_bytes(70_000, 5),
        landed: Default::default(),
    };
    let mut ring = StagingRing::new(&ctx, 3, 8192).unwrap();
    let dst = ctx.storage("dst", 70_000).unwrap();
    // 4-byte aligned offsets move with the file; others fall back to the slot start.
    for (off, len) in [(4100u64, 30_001u64), (4102, 20_000), (0, 8192)] {
        ring.upload(&ctx, &src, off, len, &dst, 0).unwrap();
        let back = ctx.read_buffer(&dst, len).unwrap();
        assert_eq!(
            &back[..],
            &src.data[off as usize..(off + len) as usize],
            "offset {off}"
        );
    }
    let landed = src.landed.lock().unwrap();
    // Chunks whose file offset is a multiple of 4 keep their position within the page.
    let aligned = landed
        .iter()
        .filter(|(o, p)| o % 4 == 0 && (*p % 4096) as u64 == o % 4096)
        .count();
    let eligible = landed.iter().filter(|(o, _)| o % 4 == 0).count();
    eprintln!("{aligned} of {eligible} eligible chunks landed at the file's page offset");
    assert!(eligible > 0);
    assert_eq!(aligned, eligible);
}

#[test]
fn batch_larger_than_the_ring_is_exact_and_recovers_from_errors() {
    use flashlm::gpu::staging::UploadReq;
    let Some(ctx) = common::gpu() else { return };
    let data = random_bytes(200_000, 6);
    let a = ctx.storage("a", 90_000).unwrap();
    let b = ctx.storage("b", 90_000).unwrap();
    // 3 slots of 8 KiB against 170 KB of requests: the batch is submitted as the ring wraps.
    let mut ring = StagingRing::new(&ctx, 3, 8192).unwrap();
    let reqs = [
        UploadReq {
            src_offset: 5,
            len: 80_001,
            dst: &a,
            dst_offset: 0,
        },
        UploadReq {
            src_offset: 100_000,
            len: 90_000,
            dst: &b,
            dst_offset: 0,
        },
        UploadReq {
            src_offset: 0,
            len: 4,
            dst: &a,
            dst_offset: 85_000,
        },
    ];
    let st = ring.upload_batch(&ctx, data.as_slice(), &reqs).unwrap();
    assert_eq!(st.bytes, 80_001 + 90_000 + 4);
    let ra = ctx.read_buffer(&a, 85_004).unwrap();
    assert_eq!(&ra[..80_001], &data[5..80_006]);
    assert_eq!(&ra[85_000..], &data[..4]);
    assert_eq!(
        ctx.read_buffer(&b, 90_000).unwrap(),
        &data[100_000..190_000]
    );
    // A failing read in the middle of a batch: an error, then the ring works again.
    let src = FailingSource {
        data: data.clone(),
        fail_at: 50_000,
    };
    let e = ring.upload_batch(&ctx, &src, &reqs).unwrap_err();
    assert!(matches!(e, StagingError::Read { .. }), "{e}");
    ring.upload(&ctx, data.as_slice(), 7, 40_000, &b, 0)
        .unwrap();
    assert_eq!(ctx.read_buffer(&b, 40_000).unwrap(), &data[7..40_007]);
}

#[test]
fn a_ring_sized_for_a_layer_holds_the_layer() {
    use flashlm::gpu::staging::{UploadReq, slots_for};
    let Some(ctx) = common::gpu() else { return };
    // A "layer" of 10 chunks' worth of odd-sized tensors, more pieces than slots: packed, they
    // fit a ring of slots_for(bytes) slots without the batch wrapping onto itself.
    let chunk = 16 * 1024;
    let sizes = [
        23_001u64, 7, 40_000, 5_003, 1, 33_333, 12_288, 9_999, 17, 30_000, 4_095, 3,
    ];
    let total: u64 = sizes.iter().sum();
    let data = random_bytes(total as usize, 8);
    let dst = ctx
        .storage("layer", total + 4 * sizes.len() as u64)
        .unwrap();
    let mut reqs = Vec::new();
    let mut off = 0u64;
    let mut at = 0u64;
    for &n in &sizes {
        reqs.push(UploadReq {
            src_offset: off,
            len: n,
            dst: &dst,
            dst_offset: at,
        });
        off += n;
        at += n.div_ceil(4) * 4;
    }
    let slots = slots_for(total, sizes.len() as u64, chunk);
    assert!(slots < sizes.len(), "fewer slots than pieces: {slots}");
    let mut ring = StagingRing::new(&ctx, slots, chunk).unwrap();
    let st = ring.upload_batch(&ctx, data.as_slice(), &reqs).unwrap();
    assert_eq!(st.wraps, 0, "a layer-sized ring must hold the layer");
    assert_eq!(st.bytes, total);
    let back = ctx.read_buffer(&dst, at).unwrap();
    let mut off = 0usize;
    let mut at = 0usize;
    for &n in &sizes {
        let n = n as usize;
        assert_eq!(&back[at..at + n], &data[off..off + n]);
        off += n;
        at += n.div_ceil(4) * 4;
    }
    // One slot fewer and the batch must wrap.
    let mut small = StagingRing::new(&ctx, slots - 1, chunk).unwrap();
    assert!(
        small
            .upload_batch(&ctx, data.as_slice(), &reqs)
            .unwrap()
            .wraps
            >= 1
    );
}
