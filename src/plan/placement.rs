//! The placement policy: from the device-memory budget, decide what stays resident on the GPU
//! and what streams from flash every token.
//!
//! Fixed costs come first (KV cache, activations, norms, kernel parameters). If every weight
//! fits beside them, everything is resident and no staging memory is needed. Otherwise the
//! streaming machinery is reserved — the staging ring, `prefetch + 1` layer slots (layer L
//! computes in one while L+1.. are read into the others) and, unless the output head streams
//! through the layer slots, two output-head chunk slots — and the remaining bytes hold whole
//! layers resident, first to last, then the output head.

use std::fmt;

use thiserror::Error;

/// Sizes of everything the engine allocates, in device bytes.
#[derive(Debug, Clone, Default)]
pub struct Costs {
    pub kv: u64,
    pub activations: u64,
    pub norms: u64,
    pub params: u64,
    pub ring: u64,
    /// One layer slot: room for any layer's matrices (their largest part each).
    pub layer: u64,
    /// Each layer's matrices resident (empty: `layer` each).
    pub layers: Vec<u64>,
    pub head: u64,
    /// One output-head chunk slot.
    pub head_chunk: u64,
    /// A streaming head goes through the layer slots while some layer streams (then it needs no
    /// chunk slots of its own).
    pub head_in_slots: bool,
    /// Bytes everything-resident needs beyond the weights and fixed costs (the staging ring,
    /// when the KV cache must page to flash even with every weight resident).
    pub resident_extra: u64,
}

/// What the engine was asked to keep resident (`--resident`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ResidentSpec {
    /// Let the policy decide from the budget.
    #[default]
    Auto,
    /// Everything resident.
    All,
    /// Exactly these layers, and the head when `head` is set.
    List { layers: Vec<usize>, head: bool },
}

impl ResidentSpec {
    /// "auto", "all", "none", or a comma list of "head", "L" and "L-M".
    pub fn parse(s: &str, n_layers: usize) -> Result<Self, String> {
        match s.trim() {
            "auto" => return Ok(Self::Auto),
            "all" => return Ok(Self::All),
            "none" => {
                return Ok(Self::List {
                    layers: vec![],
                    head: false,
                });
            }
            _ => {}
        }
        let mut layers = Vec::new();
        let mut head = false;
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            if item == "head" {
                head = true;
                continue;
            }
            let (a, b) = match item.split_once('-') {
                Some((a, b)) => (a, b),
                None => (item, item),
            };
            let parse = |v: &str| {
                v.trim().parse::<usize>().map_err(|_| {
                    format!("--resident: {item:?} is not a layer, a range or \"head\"")
                })
            };
            let (a, b) = (parse(a)?, parse(b)?);
            if a > b || b >= n_layers {
                return Err(format!(
                    "--resident: layers {item} are outside 0-{}",
                    n_layers.saturating_sub(1)
                ));
            }
            layers.extend(a..=b);
        }
        layers.sort_unstable();
        layers.dedup();
        Ok(Self::List { layers, head })
    }
}

/// The chosen placement.
#[derive(Debug, Clone)]
pub struct Placement {
    pub budget: u64,
    pub costs: Costs,
    pub resident_layers: Vec<bool>,
    pub head_resident: bool,
    /// Layer slots for streamed layers (0 when nothing streams).
    pub slots: usize,
    /// True when anything streams (the ring is allocated).
    pub streaming: bool,
    /// Total device bytes the plan reserves.
    pub total: u64,
}

#[derive(Debug, Error)]
pub enum PlacementError {
    #[error(
        "device-memory budget of {budget} bytes is below the minimum of {minimum} bytes this model needs ({breakdown})"
    )]
    TooSmall {
        budget: u64,
        minimum: u64,
        breakdown: String,
    },
    #[error(
        "--resident asks for {wanted} bytes of resident weights but the budget leaves {left} bytes after the fixed costs ({breakdown})"
    )]
    ResidentTooLarge {
        wanted: u64,
        left: u64,
        breakdown: String,
    },
}

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / 1048576.0)
}

