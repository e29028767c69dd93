//! Offline what-if of expert-cache policies on route traces (bmoe's own
//! and the reference engine's): the trace's loads are replayed through a
//! byte-budgeted cache of (layer, expert) entries under one policy, and the
//! hits, bytes read and per-layer hits come out.
//!
//! `lru` follows the live cache's accounting exactly (`moe::store`): one
//! load per layer per decode call, experts looked up once per load in row
//! order, every row's use refreshing recency, misses admitted, then
//! eviction down to the budget sparing the experts of the load in flight.
//! On a trace bmoe recorded, its hits equal the trace's `residency` column
//! row for row (`tests/replay.rs`). The other policies share everything but
//! the choice of victim: `decay` (the live default, `moe::evict`: fewest
//! decayed uses, time counted in loads per routed layer like the live
//! store, so it too equals the live cache row for row), `lfu` (fewest
//! uses, then least recent), `lru2` (LRU-K with K = 2: oldest
//! second-to-last use), `popular` (offline: fewest loads over the whole
//! trace, the bound for any policy that ranks experts by popularity),
//! `foresight` (offline: `decay`, but it never evicts an expert that one of
//! the next N loads uses, one token's worth unless `foresight:N` says; the
//! bound for a live policy that knew the routing N layers ahead, what the
//! router prediction guesses a layer or two deep), and `belady` (next use
//! farthest in the future; the offline optimum for equal-sized entries, the
//! bound the others are measured against).

use std::collections::{BTreeSet, HashMap};

use crate::moe::evict::{CachePolicy, DecayedCount, EvictionKey, EvictionOrder};
use crate::telemetry::trace::TraceRow;

/// A cache policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Least recently used (a live policy).
    Lru,
    /// Fewest decayed uses (the live default).
    Decay,
    /// Least frequently used, ties by least recent.
    Lfu,
    /// LRU-2: the entry whose second-to-last use is oldest.
    Lru2,
    /// Offline reference: the entry the whole trace loads least often,
    /// ties by least recent. It knows every expert's popularity in advance
    /// but not the order of use: the best a policy ranking experts by how
    /// often they are used can do.
    Popular,
    /// Offline reference: `Decay`, but an expert that one of the next N
    /// loads uses is never the victim while another is (N = 0: as many
    /// loads as there are routed layers, one token's worth). The bound for
    /// a live policy that knew the routing N layers ahead.
    Foresight(u32),
    /// Belady's optimum: the entry used again farthest in the future.
    Belady,
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 7] =
        [Policy::Lru, Policy::Decay, Policy::Lfu, Policy::Lru2, Policy::Popular, Policy::Foresight(0), Policy::Belady];

    /// Its name: `foresight` with its horizon as `foresight:N` unless it
    /// is one token's worth.
    pub fn name(self) -> String {
        match self {
            Policy::Lru => "lru".into(),
            Policy::Decay => "decay".into(),
            Policy::Lfu => "lfu".into(),
            Policy::Lru2 => "lru2".into(),
            Policy::Popular => "popular".into(),
            Policy::Foresight(0) => "foresight".into(),
            Policy::Foresight(n) => format!("foresight:{n}"),
            Policy::Belady => "belady".into(),
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Policy, String> {
        if let Some(n) = s.strip_prefix("foresight:") {
            return match n.parse::<u32>() {
                Ok(n) if n > 0 => Ok(Policy::Foresight(n)),
                _ => Err(format!("`{s}`: foresight:N takes a number of loads ahead, at least 1")),
            };
        }
        Policy::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            format!("unknown cache policy `{s}`: lru, decay, lfu, lru2, popular, foresight[:N] or belady")
        })
    }
}

/// One load: the routed (non-dropped) rows of one layer in one decode call.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    /// Decode (true) or prefill.
    pub decode: bool,
    /// Layer.
    pub layer: u32,
    /// Experts in row order (duplicates across tokens included).
    pub experts: Vec<u32>,
    /// The trace's own hit flag of each row (bmoe's traces; the
    /// reference's may not carry one).
    pub recorded_hits: Vec<bool>,
}

/// A parsed route trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Experts per layer.
    pub n_expert: usize,
    /// Experts per token.
    pub k: usize,
    /// Bytes of one expert of each layer (from the header).
    pub expert_bytes: HashMap<u32, u64>,
    /// The loads in order.
    pub loads: Vec<Load>,
}

