//! How the matrix kernels spread rows over threads, per adapter class.

/// How the matrix kernels spread a row over threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulLayout {
    /// Rows per workgroup.
    pub rows_per_wg: u32,
    /// Threads per row (a power of two; 1 means no cross-thread reduction).
    pub tpr: u32,
    /// With one thread per row on a device with 8-wide subgroups: each lane loads a different
    /// part of X and the lanes share it by subgroup broadcasts (ignored elsewhere).
    pub share_x: bool,
    /// Rows each thread walks in the decode products of 32-weight blocks (1: one row a
    /// thread); a workgroup still covers `rows_per_wg` rows, with that many fewer threads.
    pub rows_per_lane: u32,
    /// Words a thread reads from a weight in one load in those decode products: 1, or 4
    /// (Q4_1 and Q8_0 rows read as streams of vec4s). A load costs per lane on CPU
    /// rasterizers whatever its width.
    pub load_words: u32,
    /// With one thread per row: loads of 16 bytes (those streamed rows' vec4s, X and the
    /// norm weights) taken as two 64-bit words (`vec2<u64>`) where the device has 64-bit
    /// integers. On CPU rasterizers a load costs per lane and component whatever the
    /// component's width, so the same 16 bytes cost half as many.
    pub load64: bool,
    /// Those streamed rows: bytes from each row's start whose cache lines a thread touches
    /// (loads a word of) before its streams start, so that their misses overlap (0: none).
    pub touch_bytes: u32,
    /// `rows_per_lane` for the decode products of Q, K and V in one dispatch
    /// (`kernels::matmul_multi`): they normalize their X themselves, so each thread loads X
    /// and the norm weights for every block, and more rows a thread share those loads.
    pub multi_rows_per_lane: u32,
    /// Rows each thread walks in the prefill products of one weight (1 or 2): with 2, each
    /// load of a token's X serves two rows (gated products already serve their two weights).
    pub prefill_rows_per_lane: u32,
}

impl MatmulLayout {
    /// GPUs: 16 threads share a row, so neighbouring threads read neighbouring weight bytes.
    pub const GPU: Self = Self {
        rows_per_wg: 4,
        tpr: 16,
        share_x: false,
        rows_per_lane: 1,
        load_words: 1,
        load64: false,
        touch_bytes: 0,
        multi_rows_per_lane: 1,
        prefill_rows_per_lane: 1,
    };
    /// CPU rasterizers (lavapipe, llvmpipe): a thread per row, no workgroup barriers; X shared
    /// through subgroups where the device has them. Eight rows make one 256-bit SIMD row; a
    /// workgroup of eight such rows costs less per row than one (the decode products timed
    /// alone on lavapipe: 1.9-2.0 GB/s of weights with 8 rows per workgroup, 2.1-2.2 GB/s with
    /// 64), and splitting a row across lanes was twice as slow (X is then gathered per lane
    /// instead of shared). In decode 32 threads walk the 64 rows, two each, so that each load
    /// of X and of the norm weights serves two rows, and Q4_1 and Q8_0 rows are read four
    /// words a load, each load two 64-bit words where the device has them (`bench layouts`
    /// times these against one and four rows a thread, word loads and 32-bit loads side by
    /// side; BENCHMARKS §1 has the figures). Each thread touches every cache line
    /// of the first 4 KiB of each of its rows before streaming them: the 64 rows of a workgroup
    /// are too many short streams for the hardware prefetchers, and the touches let their
    /// misses overlap (`bench layouts` decodes with and without them). The one-dispatch Q/K/V
    /// products, which also load the norm weights for every block, walk four rows a thread.
    /// Prefill products walk two rows a thread, half the workgroup apart: a token's X then
    /// costs a load per two rows (a 943-token prefill took 0.86x the time of one row a thread).
    pub const CPU: Self = Self {
        rows_per_wg: 64,
        tpr: 1,
        share_x: true,
        rows_per_lane: 2,
        load_words: 4,
        load64: true,
        touch_bytes: 4096,
        multi_rows_per_lane: 4,
        prefill_rows_per_lane: 2,
    };
    /// [`Self::CPU`] without subgroup operations (what adapters without them run).
    pub const CPU_PLAIN: Self = Self {
        share_x: false,
        ..Self::CPU
    };
}
