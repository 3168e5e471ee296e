//! The layer-ahead pipeline of one decode pass, simulated step by step: which reads can run
//! while which layers compute.
//!
//! Rules (as the engine schedules): one I/O thread reads in layer order. The first `slots`
//! streamed layers are queued by the pass before, once its last read is queued (so they read
//! while its last stages compute; the first pass of a run starts idle); layer j + slots is
//! queued once layer j's bytes arrived. Through the staging ring (about one layer of slots), a read also waits until
//! the previous streamed item's copy to the device ran, since its staging slots come back only
//! then; read in place (no ring) it waits instead until the layer that last used its slot
//! computed. The device runs copies and compute in one queue: a streamed layer's copy runs when
//! its bytes are read and the device reaches it, then the layer computes. The output head reads
//! its chunks in the same way, through two chunk slots of its own or through the layer slots
//! (chunk c in slot c mod slots, whichever layer used it last). A staging ring that holds only a share
//! of a layer lets that share be read ahead; the rest waits for slots to come back, which they
//! do once the device has run the compute queued before their copies.

use serde::Serialize;

/// One step of a pass in order: a layer, or the output head.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stage {
    /// Device compute seconds.
    pub compute_s: f64,
    /// Seconds to read its streamed bytes from flash (weights and KV pages; 0 when resident).
    pub read_s: f64,
    /// Seconds of device copies from staging (0 when resident or read in place).
    pub upload_s: f64,
    /// The slot pool it streams through: 0 layer slots, 1 head chunk slots.
    pub pool: usize,
    /// Pieces it is read and computed in (head chunks), each a share of it.
    pub pieces: usize,
    /// Its pieces take the pool's slots from the first again (piece k in slot k mod slots)
    /// instead of going on from the previous stage's.
    pub from_first_slot: bool,
}

/// The simulated pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PassTime {
    /// Seconds from the start of the pass to the end of the last compute.
    pub total_s: f64,
    /// Compute, read and copy seconds added up (what a pass with no overlap would take).
    pub serial_s: f64,
}

/// Simulate a pass over `stages` with `slots` layer slots (`in_place`: reads go straight into
/// the slots, no staging ring), from an idle device and reader.
pub fn simulate(stages: &[Stage], slots: usize, in_place: bool) -> PassTime {
    simulate_ring(stages, slots, in_place, None)
}

/// [`simulate`] with a staging ring that holds `ring_share` (below 1) of a streamed layer
/// (None: a whole layer or more; unused when reads go in place).
pub fn simulate_ring(
    stages: &[Stage],
    slots: usize,
    in_place: bool,
    ring_share: Option<f64>,
) -> PassTime {
    let mut sim = Sim::new(slots, in_place, ring_share);
    sim.pass(stages)
}

/// Passes simulated one after another until a pass takes what the one before it took (at
/// most 8): the time of a pass in a run of decode steps. The next pass's first streamed layers
/// are read while this pass's last stages compute (the engine queues them once its output
/// head has queued its last read), so a pass starts with part of its first reads done.
pub fn simulate_steady(
    stages: &[Stage],
    slots: usize,
    in_place: bool,
    ring_share: Option<f64>,
) -> PassTime {
    let mut sim = Sim::new(slots, in_place, ring_share);
    let mut last = sim.pass(stages);
    for _ in 0..7 {
        let t = sim.pass(stages);
        let same = (t.total_s - last.total_s).abs() <= 1e-9 * t.total_s.max(1e-12);
        last = t;
        if same {
            break;
        }
    }
    last
}

/// The simulated device, reader and slots, carried from one pass to the next.
struct Sim {
    share: Option<f64>,
    in_place: bool,
    pool_slots: [usize; 2],
    gpu: f64,
    io_free: f64,
    /// Per pool: when each streamed item's bytes arrived.
    arrived: [Vec<f64>; 2],
    /// Per pool: the next slot, and when each slot's last item finished computing.
    next_slot: [usize; 2],
    slot_done: [Vec<f64>; 2],
    last_copy: f64,
}

impl Sim {
    fn new(slots: usize, in_place: bool, ring_share: Option<f64>) -> Self {
        let pool_slots = [slots.max(1), 2];
        Self {
            share: ring_share.filter(|_| !in_place).map(|s| s.clamp(0.0, 1.0)),
            in_place,
            pool_slots,
            gpu: 0.0,
            io_free: 0.0,
            arrived: [Vec::new(), Vec::new()],
            next_slot: [0; 2],
            slot_done: [vec![0.0; pool_slots[0]], vec![0.0; pool_slots[1]]],
            last_copy: 0.0,
        }
    }