impl Costs {
    /// Device bytes of layer `l` resident.
    fn layer_bytes(&self, l: usize) -> u64 {
        self.layers.get(l).copied().unwrap_or(self.layer)
    }
    fn layers_bytes(&self, layers: impl Iterator<Item = usize>) -> u64 {
        layers.map(|l| self.layer_bytes(l)).sum()
    }
    fn fixed(&self) -> u64 {
        self.kv + self.activations + self.norms + self.params
    }
    /// Bytes of a streaming head's chunk slots with `n_streamed` layers streaming.
    fn head_chunks(&self, n_streamed: usize) -> u64 {
        if self.head_in_slots && n_streamed > 0 {
            0
        } else {
            2 * self.head_chunk
        }
    }
    /// The least that streams: every layer through the slots.
    fn streaming_minimum(&self, slots: usize) -> u64 {
        self.fixed() + self.ring + slots as u64 * self.layer + self.head_chunks(slots.max(1))
    }
    fn breakdown(&self, slots: usize) -> String {
        if slots == 0 {
            return format!(
                "KV cache {}, activations {}, norms {}, kernel parameters {}, weights {}",
                mib(self.kv),
                mib(self.activations),
                mib(self.norms),
                mib(self.params),
                mib(self.head)
            );
        }
        let head = if self.head_in_slots {
            "the output head through the layer slots".to_string()
        } else {
            format!("2 output-head chunks {}", mib(2 * self.head_chunk))
        };
        format!(
            "KV cache {}, activations {}, norms {}, kernel parameters {}, staging ring {}, {slots} layer slots {}, {head}",
            mib(self.kv),
            mib(self.activations),
            mib(self.norms),
            mib(self.params),
            mib(self.ring),
            mib(slots as u64 * self.layer),
        )
    }
}

/// Decide the placement for `n_layers` layers under `budget` with `slots` layer slots.
pub fn plan(
    costs: Costs,
    n_layers: usize,
    budget: u64,
    slots: usize,
    spec: &ResidentSpec,
) -> Result<Placement, PlacementError> {
    let all_layers = costs.layers_bytes(0..n_layers);
    let all = costs.fixed() + all_layers + costs.head + costs.resident_extra;
    let everything = |costs: Costs| Placement {
        budget,
        total: all,
        costs,
        resident_layers: vec![true; n_layers],
        head_resident: true,
        slots: 0,
        streaming: false,
    };
    if *spec == ResidentSpec::All || (*spec == ResidentSpec::Auto && all <= budget) {
        if all > budget {
            return Err(PlacementError::ResidentTooLarge {
                wanted: all_layers + costs.head,
                left: budget.saturating_sub(costs.fixed()),
                breakdown: costs.breakdown(0),
            });
        }
        return Ok(everything(costs));
    }
    let minimum = costs.streaming_minimum(slots);
    if minimum > budget {
        // Streaming cannot start; state the least that runs, streaming or not.
        let (minimum, breakdown) = if all < minimum {
            (
                all,
                format!(
                    "everything resident: {}; streaming would need {}",
                    costs.breakdown(0),
                    mib(minimum)
                ),
            )
        } else {
            (minimum, costs.breakdown(slots))
        };
        return Err(PlacementError::TooSmall {
            budget,
            minimum,
            breakdown,
        });
    }
    let mut left = budget - minimum;
    let (resident_layers, head_resident) = match spec {
        ResidentSpec::List { layers, head } => {
            let mut r = vec![false; n_layers];
            for &l in layers {
                r[l] = true;
            }
            let n_streamed = r.iter().filter(|&&x| !x).count();
            let wanted = costs.layers_bytes((0..n_layers).filter(|&l| r[l]))
                + if *head {
                    costs.head
                } else {
                    // No layer streams: the head needs chunk slots of its own.
                    costs.head_chunks(n_streamed) - costs.head_chunks(slots.max(1))
                };
            if wanted > left {
                return Err(PlacementError::ResidentTooLarge {
                    wanted,
                    left,
                    breakdown: costs.breakdown(slots),
                });
            }
            (r, *head)
        }
        _ => {
            let mut r = vec![false; n_layers];
            for (l, slot) in r.iter_mut().enumerate() {
                let b = costs.layer_bytes(l);
                if b <= left {
                    *slot = true;
                    left -= b;
                }
            }
            let head = costs.head <= left;
            (r, head)
        }
    };
    let mut resident_layers = resident_layers;
    let n_streamed = resident_layers.iter().filter(|&&r| !r).count();
    let total_for = |resident: &[bool], used_slots: usize| {
        let n_streamed = resident.iter().filter(|&&r| !r).count();
        costs.fixed()
            + costs.ring
            + used_slots as u64 * costs.layer
            + if head_resident {
                costs.head
            } else {
                costs.head_chunks(n_streamed)
            }
            + costs.layers_bytes((0..n_layers).filter(|&l| resident[l]))
    };
    if n_streamed <= slots && *spec == ResidentSpec::Auto {
        // A slot for every streamed layer: keep them there instead of re-reading each token
        // (when a streaming head then fits chunk slots of its own).
        if head_resident {
            return Ok(everything(costs));
        }
        let all = vec![true; n_layers];
        if total_for(&all, 0) <= budget {
            resident_layers = all;
        } else if n_streamed == 0 {
            // Every layer fits but the head and its chunk slots do not: the last layer streams
            // (in the slot reserved for it) and the head streams through that slot.
            if let Some(last) = resident_layers.iter().rposition(|&r| r) {
                resident_layers[last] = false;
            }
        }
    }
    let n_streamed = resident_layers.iter().filter(|&&r| !r).count();
    let used_slots = slots.min(n_streamed);
    let total = total_for(&resident_layers, used_slots);
    Ok(Placement {
        budget,
        costs,
        resident_layers,
        head_resident,
        slots: used_slots,
        streaming: true,
        total,
    })
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.resident_layers.len();
        let res: Vec<usize> = (0..n).filter(|&l| self.resident_layers[l]).collect();
        let budget = if self.budget == u64::MAX {
            "adapter limit".to_string()
        } else {
            mib(self.budget)
        };
        write!(f, "placement (budget {budget}, plan {}): ", mib(self.total))?;
        if !self.streaming {
            return write!(f, "all {n} layers and the output head resident");
        }
        let ranges = compress(&res);
        write!(
            f,
            "{} of {n} layers resident{}, {} streamed through {} slots; output head {}; staging ring {}",
            res.len(),
            if ranges.is_empty() {
                String::new()
            } else {
                format!(" ({ranges})")
            },
            n - res.len(),
            self.slots,
            if self.head_resident {
                "resident"
            } else if self.costs.head_in_slots && self.slots > 0 {
                "streamed in chunks through the layer slots"
            } else {
                "streamed in chunks"
            },
            mib(self.costs.ring)
        )
    }
}

