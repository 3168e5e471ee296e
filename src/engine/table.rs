//! The page table's host copy: a pass writes each layer's part of the table as it goes, into
//! the copy, and every submission first writes the range changed since the last one to the
//! device in one go (each `write_buffer` allocates a staging chunk; two a layer cost the host
//! more than one a submission).

use super::Engine;
use super::pass::RoundWork;

impl Engine {
    /// Layer `l`'s part of the page table for round `w` (`last`: the layer's last round;
    /// `n_full`: pages the scores cover).
    pub(super) fn write_table(&mut self, l: usize, w: &RoundWork, last: bool, n_full: u32) {
        let words = [
            w.round.first_split,
            (w.round.first_split == 0) as u32 | if last { 2 } else { 0 },
            w.round.splits,
            n_full,
        ];
        let base = l * self.plan.kv.layer_words as usize;
        self.table_write(base, &words);
        let mut lw = Vec::new();
        for (seq, list) in &w.lists {
            lw.clear();
            list.words(&mut lw);
            self.table_write(
                base + 4 + *seq as usize * self.plan.kv.seq_stride as usize,
                &lw,
            );
        }
    }

    /// Write `words` at word `at` of the page table: into the host's copy, to reach the device
    /// with the next submission (`flush_table`). A pass writes each layer's part; one write
    /// per submission spares the device queue a staging allocation per part.
    pub(super) fn table_write(&mut self, at: usize, words: &[u32]) {
        let end = at + words.len();
        // Unchanged words need no write (a decode step mostly rewrites what the step before
        // wrote): the device holds the copy, or will once the pending range is written.
        if self.table_mirror[at..end] == *words {
            return;
        }
        self.table_mirror[at..end].copy_from_slice(words);
        self.table_dirty = Some(match self.table_dirty {
            Some((a, b)) => (a.min(at), b.max(end)),
            None => (at, end),
        });
    }

    /// Write the page-table words changed since the last submission to the device.
    pub(super) fn flush_table(&mut self) {
        if let Some((a, b)) = self.table_dirty.take() {
            self.table_flushes += 1;
            self.ctx.write(
                &self.kvb.table,
                a as u64 * 4,
                bytemuck::cast_slice(&self.table_mirror[a..b]),
            );
        }
    }
}
