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
//!
//! With a route profile learned first ([`Learned`]: from other traces, or
//! from the scored trace's own prompt), `default` is the live default with
//! its prior and duel (`moe::duel`), `prior-decay` the prior always,
//! `prior` the profile's shares alone; a warm start fills the cache with
//! the profile's most routed experts before the first load, its reads
//! counted apart. `least-stale`, `flashmoe`, `fmoe` and `arc` are the
//! published policies for comparison ([`Policy`]).

use std::collections::{BTreeSet, HashMap};

pub mod arc;
pub mod learn;
mod policy;

pub use learn::Learned;
pub use policy::Policy;

use crate::moe::duel::{Duel, prior_victim};
use crate::moe::evict::{CachePolicy, DecayedCount, EvictionKey, EvictionOrder};
use crate::telemetry::trace::TraceRow;

/// One load: the routed (non-dropped) rows of one layer in one decode call.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    /// Decode (true) or prefill.
    pub decode: bool,
    /// Layer.
    pub layer: u32,
    /// Experts in row order (duplicates across tokens included).
    pub experts: Vec<u32>,
    /// Each row's context position.
    pub steps: Vec<i64>,
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
                    steps: Vec::new(),
                    recorded_hits: Vec::new(),
                });
            }
            prev = Some(r);
            if !r.dropped {
                let load = loads.last_mut().expect("pushed above");
                load.experts.push(r.expert);
                load.steps.push(r.step);
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
    /// Bytes a warm start read before the first load.
    pub warm_bytes: u64,
}

impl ReplayResult {
    /// Decode hit rate, 0..1 (0 without lookups).
    pub fn decode_hit_rate(&self) -> f64 {
        self.decode_hits as f64 / self.decode_lookups.max(1) as f64
    }
}

/// How a replay runs besides its budget and policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReplayOptions<'a> {
    /// What was learned before (profile, FlashMoE's mix, fMoE's maps).
    pub learned: Option<&'a Learned>,
    /// Fill the cache with the profile's most routed experts before the
    /// first load, in its order, up to the budget (reads counted apart).
    pub warm: bool,
    /// Replay the decode alone, the cache cold at its start.
    pub decode_only: bool,
}

/// One cache entry's state.
#[derive(Debug, Clone, Copy)]
struct Entry {
    resident: bool,
    second_last: u64,
    uses: u64,
    /// The load that last used it (protects it from eviction in that load).
    load: u64,
    /// Access index of its next use (Belady and Foresight only).
    next_use: u64,
    /// The token pass in which it last became current (Least-Stale).
    pass: u64,
    /// When it became current then (Least-Stale's FIFO).
    entered: u64,
    /// Time of its last use, in decode steps (FlashMoE's recency).
    at: f64,
    /// fMoE's predicted probability.
    predicted: f64,
}

impl Default for Entry {
    fn default() -> Entry {
        Entry {
            resident: false,
            second_last: 0,
            uses: 0,
            load: 0,
            next_use: u64::MAX,
            pass: u64::MAX,
            entered: 0,
            at: 0.0,
            predicted: 1.0,
        }
    }
}

/// Replays `trace` through a cache of `budget` bytes under `policy`, cold,
/// with nothing learned.
pub fn replay(trace: &Trace, budget: u64, policy: Policy) -> ReplayResult {
    replay_with(trace, budget, policy, ReplayOptions::default())
}