impl Trace {
    /// Parses a route trace (`telemetry::trace::parse`) and groups its rows
    /// into loads: a new load when the layer, turn or phase changes, or a
    /// decode row moves to another position (the next decode call). Dropped
    /// rows load nothing and are left out.
    pub fn parse(text: &str) -> Result<Trace, String> {
        let parsed = crate::telemetry::trace::parse(text)?;
        let mut loads: Vec<Load> = Vec::new();
        let mut prev: Option<&TraceRow> = None;
        for r in &parsed.rows {
            let same = prev.is_some_and(|p| {
                p.turn == r.turn && p.phase == r.phase && p.layer == r.layer && (r.phase == 0 || p.step == r.step)
            });
            if !same {
                loads.push(Load {
                    decode: r.phase == 1,
                    layer: r.layer,
                    experts: Vec::new(),
                    recorded_hits: Vec::new(),
                });
            }
            prev = Some(r);
            if !r.dropped {
                let load = loads.last_mut().expect("pushed above");
                load.experts.push(r.expert);
                load.recorded_hits.push(r.hit);
            }
        }
        if loads.is_empty() {
            return Err("the trace has no routing rows".into());
        }
        Ok(Trace { n_expert: parsed.n_expert, k: parsed.k, expert_bytes: parsed.expert_bytes, loads })
    }

    /// Bytes of all experts of every layer the trace routes.
    pub fn bank_bytes(&self) -> u64 {
        let layers: BTreeSet<u32> = self.loads.iter().map(|l| l.layer).collect();
        layers.iter().map(|l| self.entry_bytes(*l)).sum::<u64>() * self.n_expert as u64
    }

    /// Decoded tokens: decode loads of the first layer routed in decode.
    pub fn decode_tokens(&self) -> usize {
        let Some(first) = self.loads.iter().filter(|l| l.decode).map(|l| l.layer).min() else { return 0 };
        self.loads.iter().filter(|l| l.decode && l.layer == first).count()
    }

    /// Bytes of one entry of `layer` (1 when the header does not say, so
    /// budgets then count entries).
    pub fn entry_bytes(&self, layer: u32) -> u64 {
        self.expert_bytes.get(&layer).copied().unwrap_or(1)
    }
}

/// What a replay found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplayResult {
    /// Lookups (distinct experts per load) during decode.
    pub decode_lookups: u64,
    /// Of those, hits.
    pub decode_hits: u64,
    /// Lookups during prefill.
    pub prefill_lookups: u64,
    /// Of those, hits.
    pub prefill_hits: u64,
    /// Bytes read for misses during decode.
    pub decode_bytes: u64,
    /// Bytes read for misses during prefill.
    pub prefill_bytes: u64,
    /// Entries evicted.
    pub evictions: u64,
    /// Per layer: (layer, decode lookups, decode hits).
    pub per_layer: Vec<(u32, u64, u64)>,
    /// Per row, in trace order (dropped rows left out): hit or not.
    pub row_hits: Vec<bool>,
}

impl ReplayResult {
    /// Decode hit rate, 0..1 (0 without lookups).
    pub fn decode_hit_rate(&self) -> f64 {
        self.decode_hits as f64 / self.decode_lookups.max(1) as f64
    }
}

/// One cache entry's state.
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    resident: bool,
    last: u64,
    second_last: u64,
    uses: u64,
    /// The load that last used it (protects it from eviction in that load).
    load: u64,
    /// Access index of its next use (Belady and Foresight only).
    next_use: u64,
    /// Decayed uses, one per load.
    decayed: DecayedCount,
}

