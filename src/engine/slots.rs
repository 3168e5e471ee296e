//! The layer slots on the device: their buffers, where each buffer sits within a page of host
//! memory (for direct reads straight into mapped slots), and each streamed layer's matrices
//! placed in its slot as `plan.slot` lays them out.

use std::sync::Arc;

use crate::gpu::{GpuBuffer, GpuContext};
use crate::plan::ExecPlan;

use super::EngineError;
use super::layers::Mats;

/// Per slot, its buffers; their mapped addresses modulo a page (None: not needed or unknown);
/// per streamed layer (in order), its matrices in slot `i % slots`.
pub(super) type LayerSlots = (Vec<Vec<Arc<GpuBuffer>>>, Vec<Vec<Option<u64>>>, Vec<Mats>);

/// Allocate `plan`'s layer slots (mappable when streamed weights are written `in_place`) and
/// place each of the `streamed` layers in its slot; with `direct` reads into mapped slots, each
/// part goes where a read of its file range lands without a bounce buffer.
pub(super) fn layer_slots(
    ctx: &GpuContext,
    plan: &ExecPlan,
    streamed: &[usize],
    in_place: bool,
    direct: bool,
) -> Result<LayerSlots, EngineError> {
    // Each slot has room for any layer; every streamed layer sees its slot through its own
    // layout (its weight types may differ from the other layers').
    let mut slot_bufs: Vec<Vec<Arc<GpuBuffer>>> = Vec::new();
    if !streamed.is_empty() {
        for s in 0..plan.placement.slots {
            let mut bufs = Vec::with_capacity(plan.slot.buffers.len());
            for (i, &b) in plan.slot.buffers.iter().enumerate() {
                let name = format!("slot{s}[{i}]");
                let buf = if in_place {
                    ctx.mappable_storage(&name, b)?
                } else {
                    ctx.storage(&name, b)?
                };
                bufs.push(Arc::new(buf));
            }
            slot_bufs.push(bufs);
        }
    }
    let mut slot_bases: Vec<Vec<Option<u64>>> = Vec::with_capacity(slot_bufs.len());
    for bufs in &slot_bufs {
        let mut bases = Vec::with_capacity(bufs.len());
        for b in bufs {
            bases.push(if direct {
                Some(ctx.mapped_offset(b, crate::plan::slots::PAGE)?)
            } else {
                None
            });
        }
        slot_bases.push(bases);
    }
    let mut stream_mats = Vec::with_capacity(streamed.len());
    for (si, &l) in streamed.iter().enumerate() {
        let lw = &plan.layers[l];
        let s = si % slot_bufs.len().max(1);
        let (Some(bufs), Some(bases)) = (slot_bufs.get(s), slot_bases.get(s)) else {
            return Err(EngineError::MissingTensor("a layer slot".into()));
        };
        let mut m = Vec::with_capacity(lw.files.len());
        if plan.slot.span {
            // The layer as it lies in the file, placed as its first byte sits within a page.
            let Some((start, len)) = crate::plan::slots::layer_span(lw, plan.slot.align) else {
                return Err(EngineError::PlanMismatch(format!(
                    "it reads layer {l} as one run of the file, which the layer is not"
                )));
            };
            let whole = crate::plan::slots::Region {
                buffer: 0,
                start: 0,
                size: plan.slot.buffers.first().copied().unwrap_or(0),
            };
            let at = plan.slot.place(whole, len, start, bases[0]);
            for (t, lay) in lw.files.iter().zip(&lw.layouts) {
                let offset = at + (t.offset - start);
                m.push(lay.placed(&t.name, vec![(bufs[0].clone(), offset)])?);
            }
            stream_mats.push(Mats::new(lw.roles.clone(), m)?);
            continue;
        }
        for ((t, lay), regions) in lw.files.iter().zip(&lw.layouts).zip(&plan.slot.regions) {
            let mut at = Vec::with_capacity(lay.parts.len());
            for (&(r0, n), r) in lay.parts.iter().zip(regions) {
                let len = n as u64 * lay.row_bytes as u64;
                let file = t.offset + r0 as u64 * lay.row_bytes as u64;
                let offset = plan.slot.place(*r, len, file, bases[r.buffer]);
                at.push((bufs[r.buffer].clone(), offset));
            }
            m.push(lay.placed(&t.name, at)?);
        }
        stream_mats.push(Mats::new(lw.roles.clone(), m)?);
    }
    Ok((slot_bufs, slot_bases, stream_mats))
}