fn compress(v: &[usize]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs() -> Costs {
        Costs {
            kv: 1000,
            activations: 100,
            norms: 10,
            params: 10,
            ring: 200,
            layer: 500,
            layers: vec![],
            head: 3000,
            head_chunk: 100,
            head_in_slots: false,
            resident_extra: 0,
        }
    }

    #[test]
    fn layers_of_different_sizes_count_their_own_bytes() {
        // Slots hold the largest layer; resident layers cost what they hold.
        let c = Costs {
            layers: vec![300, 500, 200, 450],
            ..costs()
        };
        let fixed = 1000 + 100 + 10 + 10;
        let all = plan(c.clone(), 4, u64::MAX, 2, &ResidentSpec::Auto).unwrap();
        assert_eq!(all.total, fixed + 1450 + 3000);
        // Streaming minimum (ring, one slot, 2 head chunks) plus 300 + 200: layers 0 and 2 fit,
        // 1 and 3 stream.
        let min = fixed + 200 + 500 + 200;
        let p = plan(c, 4, min + 500, 1, &ResidentSpec::Auto).unwrap();
        assert_eq!(p.resident_layers, vec![true, false, true, false]);
        assert_eq!(p.total, min + 500);
    }

    #[test]
    fn everything_fits() {
        let p = plan(costs(), 4, 1_000_000, 2, &ResidentSpec::Auto).unwrap();
        assert!(!p.streaming && p.head_resident && p.resident_layers.iter().all(|&r| r));
        assert_eq!(p.total, 1120 + 2000 + 3000);
    }

    #[test]
    fn minimum_and_error() {
        let min = 1120 + 200 + 2 * 500 + 200;
        let p = plan(costs(), 4, min, 2, &ResidentSpec::Auto).unwrap();
        assert!(p.streaming && !p.head_resident && p.resident_layers.iter().all(|&r| !r));
        assert!(p.total <= min);
        let e = plan(costs(), 4, min - 1, 2, &ResidentSpec::Auto).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(&min.to_string()) && msg.contains("KV cache"),
            "{msg}"
        );
    }

    #[test]
    fn fills_layers_then_head() {
        let min = 1120 + 200 + 2 * 500 + 200;
        let p = plan(costs(), 6, min + 1000, 2, &ResidentSpec::Auto).unwrap();
        assert_eq!(
            p.resident_layers,
            vec![true, true, false, false, false, false]
        );
        assert!(!p.head_resident);
        assert!(p.total <= p.budget);
    }

    #[test]
    fn slots_for_every_streamed_layer_become_resident() {
        // Budget for the minimum plus one more layer: 4 layers, 2 resident + 2 slots.
        let min = 1120 + 200 + 2 * 500 + 200;
        let p = plan(costs(), 4, min + 1000, 2, &ResidentSpec::Auto).unwrap();
        assert!(p.resident_layers.iter().all(|&r| r), "{p}");
        assert!(p.streaming && !p.head_resident && p.slots == 0);
        assert!(p.total <= p.budget);
    }

    #[test]
    fn head_through_the_layer_slots_needs_no_chunk_slots() {
        let c = Costs {
            head_in_slots: true,
            ..costs()
        };
        // The minimum: the ring and two slots, no head chunks.
        let min = 1120 + 200 + 2 * 500;
        let p = plan(c.clone(), 4, min, 2, &ResidentSpec::Auto).unwrap();
        assert!(p.streaming && !p.head_resident && p.slots == 2);
        assert_eq!(p.total, min);
        assert!(plan(c.clone(), 4, min - 1, 2, &ResidentSpec::Auto).is_err());
        // Room for two layers more: 2 resident, 2 streamed. Making those 2 resident would
        // leave the head no slot to stream through, and its own chunk slots do not fit.
        let p = plan(c.clone(), 4, min + 1000, 2, &ResidentSpec::Auto).unwrap();
        assert_eq!(p.resident_layers, vec![true, true, false, false]);
        assert_eq!((p.slots, p.total), (2, min + 1000));
        // With room for the head's own chunk slots too, every layer stays resident.
        let p = plan(c.clone(), 4, min + 1000 + 200, 2, &ResidentSpec::Auto).unwrap();
        assert!(p.resident_layers.iter().all(|&r| r) && p.slots == 0 && !p.head_resident);
        assert_eq!(p.total, 1120 + 200 + 2000 + 200);
        // Every layer listed resident, head streamed: chunk slots of its own, in the budget.
        let spec = ResidentSpec::parse("0-3", 4).unwrap();
        let e = plan(c.clone(), 4, 1120 + 200 + 2 * 500 + 2000, 2, &spec).unwrap_err();
        assert!(matches!(e, PlacementError::ResidentTooLarge { .. }), "{e}");
        let p = plan(c, 4, 1120 + 200 + 2 * 500 + 2000 + 200, 2, &spec).unwrap();
        assert!(p.resident_layers.iter().all(|&r| r) && !p.head_resident);
    }

    #[test]
    fn spec_parsing_and_override() {
        assert_eq!(
            ResidentSpec::parse("0-2,head,5", 8).unwrap(),
            ResidentSpec::List {
                layers: vec![0, 1, 2, 5],
                head: true
            }
        );
        assert!(ResidentSpec::parse("9", 8).is_err());
        assert!(ResidentSpec::parse("x", 8).is_err());
        let spec = ResidentSpec::parse("none", 4).unwrap();
        let p = plan(costs(), 4, 1_000_000, 2, &spec).unwrap();
        assert!(p.streaming && p.resident_layers.iter().all(|&r| !r) && !p.head_resident);
        let spec = ResidentSpec::parse("0-3,head", 4).unwrap();
        let e = plan(costs(), 4, 3000, 2, &spec).unwrap_err();
        assert!(matches!(e, PlacementError::ResidentTooLarge { .. }));
    }
}