/// Replays `trace` through a cache of `budget` bytes under `policy`.
pub fn replay(trace: &Trace, budget: u64, policy: Policy) -> ReplayResult {
    let n = trace.n_expert;
    let id_of = |layer: u32, e: u32| layer as usize * n + e as usize;
    let max_layer = trace.loads.iter().map(|l| l.layer).max().unwrap_or(0) as usize;
    let mut entries = vec![Entry::default(); (max_layer + 1) * n];
    // Belady and Foresight: the access index of each access's next use of
    // the same entry.
    let knows_future = matches!(policy, Policy::Belady | Policy::Foresight(_));
    let next_use = if knows_future { next_uses(trace, &id_of) } else { Vec::new() };
    // Foresight: the access index where each load starts.
    let load_starts: Vec<u64> = std::iter::once(0)
        .chain(trace.loads.iter().scan(0u64, |at, l| {
            *at += l.experts.len() as u64;
            Some(*at)
        }))
        .collect();
    // Popular: the loads of each entry over the whole trace.
    let mut popularity = vec![0u64; entries.len()];
    if policy == Policy::Popular {
        for load in &trace.loads {
            let mut experts = load.experts.clone();
            experts.sort_unstable();
            experts.dedup();
            experts.iter().for_each(|&e| popularity[id_of(load.layer, e)] += 1);
        }
    }
    let mut order = EvictionOrder::new(entries.len());
    // The live store's clock: loads so far per routed layer, in decode steps.
    let n_layers = trace.loads.iter().map(|l| l.layer).collect::<BTreeSet<_>>().len().max(1) as f64;
    let mut resident_bytes = 0u64;
    let mut clock = 0u64;
    let mut per_layer: HashMap<u32, (u64, u64)> = HashMap::new();
    let mut out = ReplayResult::default();
    for (load_no, load) in trace.loads.iter().enumerate() {
        let load_id = load_no as u64 + 1;
        // Foresight: the first access it does not see.
        let foresight_end = match policy {
            Policy::Foresight(n) => {
                let ahead = if n == 0 { n_layers as usize } else { n as usize };
                load_starts[(load_no + 1 + ahead).min(trace.loads.len())]
            }
            _ => 0,
        };
        let now = load_no as f64 / n_layers;
        let bytes = trace.entry_bytes(load.layer);
        let mut first_flags: HashMap<u32, bool> = HashMap::new();
        for &e in &load.experts {
            let id = id_of(load.layer, e);
            clock += 1;
            let entry = &mut entries[id];
            let first = entry.load != load_id;
            let hit = entry.resident;
            if first {
                // Looked up once per load: hits and misses count here.
                let (lookups, hits) = match load.decode {
                    true => (&mut out.decode_lookups, &mut out.decode_hits),
                    false => (&mut out.prefill_lookups, &mut out.prefill_hits),
                };
                *lookups += 1;
                *hits += u64::from(hit);
                if load.decode {
                    let l = per_layer.entry(load.layer).or_default();
                    l.0 += 1;
                    l.1 += u64::from(hit);
                }
                entry.decayed.add_use(now);
                if !hit {
                    entry.resident = true;
                    resident_bytes += bytes;
                    *if load.decode { &mut out.decode_bytes } else { &mut out.prefill_bytes } += bytes;
                }
            }
            // Every row of an expert reports the state before the load, like
            // the live trace: a repeated row repeats the first row's flag.
            if first {
                first_flags.insert(e, hit);
            }
            out.row_hits.push(first_flags[&e]);
            entry.load = load_id;
            if entry.last != 0 {
                entry.second_last = entry.last;
            }
            entry.last = clock;
            entry.uses += 1;
            if knows_future {
                entry.next_use = next_use[clock as usize - 1];
            }
            let key: EvictionKey = match policy {
                Policy::Lru => CachePolicy::Lru.key(&entry.decayed, entry.last),
                Policy::Decay | Policy::Foresight(_) => CachePolicy::Decay.key(&entry.decayed, entry.last),
                Policy::Lfu => (entry.uses, entry.last),
                Policy::Lru2 => (entry.second_last, entry.last),
                Policy::Popular => (popularity[id], entry.last),
                Policy::Belady => (u64::MAX - entry.next_use, 0),
            };
            order.set(id as u32, key);
        }
        // Evict down to the budget, sparing this load's experts.
        while resident_bytes > budget {
            let in_load = |id: u32| entries[id as usize].load == load_id;
            let foreseen = |id: u32| in_load(id) || entries[id as usize].next_use < foresight_end;
            let Some(id) = order.victim(foreseen).or_else(|| order.victim(in_load)) else { break };
            order.remove(id);
            entries[id as usize].resident = false;
            resident_bytes -= trace.entry_bytes(id / n as u32);
            out.evictions += 1;
        }
    }
    let mut layers: Vec<(u32, u64, u64)> = per_layer.into_iter().map(|(l, (a, h))| (l, a, h)).collect();
    layers.sort_unstable();
    out.per_layer = layers;
    out
}

/// For each access (in order), the index of the next access to the same
/// entry (u64::MAX when none).
fn next_uses(trace: &Trace, id_of: &dyn Fn(u32, u32) -> usize) -> Vec<u64> {
    let accesses: Vec<usize> =
        trace.loads.iter().flat_map(|l| l.experts.iter().map(move |&e| id_of(l.layer, e))).collect();
    let mut next = vec![u64::MAX; accesses.len()];
    let mut seen: HashMap<usize, u64> = HashMap::new();
    for (i, id) in accesses.iter().enumerate().rev() {
        if let Some(&j) = seen.get(id) {
            next[i] = j;
        }
        seen.insert(*id, i as u64);
    }
    next
}