/// Replays `trace` through a cache of `budget` bytes under `policy`.
pub fn replay_with(trace: &Trace, budget: u64, policy: Policy, options: ReplayOptions<'_>) -> ReplayResult {
    let loads: Vec<&Load> = trace.loads.iter().filter(|l| l.decode || !options.decode_only).collect();
    let n = trace.n_expert;
    let id_of = |layer: u32, e: u32| layer as usize * n + e as usize;
    let max_layer = trace.loads.iter().map(|l| l.layer).max().unwrap_or(0) as usize;
    let n_entries = (max_layer + 1) * n;
    let mut entries = vec![Entry::default(); n_entries];
    let mut decayed = vec![DecayedCount::default(); n_entries];
    let mut last = vec![0u64; n_entries];
    let learned = options.learned.cloned().unwrap_or_default();
    let profile = learned.profile.as_ref();
    let shares: Vec<f64> = match profile {
        Some(p) => (0..n_entries).map(|id| p.share(id / n, id % n)).collect(),
        None => vec![0.0; n_entries],
    };
    let routed_layers: BTreeSet<u32> = trace.loads.iter().map(|l| l.layer).collect();
    let n_layers = routed_layers.len().max(1);
    let entry_bytes: Vec<u64> = (0..=max_layer as u32).map(|l| trace.entry_bytes(l)).collect();
    let bytes_of = |id: u32| entry_bytes[id as usize / n];
    let mut duel = match (policy, profile) {
        (Policy::Default | Policy::PriorDecay, Some(p)) => Duel::new(p, entry_bytes.clone(), n, budget, n_layers),
        _ => None,
    };
    let prior_uses: Vec<f64> = duel.as_ref().map_or_else(|| vec![0.0; n_entries], |d| d.prior().to_vec());
    let mut arc = arc::ArcLists::new(n_entries, budget);
    let mix = learned.mix.unwrap_or(learn::RecencyFrequencyMix { recency: -0.5, frequency: -0.5, bias: 1.0 });
    let maps = learned.maps.as_ref().filter(|m| !m.is_empty());
    let mut overlaps = vec![0u32; maps.map_or(0, |m| m.len())];
    let mut most_uses = vec![1u64; max_layer + 1];
    // Belady and Foresight: the access index of each access's next use.
    let knows_future = matches!(policy, Policy::Belady | Policy::Foresight(_));
    let next_use = if knows_future { next_uses(&loads, &id_of) } else { Vec::new() };
    // Foresight: the access index where each load starts.
    let load_starts: Vec<u64> = std::iter::once(0)
        .chain(loads.iter().scan(0u64, |at, l| {
            *at += l.experts.len() as u64;
            Some(*at)
        }))
        .collect();
    // Popular: the loads of each entry over the replayed loads.
    let mut popularity = vec![0u64; n_entries];
    if policy == Policy::Popular {
        for load in &loads {
            let mut experts = load.experts.clone();
            experts.sort_unstable();
            experts.dedup();
            experts.iter().for_each(|&e| popularity[id_of(load.layer, e)] += 1);
        }
    }
    let key_of = |id: usize, entry: &Entry, decayed: &DecayedCount, last: u64| -> EvictionKey {
        match policy {
            Policy::Lru | Policy::Arc => CachePolicy::Lru.key(decayed, last),
            Policy::Decay | Policy::Default | Policy::PriorDecay | Policy::Foresight(_) => {
                CachePolicy::Decay.key(decayed, last)
            }
            Policy::FlashMoe | Policy::FMoe => (last, 0),
            Policy::Lfu => (entry.uses, last),
            Policy::Lru2 => (entry.second_last, last),
            Policy::Prior => (shares[id].to_bits(), last),
            Policy::LeastStale => (entry.entered, 0),
            Policy::Popular => (popularity[id], last),
            Policy::Belady => (u64::MAX - entry.next_use, 0),
        }
    };
    let mut order = EvictionOrder::new(n_entries);
    let mut resident_bytes = 0u64;
    let mut out = ReplayResult::default();
    if let (true, Some(p)) = (options.warm, profile) {
        let mut warmed = Vec::new();
        for (layer, e) in p.most_routed() {
            let id = layer * n + e;
            if id >= n_entries || !routed_layers.contains(&(layer as u32)) {
                continue;
            }
            let bytes = entry_bytes[layer];
            if resident_bytes + bytes > budget {
                continue;
            }
            resident_bytes += bytes;
            out.warm_bytes += bytes;
            entries[id].resident = true;
            order.set(id as u32, key_of(id, &entries[id], &decayed[id], 0));
            arc.admit(id as u32, bytes);
            warmed.push(id as u32);
        }
        if let Some(d) = &mut duel {
            d.warm(&warmed);
        }
    }
    let mut clock = 0u64;
    let mut pass = 0u64;
    let mut prev_layer: Option<u32> = None;
    let mut per_layer: HashMap<u32, (u64, u64)> = HashMap::new();
    for (load_no, load) in loads.iter().enumerate() {
        let load_id = load_no as u64 + 1;
        // A new token's pass starts when the layers start over.
        if prev_layer.is_none_or(|p| load.layer <= p) {
            pass += 1;
            overlaps.iter_mut().for_each(|o| *o = 0);
        }
        prev_layer = Some(load.layer);
        // Foresight: the first access it does not see.
        let foresight_end = match policy {
            Policy::Foresight(f) => {
                let ahead = if f == 0 { n_layers } else { f as usize };
                load_starts[(load_no + 1 + ahead).min(loads.len())]
            }
            _ => 0,
        };
        let now = load_no as f64 / n_layers as f64;
        let bytes = trace.entry_bytes(load.layer);
        let mut first_flags: HashMap<u32, bool> = HashMap::new();
        let mut distinct = Vec::new();
        for &e in &load.experts {
            let id = id_of(load.layer, e);
            clock += 1;
            let entry = &mut entries[id];
            let first = entry.load != load_id;
            let hit = entry.resident;
            if first {
                distinct.push(id as u32);
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
                decayed[id].add_use(now);
                if policy == Policy::Arc {
                    arc.access(id as u32, hit, bytes);
                }
                if !hit {
                    entry.resident = true;
                    resident_bytes += bytes;
                    *if load.decode { &mut out.decode_bytes } else { &mut out.prefill_bytes } += bytes;
                }
                if entry.pass != pass {
                    entry.pass = pass;
                    entry.entered = clock;
                }
                entry.at = now;
                entry.predicted = 1.0;
                first_flags.insert(e, hit);
            }
            // Every row of an expert reports the state before the load, like
            // the live trace: a repeated row repeats the first row's flag.
            out.row_hits.push(first_flags[&e]);
            entry.load = load_id;
            if last[id] != 0 {
                entry.second_last = last[id];
            }
            last[id] = clock;
            entry.uses += 1;
            most_uses[load.layer as usize] = most_uses[load.layer as usize].max(entry.uses);
            if knows_future {
                entry.next_use = next_use[clock as usize - 1];
            }
            order.set(id as u32, key_of(id, entry, &decayed[id], last[id]));
        }
        if let Some(d) = &mut duel {
            d.observe(&distinct, now);
        }
        // fMoE: this token's routing so far picks the closest map, whose
        // next layer's experts become the predictions there.
        if let (Policy::FMoe, Some(maps), true) = (policy, maps, load.decode) {
            let mut best = (0u32, 0usize);
            for (m, o) in overlaps.iter_mut().enumerate() {
                *o += maps.overlap(m, load.layer as usize, &load.experts);
                if *o >= best.0 {
                    best = (*o, m);
                }
            }
            if let Some(&next) = routed_layers.range(load.layer + 1..).next() {
                for e in 0..n {
                    entries[id_of(next, e as u32)].predicted =
                        f64::from(u8::from(maps.routes(best.1, next as usize, e)));
                }
            }
        }
        // Evict down to the budget, sparing this load's experts.
        while resident_bytes > budget {
            let in_load = |id: u32| entries[id as usize].load == load_id;
            let foreseen = |id: u32| in_load(id) || entries[id as usize].next_use < foresight_end;
            let victim = match policy {
                Policy::Arc => arc.victim(in_load),
                Policy::PriorDecay => prior_victim(order.ids(), &prior_uses, &decayed, &last, now, in_load),
                Policy::Default if duel.as_ref().is_some_and(Duel::trusts_prior) => {
                    prior_victim(order.ids(), &prior_uses, &decayed, &last, now, in_load)
                }
                Policy::FlashMoe => order.ids().filter(|&id| !in_load(id)).max_by(|&a, &b| {
                    let predict = |id: u32| {
                        let e = &entries[id as usize];
                        mix.predict(now - e.at, e.uses as f64 / most_uses[id as usize / n] as f64)
                    };
                    predict(a).total_cmp(&predict(b)).then(last[b as usize].cmp(&last[a as usize]))
                }),
                Policy::FMoe => order.ids().filter(|&id| !in_load(id)).min_by(|&a, &b| {
                    let worth = |id: u32| entries[id as usize].predicted * entries[id as usize].uses as f64;
                    worth(a).total_cmp(&worth(b)).then(last[a as usize].cmp(&last[b as usize]))
                }),
                _ => order.victim(foreseen).or_else(|| order.victim(in_load)),
            };
            let Some(id) = victim else { break };
            order.remove(id);
            if policy == Policy::Arc {
                arc.evicted(id, bytes_of(id), bytes_of);
            }
            entries[id as usize].resident = false;
            resident_bytes -= bytes_of(id);
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
fn next_uses(loads: &[&Load], id_of: &dyn Fn(u32, u32) -> usize) -> Vec<u64> {
    let accesses: Vec<usize> = loads.iter().flat_map(|l| l.experts.iter().map(move |&e| id_of(l.layer, e))).collect();
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