    /// One pass; its time is from the end of the previous pass's compute (or from 0) to the
    /// end of its own. Each pass puts its first streamed layer in the first slot again.
    fn pass(&mut self, stages: &[Stage]) -> PassTime {
        let begin = self.gpu;
        self.next_slot = [0; 2];
        let mut serial = 0.0;
        for st in stages {
            let n = st.pieces.max(1) as f64;
            serial += st.compute_s + st.read_s + st.upload_s;
            if st.from_first_slot {
                self.next_slot[st.pool.min(1)] = 0;
            }
            for _ in 0..st.pieces.max(1) {
                let (c, r, u) = (st.compute_s / n, st.read_s / n, st.upload_s / n);
                if r > 0.0 || u > 0.0 {
                    self.streamed(st.pool.min(1), c, r, u);
                } else {
                    self.gpu += c;
                }
            }
        }
        PassTime {
            total_s: self.gpu - begin,
            serial_s: serial,
        }
    }

    /// A streamed item of pool `p`: compute `c`, read `r`, copy `u` seconds.
    fn streamed(&mut self, p: usize, c: f64, r: f64, u: f64) {
        let s = self.pool_slots[p];
        let j = self.arrived[p].len();
        let queued = if j >= s { self.arrived[p][j - s] } else { 0.0 };
        let slot = self.next_slot[p] % s;
        self.next_slot[p] += 1;
        let gate = if self.in_place {
            self.slot_done[p][slot]
        } else {
            self.last_copy
        };
        let start = self.io_free.max(queued).max(gate);
        let done = match self.share {
            // What the ring holds is read at once; the rest once the device has run what was
            // queued before (the copies of the first part wait behind it).
            Some(sh) if p == 0 => (start + r * sh).max(self.gpu) + r * (1.0 - sh),
            _ => start + r,
        };
        self.io_free = done;
        self.arrived[p].push(done);
        self.gpu = self.gpu.max(done) + u;
        self.last_copy = self.gpu;
        self.gpu += c;
        self.slot_done[p][slot] = self.gpu;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(c: f64, r: f64, u: f64) -> Stage {
        Stage {
            compute_s: c,
            read_s: r,
            upload_s: u,
            pool: 0,
            pieces: 1,
            from_first_slot: false,
        }
    }

    #[test]
    fn hand_computed_passes() {
        // Resident only: the compute adds up.
        let t = simulate(&[layer(2.0, 0.0, 0.0), layer(3.0, 0.0, 0.0)], 2, false);
        assert_eq!(t.total_s, 5.0);
        assert_eq!(t.serial_s, 5.0);
        // Three streamed layers, read 4, copy 1, compute 2, through the ring: read 0 [0,4],
        // copy [4,5], compute [5,7]; read 1 waits for copy 0: [5,9], copy [9,10], compute
        // [10,12]; read 2 [10,14], copy [14,15], compute [15,17].
        let l = layer(2.0, 4.0, 1.0);
        let t = simulate(&[l.clone(), l.clone(), l.clone()], 2, false);
        assert!((t.total_s - 17.0).abs() < 1e-12, "{t:?}");
        assert!((t.serial_s - 21.0).abs() < 1e-12);
        // In place (no copies), two slots: reads back to back [0,4], [4,8], then read 2 waits
        // for layer 0 to compute (slot reuse): layer 0 computes [4,6], read 2 [8,12];
        // layer 1 [8,10], layer 2 [12,14].
        let l = layer(2.0, 4.0, 0.0);
        let t = simulate(&[l.clone(), l.clone(), l.clone()], 2, true);
        assert!((t.total_s - 14.0).abs() < 1e-12, "{t:?}");
        // Resident layers first, then streamed: the first read overlaps the resident compute
        // (read [0,4] while computing [0,10]); the copy runs after it: [10,11], compute
        // [11,13]; the second read waits for that copy: [11,15], copy [15,16], compute [16,18].
        let t = simulate(
            &[
                layer(10.0, 0.0, 0.0),
                layer(2.0, 4.0, 1.0),
                layer(2.0, 4.0, 1.0),
            ],
            2,
            false,
        );
        assert!((t.total_s - 18.0).abs() < 1e-12, "{t:?}");
        // A head in two chunks through its own slots after one streamed layer: chunk reads
        // follow the layer's copy.
        let head = Stage {
            compute_s: 2.0,
            read_s: 2.0,
            upload_s: 0.0,
            pool: 1,
            pieces: 2,
            from_first_slot: false,
        };
        // layer: read [0,4], copy [4,5], compute [5,7]; chunk 0 read waits for the layer's
        // copy: [5,6], runs [7,8]; chunk 1 read waits for chunk 0's (empty) copy at 7: [7,8],
        // runs [8,9].
        let t = simulate(&[layer(2.0, 4.0, 1.0), head], 2, false);
        assert!((t.total_s - 9.0).abs() < 1e-12, "{t:?}");
        // A ring holding a quarter of a layer, after a resident layer computing [0,10]: the
        // streamed layer reads its first quarter [0,1], the rest once the device is done with
        // the resident layer: [10,13]; copy [13,14], compute [14,16]. With a whole-layer ring
        // the read ends at 4 and the layer computes [11,13].
        let st = [layer(10.0, 0.0, 0.0), layer(2.0, 4.0, 1.0)];
        let t = simulate_ring(&st, 2, false, Some(0.25));
        assert!((t.total_s - 16.0).abs() < 1e-12, "{t:?}");
        assert!((simulate(&st, 2, false).total_s - 13.0).abs() < 1e-12);
        // Read in place, the ring does not carry weights.
        let t = simulate_ring(&st, 2, true, Some(0.25));
        assert!((t.total_s - 13.0).abs() < 1e-12, "{t:?}");
        // A head in two chunks through the layer slots, read in place, after three streamed
        // layers (slots 0, 1, 0; read 4, compute 2): reads [0,4], [4,8], then layer 2 waits
        // for layer 0 (slot 0) to compute [4,6]: [8,12]; layer 1 computes [8,10], layer 2
        // [12,14]. Chunk 0 takes slot 0 again, last used by layer 2: read [14,16], computes
        // [16,17]; chunk 1 takes slot 1 (free since 10) once the reader is: [16,18], [18,19].
        let head_in_slots = Stage {
            compute_s: 2.0,
            read_s: 4.0,
            upload_s: 0.0,
            pool: 0,
            pieces: 2,
            from_first_slot: true,
        };
        let l = layer(2.0, 4.0, 0.0);
        let st = [l.clone(), l.clone(), l.clone(), head_in_slots.clone()];
        let t = simulate(&st, 2, true);
        assert!((t.total_s - 19.0).abs() < 1e-12, "{t:?}");
        // Going on with the rotation instead, chunk 0 would take slot 1 (free since 10) and
        // be read right after layer 2's bytes: [12,14], computed [14,15]; chunk 1 in slot 0
        // after layer 2 computed: [14,16], [16,17].
        let rotating = Stage {
            from_first_slot: false,
            ..head_in_slots
        };
        let t = simulate(&[l.clone(), l.clone(), l, rotating], 2, true);
        assert!((t.total_s - 17.0).abs() < 1e-12, "{t:?}");
    }

    #[test]
    fn hand_computed_steady_passes() {
        // Two streamed layers in place (read 4, compute 2), two slots, a resident head
        // computing 3. From idle: reads [0,4], [4,8]; layers compute [4,6], [8,10], the head
        // [10,13]. The next pass's layer 0 reads once the reader is free and slot 0 is done
        // (at 8): [8,12], computes after the head [13,15]; layer 1 [12,16] (slot 1 free since
        // 10), computes [16,18]; the head [18,21]: 8 a pass (13 to 21), what the reader
        // needs. The pass after that is the same: [16,20] computes [21,23], [20,24] then
        // [24,26], the head [26,29].
        let l = layer(2.0, 4.0, 0.0);
        let head = layer(3.0, 0.0, 0.0);
        let st = [l.clone(), l, head.clone()];
        assert!((simulate(&st, 2, true).total_s - 13.0).abs() < 1e-12);
        let t = simulate_steady(&st, 2, true, None);
        assert!((t.total_s - 8.0).abs() < 1e-12, "{t:?}");
        assert!((t.serial_s - 15.0).abs() < 1e-12);
        // Compute-bound (read 2, compute 5): from idle the first read is a bubble, [0,2],
        // then [2,7], [7,12], head [12,15]. The next pass's layer 0 reads once slot 0 is
        // done (7): [7,9], long before the head ends at 15: layers [15,20], [20,25] (layer
        // 1 read [12,14]), head [25,28]: 13 a pass, the compute alone.
        let l = layer(5.0, 2.0, 0.0);
        let st = [l.clone(), l, head];
        assert!((simulate(&st, 2, true).total_s - 15.0).abs() < 1e-12);
        let t = simulate_steady(&st, 2, true, None);
        assert!((t.total_s - 13.0).abs() < 1e-12, "{t:?}");
    }
}
