//! Where routed experts live: shared full-bank slots re-read every token
//! (cache off), or a byte-budgeted global cache over (layer, expert) with
//! per-(layer, projection) reserved ranges (cache on; which entry goes first
//! is [`super::evict`]'s). An evicted entry's pages move under the entries
//! about to be read (`mremap`) rather than being freed and then faulted
//! in and zeroed again for the next read; pages nobody needs are released.
//!
//! Either way a projection's bank sits in its region at `lead + e *
//! slice_bytes`, where the rebound tensor expects it, with `lead` the bank's
//! file offset modulo the page size and a page of slack after it: the
//! region then maps the file linearly, so O_DIRECT reads whole page
//! windows straight into place with no bounce copy (`super::lanes`).
//!
//! With io_uring ([`ExpertStore::use_arena`]) the cache's pages come from
//! one arena of the budget's size, registered with the lanes' rings at
//! open: an entry's whole pages are an arena run mapped under its slice
//! (given back when it is evicted), and its reads land there without
//! pinning a page each time. The partial pages at a slice's edges stay the
//! region's own.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use super::arena_runs::ArenaRuns;
use super::duel::{Duel, prior_victim};
use super::evict::{CachePolicy, DecayedCount, EvictionOrder};
use super::lanes::{CopyInto, ReadJob, ReadLanes, ReadStats};
use super::partial::PartialCopy;
use super::profile::RouteProfile;
use crate::llama::memory::{self, Arena, Region, page};
use crate::llama::uring::FixedSpan;
use crate::llama::{Repacker, TensorBinding, TensorHandle};

/// One projection of one layer's expert bank.
pub struct Projection {
    /// The weight tensor in the model.
    pub tensor: TensorHandle,
    /// Bytes per expert (`nb[2]`).
    pub slice_bytes: usize,
    /// Shard holding the tensor.
    pub shard: usize,
    /// Absolute file offset of expert 0.
    pub file_offset: u64,
    /// Computes with the CPU's repacked kernels: each slice is repacked as
    /// it is read, unless `stored_repacked`.
    pub repacker: Option<Arc<Repacker>>,
    /// The files the lanes read hold this bank already repacked
    /// ([`super::repacked`]): slices are read in place as they are.
    pub stored_repacked: bool,
}

impl Projection {
    /// Where the bank starts in its region: its file offset modulo the page
    /// size, so region and file agree modulo the page size.
    fn lead(&self) -> usize {
        (self.file_offset % page() as u64) as usize
    }

    /// Region bytes the bank needs: the lead, the bank, and a page of slack
    /// for the last slice's page window.
    fn region_bytes(&self, n_expert: usize) -> usize {
        self.lead() + self.slice_bytes * n_expert + page()
    }
}

/// Per-load outcome, one entry per distinct expert in load order.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    /// (expert, was resident before this load).
    pub experts: Vec<(u32, bool)>,
    /// What the reads moved.
    pub read: ReadStats,
    /// Nanoseconds blocked on reads.
    pub read_ns: u64,
    /// Nanoseconds of cache bookkeeping, page commits and releases.
    pub mgmt_ns: u64,
    /// Entries evicted.
    pub evictions: u64,
    /// Bytes of evicted pages moved under the entries read.
    pub recycled_bytes: u64,
    /// Hits on entries read ahead by [`ExpertStore::prefetch`] and not used
    /// before this load.
    pub prefetch_used: u64,
}

/// What one [`ExpertStore::prefetch`] started.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrefetchReport {
    /// Entries whose reads were started.
    pub entries: u64,
    /// Bytes those reads will move.
    pub bytes: u64,
    /// Entries evicted to make room.
    pub evictions: u64,
    /// Bytes of evicted pages moved under the entries read ahead.
    pub recycled_bytes: u64,
    /// Nanoseconds of bookkeeping (the reads themselves run on other lanes).
    pub mgmt_ns: u64,
    /// Bytes the cache holds once these reads are started.
    pub resident: u64,
}

/// The byte-budgeted cache over (layer, expert) entries.
struct Cache {
    budget: u64,
    resident: u64,
    policy: CachePolicy,
    valid: Vec<bool>,
    /// The load that protects each entry from eviction.
    stamp: Vec<u64>,
    order: EvictionOrder,
    /// Per entry: decayed uses ([`CachePolicy::Decay`]).
    decayed: Vec<DecayedCount>,
    /// Per entry: the clock at its last use.
    last: Vec<u64>,
    /// A route profile's prior and the duel over trusting it.
    duel: Option<Box<Duel>>,
    /// Evictions whose victim the prior chose.
    prior_evictions: u64,
    /// Ticks once per routed row: recency.
    clock: u64,
    /// Loads so far; divided by the streamed layers it is the time in
    /// decode steps the decayed counts use.
    loads: u64,
    layers: f64,
}

impl Cache {
    fn new(entries: usize, budget: u64, policy: CachePolicy, layers: usize) -> Cache {
        Cache {
            budget,
            resident: 0,
            policy,
            valid: vec![false; entries],
            stamp: vec![0; entries],
            order: EvictionOrder::new(entries),
            decayed: vec![DecayedCount::default(); entries],
            last: vec![0; entries],
            duel: None,
            prior_evictions: 0,
            clock: 0,
            loads: 0,
            layers: layers.max(1) as f64,
        }
    }

    /// Records a use of `id` now: recency always; a decayed use when
    /// `counted` (once per entry per load).
    fn touch(&mut self, id: u32, counted: bool) {
        self.clock += 1;
        if counted {
            self.decayed[id as usize].add_use(self.loads as f64 / self.layers);
        }
        self.last[id as usize] = self.clock;
        let key = self.policy.key(&self.decayed[id as usize], self.clock);
        self.order.set(id, key);
    }

    /// Time in decode steps (loads so far over the streamed layers).
    fn now(&self) -> f64 {
        self.loads as f64 / self.layers
    }

    /// The entry to evict first, skipping `spared`: by the prior while the
    /// duel trusts it, else in the policy's order.
    fn victim(&self, spared: impl FnMut(u32) -> bool) -> Option<u32> {
        match &self.duel {
            Some(duel) if duel.trusts_prior() => {
                prior_victim(self.order.ids(), duel.prior(), &self.decayed, &self.last, self.now(), spared)
            }
            _ => self.order.victim(spared),
        }
    }
}

/// Whole pages of an evicted entry's slice, waiting to be moved under an
/// entry about to be read.
struct SpareRun {
    il: usize,
    p: usize,
    offset: usize,
    len: usize,
    /// The arena run these pages are, with the arena in use.
    arena_run: Option<usize>,
}

/// What a slice's whole pages are, with the arena in use.
#[derive(Clone, Copy, PartialEq)]
enum ArenaPages {
    /// The region's own anonymous pages.
    Own,
    /// The arena run `(offset, len)`, held by this entry; with `true`, its
    /// page tables are still to fill (a run whose pages are new).
    Held(usize, usize, bool),
    /// Still mapped to a run the entry gave back when it was evicted (and
    /// another entry may hold now): remapped before anything is read here.
    Stale,
}

/// What happens to an entry's pages when it leaves the cache.
#[derive(Clone, Copy, PartialEq)]
enum Pages {
    /// Back to the kernel now.
    Release,
    /// Kept as spare runs for the entries read next ([`ExpertStore::make_room`]).
    Keep,
}

enum Residency {
    /// One region per projection kind, shared by every layer.
    Slots,
    /// A cache with one region per (layer, projection).
    Cache(Box<Cache>),
}

/// The expert store of a session.
pub struct ExpertStore {
    n_expert: usize,
    /// Projections by layer (empty for layers without experts).
    layers: Vec<Vec<Projection>>,
    /// The layers with experts, ascending (what read-ahead looks ahead to).
    streamed: Vec<usize>,
    /// Layers from here on are a draft context's (MTP), which the trunk's
    /// read-ahead does not look ahead to.
    trunk_end: usize,
    /// How many of `streamed` are trunk layers (below `trunk_end`).
    trunk_streamed: usize,
    /// Destination region of each (layer, projection).
    regions: Vec<Vec<Arc<Region>>>,
    entry_bytes: Vec<u64>,
    residency: Residency,
    lanes: ReadLanes,
    _bindings: Vec<TensorBinding>,
    generation: u64,
    seen: Vec<u64>,
    /// Entries whose read-ahead was submitted and not yet waited for, with
    /// the lanes' ticket covering their reads.
    pending: Vec<(u32, u64)>,
    /// Per entry: its read-ahead is in flight, so it is never evicted.
    in_flight: Vec<bool>,
    /// Per entry: read ahead and not used since.
    prefetched: Vec<bool>,
    /// Evicted pages not yet moved under a new entry.
    spare: Vec<SpareRun>,
    /// False once the kernel refused a page move as unsupported: evictions
    /// then release their pages.
    recycle: bool,
    /// Bytes of pages moved from evicted entries to new ones so far (the
    /// reports carry the difference each call makes).
    recycled_bytes: u64,
    /// Bytes of the entries the last load uses: stamped with its
    /// generation, no eviction touches them until the next load.
    loaded_bytes: u64,
    /// The registered arena's free runs, once [`Self::use_arena`] set it up.
    arena: Option<ArenaRuns>,
    /// Per (entry, projection) (`id * n_proj + p`): what the slice's whole
    /// pages are.
    arena_held: Vec<ArenaPages>,
    /// Projections per layer, at most.
    n_proj: usize,
    /// A partial repacked copy, the lanes' shard index of its first file,
    /// and each (layer, projection)'s bank index in it.
    partial: Option<(std::sync::Arc<PartialCopy>, usize, Vec<Vec<usize>>)>,
    /// The route profile this run adds its routing to.
    learning: Option<RouteProfile>,
    /// The last ticket of the warm start's reads (0: none), which come
    /// before any other read-ahead.
    warm_end: u64,
}

impl ExpertStore {
    /// Builds the store and rebinds every expert tensor to engine memory.
    /// `cache_bytes == 0` selects shared slots; `policy` picks the cache's
    /// evictions.
    pub fn new(
        layers: Vec<Vec<Projection>>,
        n_expert: usize,
        cache_bytes: u64,
        policy: CachePolicy,
        lanes: ReadLanes,
    ) -> io::Result<ExpertStore> {
        let n_proj = layers.iter().map(Vec::len).max().unwrap_or(0);
        let mut regions: Vec<Vec<Arc<Region>>> = Vec::with_capacity(layers.len());
        let residency = if cache_bytes == 0 {
            // One shared region per projection index, sized for the widest layer.
            let mut shared = Vec::with_capacity(n_proj);
            for p in 0..n_proj {
                let size = layers.iter().filter_map(|l| l.get(p)).map(|x| x.region_bytes(n_expert)).max().unwrap_or(0);
                shared.push(Arc::new(Region::reserve(size)?));
            }
            for l in &layers {
                regions.push(shared[..l.len()].to_vec());
            }
            Residency::Slots
        } else {
            for l in &layers {
                let mut per = Vec::with_capacity(l.len());
                for p in l {
                    per.push(Arc::new(Region::reserve(p.region_bytes(n_expert))?));
                }
                regions.push(per);
            }
            let streamed = layers.iter().filter(|l| !l.is_empty()).count();
            Residency::Cache(Box::new(Cache::new(layers.len() * n_expert, cache_bytes, policy, streamed)))
        };
        let mut bindings = Vec::new();
        for (l, projs) in layers.iter().enumerate() {
            for (p, proj) in projs.iter().enumerate() {
                bindings.push(
                    proj.tensor
                        .bind(regions[l][p].clone(), proj.lead(), proj.repacker.as_deref())
                        .map_err(io::Error::other)?,
                );
            }
        }
        // The experts now live in engine memory: give back llama.cpp's mapped
        // copy (it populated the whole file at load) so the resident set
        // follows the cache budget, and let the page cache drop it too.
        for b in &bindings {
            b.release_original_pages()?;
        }
        for projs in &layers {
            for p in projs {
                lanes.drop_cached(p.shard, p.file_offset, (p.slice_bytes * n_expert) as u64)?;
            }
        }
        // Page moves split a region's mapping at slice windows: allow them
        // only while the worst case fits under the kernel's mapping limit.
        let windows: usize = layers.iter().map(|l| l.len() * n_expert).sum();
        let recycle = matches!(residency, Residency::Cache(_))
            && memory::page_moves_work()
            && memory::mappings_fit(2 * windows + regions.iter().map(Vec::len).sum::<usize>());
        let n_layers = layers.len();
        let entry_bytes = layers.iter().map(|l| l.iter().map(|p| p.slice_bytes as u64).sum()).collect();
        let streamed = (0..n_layers).filter(|&l| !layers[l].is_empty()).collect();
        Ok(ExpertStore {
            n_expert,
            streamed,
            trunk_end: usize::MAX,
            trunk_streamed: usize::MAX,
            seen: vec![0; n_expert],
            layers,
            regions,
            entry_bytes,
            residency,
            lanes,
            _bindings: bindings,
            generation: 0,
            pending: Vec::new(),
            in_flight: vec![false; n_layers * n_expert],
            prefetched: vec![false; n_layers * n_expert],
            spare: Vec::new(),
            recycle,
            recycled_bytes: 0,
            loaded_bytes: 0,
            arena: None,
            arena_held: Vec::new(),
            n_proj,
            partial: None,
            learning: None,
            warm_end: 0,
        })
    }

    /// Moves the cache onto an arena of the budget's size registered with
    /// the lanes' io_uring rings, so reads pin no pages (replacing page
    /// moves, which the arena makes unneeded). Call once, right after
    /// [`Self::new`]. On an error (the cache is off, io_uring is missing or
    /// refused, the lanes are not O_DIRECT, the locked-memory limit) the
    /// store stays as it was, and the error says why.
    pub fn use_arena(&mut self) -> io::Result<()> {
        let Residency::Cache(cache) = &self.residency else {
            return Err(io::Error::other("the expert cache is off"));
        };
        let len = usize::try_from(cache.budget).map_err(io::Error::other)?.next_multiple_of(page());
        crate::llama::uring::check_lockable(len)?;
        let arena = std::sync::Arc::new(Arena::new(len)?);
        self.lanes.use_arena(&arena)?;
        self.arena = Some(ArenaRuns::new(arena));
        self.arena_held = vec![ArenaPages::Own; self.layers.len() * self.n_expert * self.n_proj];
        Ok(())
    }

    /// Reads repacked banks through a partial repacked copy, whose files
    /// the lanes open from shard `shard_base` on: a slice the copy holds
    /// is read from it as stored, any other from the model, repacked as it
    /// is read and written into the copy ([`super::partial`]). The copy's
    /// banks are the store's, in layer and projection order.
    pub fn use_partial_copy(&mut self, copy: std::sync::Arc<PartialCopy>, shard_base: usize) {
        let mut next = 0;
        let banks = (self.layers.iter())
            .map(|l| {
                l.iter()
                    .map(|_| {
                        next += 1;
                        next - 1
                    })
                    .collect()
            })
            .collect();
        self.partial = Some((copy, shard_base, banks));
    }

    /// True when reads go through io_uring into the registered arena.
    pub fn uses_arena(&self) -> bool {
        self.arena.is_some()
    }

    /// Layers the store spans (streamed or not).
    pub fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// Experts per layer.
    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    /// True when layer `il` has streamed experts.
    pub fn has_layer(&self, il: usize) -> bool {
        self.layers.get(il).is_some_and(|l| !l.is_empty())
    }

    /// The layers with experts, ascending.
    pub fn streamed_layers(&self) -> &[usize] {
        &self.streamed
    }

    /// The streamed layers after `il`, nearest first: within the trunk,
    /// for a trunk layer (the MTP layers run in another context).
    pub fn streamed_after(&self, il: usize) -> impl Iterator<Item = usize> + '_ {
        let from = self.streamed.partition_point(|&l| l <= il);
        let to = if il < self.trunk_end { self.trunk_streamed.min(self.streamed.len()) } else { self.streamed.len() };
        self.streamed[from..to.max(from)].iter().copied()
    }

    /// Marks the layers from `n` on as a draft context's (MTP layers after
    /// a trunk of `n`), which read-ahead from the trunk leaves alone.
    pub fn set_trunk_layers(&mut self, n: usize) {
        self.trunk_end = n;
        self.trunk_streamed = self.streamed.partition_point(|&l| l < n);
    }

    /// Bytes of one (layer, expert) entry, all projections.
    pub fn entry_bytes(&self, il: usize) -> u64 {
        self.entry_bytes.get(il).copied().unwrap_or(0)
    }

    /// Total bytes of every streamed expert.
    pub fn bank_bytes(&self) -> u64 {
        self.entry_bytes.iter().sum::<u64>() * self.n_expert as u64
    }

    /// Budget in bytes (0 with the cache off).
    pub fn budget(&self) -> u64 {
        match &self.residency {
            Residency::Slots => 0,
            Residency::Cache(c) => c.budget,
        }
    }

    /// Bytes currently held by the cache (0 with the cache off).
    pub fn resident_bytes(&self) -> u64 {
        match &self.residency {
            Residency::Slots => 0,
            Residency::Cache(c) => c.resident,
        }
    }

    /// True when the cache holds every expert of the bank (nothing is left
    /// to read; never with the cache off).
    pub fn holds_whole_bank(&self) -> bool {
        matches!(self.residency, Residency::Cache(_)) && self.resident_bytes() >= self.bank_bytes()
    }

    /// Which experts the cache holds right now, `layer * n_expert + expert`
    /// (empty with the cache off).
    pub fn resident_map(&self) -> Vec<bool> {
        match &self.residency {
            Residency::Slots => Vec::new(),
            Residency::Cache(c) => c.valid.clone(),
        }
    }

    /// Whether `expert` of layer `il` is in the cache right now.
    pub fn is_resident(&self, il: usize, expert: u32) -> bool {
        match &self.residency {
            Residency::Slots => false,
            Residency::Cache(c) => c.valid[il * self.n_expert + expert as usize],
        }
    }

    /// Makes every expert in `ids` (routed ids of one layer, any order,
    /// duplicates allowed) present in its slot before the layer computes.
    pub fn load_layer(&mut self, il: usize, ids: &[i32]) -> io::Result<LoadReport> {
        let t0 = Instant::now();
        let mut report = LoadReport::default();
        // Read-ahead of the experts this layer routes must land before it computes.
        let (ahead, ahead_ns) = self.finish_prefetch(Some((il, ids)))?;
        report.read = ahead;
        report.read_ns = ahead_ns;
        if !self.has_layer(il) {
            return Err(io::Error::other(format!("layer {il} has no streamed experts")));
        }
        let n_expert = self.n_expert;
        // Check every id before touching the cache, so a bad one changes nothing.
        if let Some(&raw) = ids.iter().find(|&&raw| usize::try_from(raw).map_or(true, |e| e >= n_expert)) {
            return Err(io::Error::other(format!(
                "router chose expert {raw} in layer {il}, which has {n_expert} experts"
            )));
        }
        self.generation += 1;
        let generation = self.generation;
        let mut missed = Vec::new();
        for &raw in ids {
            let e = raw as usize;
            let id = (il * n_expert + e) as u32;
            let first = self.seen[e] != generation;
            self.seen[e] = generation;
            let hit = match &mut self.residency {
                Residency::Slots => false,
                Residency::Cache(cache) => {
                    let hit = cache.valid[id as usize];
                    // A read-ahead entry's use was counted when it was read ahead.
                    let ahead = first && hit && std::mem::take(&mut self.prefetched[id as usize]);
                    report.prefetch_used += u64::from(ahead);
                    // Every row refreshes recency, so the order reflects the last token.
                    cache.touch(id, first && !ahead);
                    if first {
                        cache.stamp[id as usize] = generation;
                        if !hit {
                            cache.valid[id as usize] = true;
                            cache.resident += self.entry_bytes[il];
                        }
                    }
                    hit
                }
            };
            if !first {
                continue;
            }
            report.experts.push((e as u32, hit));
            if !hit {
                missed.push(id);
            }
        }
        if let Residency::Cache(cache) = &mut self.residency {
            if let Some(duel) = &mut cache.duel {
                let distinct: Vec<u32> = report.experts.iter().map(|&(e, _)| (il * n_expert) as u32 + e).collect();
                duel.observe(&distinct, cache.loads as f64 / cache.layers);
            }
            cache.loads += 1;
        }
        if let Some(profile) = &mut self.learning {
            profile.observe(il, ids.iter().map(|&e| e as u32));
        }
        self.loaded_bytes = report.experts.len() as u64 * self.entry_bytes[il];
        let recycled = self.recycled_bytes;
        report.evictions = self.make_room(generation, &missed)?;
        report.recycled_bytes = self.recycled_bytes - recycled;
        let jobs = self.read_jobs_of(&missed);
        let t_read = Instant::now();
        let read = self.lanes.read_all(jobs);
        let t_after = Instant::now();
        report.read_ns += (t_after - t_read).as_nanos() as u64;
        match read {
            Ok(stats) => report.read += stats,
            Err(e) => {
                self.abandon(&missed)?;
                return Err(e);
            }
        }
        report.mgmt_ns = (((t_read - t0) + t_after.elapsed()).as_nanos() as u64).saturating_sub(ahead_ns);
        Ok(report)
    }

    /// CPU time the read lanes have spent so far, nanoseconds.
    pub fn lane_cpu_ns(&self) -> u64 {
        self.lanes.cpu_ns()
    }

    /// Marks the start of a step, before its first load: the last load's
    /// layer has computed, so its entries lose their protection and read-ahead
    /// for the step's first layers may evict them (and trim a cache a
    /// prompt's wide loads left over budget).
    pub fn begin_step(&mut self) {
        self.generation += 1;
        self.loaded_bytes = 0;
    }

    /// Starts reading each target's experts, `(layer, experts)`, into the
    /// cache on the worker lanes, behind any read-ahead still in flight, and
    /// returns without waiting: [`Self::load_layer`] of a target layer waits
    /// for that layer's entries, so no layer computes over a slice in
    /// flight. Entries already resident or in flight are skipped; room is
    /// made by evicting in the policy's order, never the entries of the load
    /// just done nor any being read, and targets past the room that leaves
    /// are not read (the budget holds). Does nothing with the cache off (its
    /// slots are shared by every layer) or with a single lane (nothing could
    /// read in the background).
    pub fn prefetch(&mut self, targets: &[(usize, Vec<u32>)]) -> io::Result<PrefetchReport> {
        let t0 = Instant::now();
        let mut report = PrefetchReport { resident: self.resident_bytes(), ..PrefetchReport::default() };
        if targets.is_empty() || !self.can_prefetch() {
            return Ok(report);
        }
        let protect = self.generation;
        let n_expert = self.n_expert;
        let mut room = self.room();
        let mut incoming = Vec::new();
        for (il, experts) in targets {
            let il = *il;
            if !self.has_layer(il) {
                continue;
            }
            for &e in experts {
                let e = e as usize;
                let id = il * n_expert + e;
                let Residency::Cache(cache) = &mut self.residency else { break };
                if e >= n_expert || cache.valid[id] || room < self.entry_bytes[il] {
                    continue;
                }
                room -= self.entry_bytes[il];
                cache.valid[id] = true;
                cache.stamp[id] = protect;
                cache.resident += self.entry_bytes[il];
                // Counted as the coming load's use (the clock is already there).
                cache.touch(id as u32, true);
                self.prefetched[id] = true;
                self.in_flight[id] = true;
                incoming.push(id as u32);
                report.entries += 1;
                report.bytes += self.entry_bytes[il];
            }
        }
        let recycled = self.recycled_bytes;
        report.evictions = self.make_room(protect, &incoming)?;
        let jobs = self.read_jobs_of(&incoming);
        let ticket = self.lanes.submit(jobs);
        self.pending.extend(incoming.into_iter().map(|id| (id, ticket)));
        report.recycled_bytes = self.recycled_bytes - recycled;
        report.mgmt_ns = t0.elapsed().as_nanos() as u64;
        report.resident = self.resident_bytes();
        Ok(report)
    }

    /// Evicts with `profile`'s prior while its shadow misses less than
    /// plain decay's ([`super::duel`]). Only the decay policy takes a prior;
    /// false (nothing changes) with the cache off, another policy, or a
    /// profile that is empty or of another shape.
    pub fn use_profile(&mut self, profile: &RouteProfile) -> bool {
        let entry_bytes = self.entry_bytes.clone();
        let (n_expert, layers) = (self.n_expert, self.streamed.len());
        let Residency::Cache(cache) = &mut self.residency else { return false };
        if cache.policy != CachePolicy::Decay {
            return false;
        }
        cache.duel = Duel::new(profile, entry_bytes, n_expert, cache.budget, layers).map(Box::new);
        cache.duel.is_some()
    }

    /// Evictions so far whose victim the profile's prior chose.
    pub fn prior_evictions(&self) -> u64 {
        match &self.residency {
            Residency::Cache(c) => c.prior_evictions,
            Residency::Slots => 0,
        }
    }

    /// Adds this run's routing (every routed row of every load) to
    /// `profile` from now on; [`Self::learned_profile`] gives it back.
    pub fn learn_profile(&mut self, profile: RouteProfile) {
        self.learning = Some(profile);
    }

    /// The profile this run adds its routing to, if any.
    pub fn learned_profile(&self) -> Option<&RouteProfile> {
        self.learning.as_ref()
    }

    /// A warm start: starts reading `profile`'s most routed experts into
    /// the cache on the worker lanes, up to its budget, layer by layer in
    /// the order layers compute, and returns without waiting. A load waits
    /// only for the entries it routes, so the prompt runs while the rest
    /// land. Nothing counts as a use. Call it at open, before any other
    /// read-ahead. Does nothing with the cache off, a single lane, or an
    /// empty profile.
    pub fn warm_start(&mut self, profile: &RouteProfile) -> io::Result<PrefetchReport> {
        let t0 = Instant::now();
        let mut report = PrefetchReport { resident: self.resident_bytes(), ..PrefetchReport::default() };
        if !self.can_prefetch() || profile.n_expert != self.n_expert {
            return Ok(report);
        }
        let mut room = self.room();
        let mut by_layer: Vec<Vec<u32>> = vec![Vec::new(); self.layers.len()];
        for (il, e) in profile.most_routed() {
            if !self.has_layer(il) || room < self.entry_bytes[il] {
                continue;
            }
            room -= self.entry_bytes[il];
            by_layer[il].push((il * self.n_expert + e) as u32);
        }
        let protect = self.generation;
        let mut all = Vec::new();
        for ids in by_layer.into_iter().filter(|ids| !ids.is_empty()) {
            let Residency::Cache(cache) = &mut self.residency else { break };
            let mut incoming = Vec::new();
            for id in ids {
                if cache.valid[id as usize] {
                    continue;
                }
                cache.valid[id as usize] = true;
                cache.stamp[id as usize] = protect;
                cache.resident += self.entry_bytes[id as usize / self.n_expert];
                // In the order as never used (the replay's warm start does the same).
                let key = cache.policy.key(&cache.decayed[id as usize], 0);
                cache.order.set(id, key);
                self.in_flight[id as usize] = true;
                report.entries += 1;
                report.bytes += self.entry_bytes[id as usize / self.n_expert];
                incoming.push(id);
            }
            report.evictions += self.make_room(protect, &incoming)?;
            let ticket = self.lanes.submit(self.read_jobs_of(&incoming));
            self.pending.extend(incoming.iter().map(|&id| (id, ticket)));
            self.warm_end = ticket;
            all.extend(incoming);
        }
        if let Residency::Cache(cache) = &mut self.residency
            && let Some(duel) = &mut cache.duel
        {
            duel.warm(&all);
        }
        report.mgmt_ns = t0.elapsed().as_nanos() as u64;
        report.resident = self.resident_bytes();
        Ok(report)
    }

    /// Bytes the cache can take beyond the entries no eviction may touch
    /// now: the last load's and those read ahead since (every entry stamped
    /// with the current generation is one or the other: read-ahead entries
    /// stay pending until a load waits for them), and any still being read.
    fn room(&self) -> u64 {
        let Residency::Cache(cache) = &self.residency else { return 0 };
        let pending: u64 = self.pending.iter().map(|&(id, _)| self.entry_bytes[id as usize / self.n_expert]).sum();
        cache.budget.saturating_sub(self.loaded_bytes + pending)
    }

    /// True when [`Self::prefetch`] can read ahead: the cache is on and a
    /// worker lane exists.
    pub fn can_prefetch(&self) -> bool {
        matches!(self.residency, Residency::Cache(_)) && self.lanes.lanes() > 1
    }

    /// Waits for the read-ahead still in flight of the experts `ids` of
    /// layer `il` (of every entry: `None`), if any; read-ahead of experts
    /// the layer does not route may go on landing in their own slices,
    /// which the layer does not read. On a read error every read-ahead
    /// entry is forgotten (their bytes may be incomplete) and the error is
    /// returned. Returns what the lanes moved and the time blocked.
    fn finish_prefetch(&mut self, layer: Option<(usize, &[i32])>) -> io::Result<(ReadStats, u64)> {
        // A warm start's reads that landed need no wait and no protection
        // (no load is about to use them): their entries may be evicted again,
        // where a warm entry no load routes would otherwise stay in flight
        // for good. Read-ahead for a coming layer stays in flight, so
        // protected, until that layer's load.
        if let Some(landed) = self.lanes.landed().map(|t| t.min(self.warm_end)) {
            for &(id, _) in self.pending.iter().filter(|&&(_, t)| t <= landed) {
                self.in_flight[id as usize] = false;
            }
            self.pending.retain(|&(_, t)| t > landed);
        }
        let n_expert = self.n_expert;
        let mut routed = vec![false; if layer.is_some() { n_expert } else { 0 }];
        for &e in layer.map_or(&[][..], |(_, ids)| ids) {
            if let Some(r) = usize::try_from(e).ok().and_then(|e| routed.get_mut(e)) {
                *r = true;
            }
        }
        let mine = |id: u32| layer.is_none_or(|(il, _)| id as usize / n_expert == il && routed[id as usize % n_expert]);
        let Some(ticket) = self.pending.iter().filter(|&&(id, _)| mine(id)).map(|&(_, t)| t).max() else {
            return Ok((ReadStats::default(), 0));
        };
        let t0 = Instant::now();
        let result = self.lanes.wait_for(ticket);
        let waited = t0.elapsed().as_nanos() as u64;
        match result {
            Ok(stats) => {
                for &(id, _) in self.pending.iter().filter(|&&(_, t)| t <= ticket) {
                    self.in_flight[id as usize] = false;
                }
                self.pending.retain(|&(_, t)| t > ticket);
                Ok((stats, waited))
            }
            Err(e) => {
                self.abandon(&[])?;
                Err(e)
            }
        }
    }

    /// After a failed read: once no read is in flight, forgets `ids` and
    /// every read-ahead entry (their bytes may be incomplete), so a retry
    /// reads them again.
    fn abandon(&mut self, ids: &[u32]) -> io::Result<()> {
        // The lanes stop on an error; this only makes sure nothing still writes.
        let _ = self.lanes.wait();
        let pending = std::mem::take(&mut self.pending);
        for id in ids.iter().copied().chain(pending.into_iter().map(|(id, _)| id)) {
            self.in_flight[id as usize] = false;
            self.forget(id, Pages::Release)?;
        }
        Ok(())
    }

    /// The reads that bring entries `ids` into their slots, in order.
    fn read_jobs_of(&self, ids: &[u32]) -> Vec<ReadJob> {
        ids.iter().flat_map(|&id| self.read_jobs(id as usize / self.n_expert, id as usize % self.n_expert)).collect()
    }

    /// The reads that bring expert `e` of layer `il` into its slots.
    fn read_jobs(&self, il: usize, e: usize) -> impl Iterator<Item = ReadJob> + '_ {
        let id = il * self.n_expert + e;
        self.layers[il].iter().enumerate().map(move |(p, proj)| {
            let region_offset = proj.lead() + e * proj.slice_bytes;
            let fixed = match (self.arena_held.get(id * self.n_proj + p), &self.arena) {
                (Some(&ArenaPages::Held(arena_offset, len, populate)), Some(runs)) => {
                    Region::whole_pages(region_offset, proj.slice_bytes).map(|(at, _)| FixedSpan {
                        region_offset: at,
                        len,
                        arena_offset,
                        arena: runs.arena().clone(),
                        populate,
                    })
                }
                _ => None,
            };
            let mut job = ReadJob {
                shard: proj.shard,
                offset: proj.file_offset + (e * proj.slice_bytes) as u64,
                len: proj.slice_bytes,
                region: self.regions[il][p].clone(),
                region_offset,
                linear: proj.repacker.is_none() || proj.stored_repacked,
                repack: proj.repacker.clone().filter(|_| !proj.stored_repacked),
                fixed,
                copy_into: None,
            };
            if let (Some((copy, base, banks)), Some(_)) = (&self.partial, &job.repack) {
                let bank = banks[il][p];
                if copy.holds(bank, e) {
                    // Stored repacked. A page window in place would also
                    // write its neighbours' bytes from the copy, right only
                    // where the copy holds them too.
                    let held = |n: usize| copy.holds(bank, n);
                    job.shard += base;
                    job.repack = None;
                    job.linear = (e == 0 || held(e - 1)) && (e + 1 == self.n_expert || held(e + 1));
                } else {
                    job.copy_into = Some(CopyInto { copy: copy.clone(), bank, expert: e });
                }
            }
            job
        })
    }

    /// Drops one entry from the cache; its pages are released or kept as
    /// spare runs.
    fn forget(&mut self, id: u32, pages: Pages) -> io::Result<()> {
        let n_expert = self.n_expert;
        let Residency::Cache(cache) = &mut self.residency else { return Ok(()) };
        if !cache.valid[id as usize] {
            return Ok(());
        }
        let (il, e) = (id as usize / n_expert, id as usize % n_expert);
        cache.order.remove(id);
        cache.valid[id as usize] = false;
        self.prefetched[id as usize] = false;
        self.in_flight[id as usize] = false;
        cache.resident -= self.entry_bytes[il];
        for (p, proj) in self.layers[il].iter().enumerate() {
            let at = proj.lead() + e * proj.slice_bytes;
            if let Some(held) = self.arena_held.get_mut(id as usize * self.n_proj + p)
                && let ArenaPages::Held(run, len, _) = *held
            {
                // The region keeps mapping the run (nothing reads an evicted
                // entry), as a spare run to move under an entry read next,
                // or given back to the arena with its page-table entries
                // dropped (so its pages count once in the resident set).
                *held = ArenaPages::Stale;
                let offset = at.next_multiple_of(page());
                if pages == Pages::Keep && self.recycle {
                    self.spare.push(SpareRun { il, p, offset, len, arena_run: Some(run) });
                } else {
                    self.regions[il][p].release(offset, len)?;
                    if let Some(runs) = &mut self.arena {
                        runs.give(run, len);
                    }
                }
                continue;
            }
            match Region::whole_pages(at, proj.slice_bytes) {
                Some((offset, len)) if pages == Pages::Keep && self.recycle => {
                    self.spare.push(SpareRun { il, p, offset, len, arena_run: None })
                }
                _ => {
                    self.regions[il][p].release(at, proj.slice_bytes)?;
                }
            }
        }
        Ok(())
    }

    /// Evicts down to the budget (sparing the entries stamped `protect`)
    /// and moves the victims' pages under `incoming`, the entries about to
    /// be read; spare pages left over are released. On an error the
    /// incoming entries are forgotten, since they will not be read.
    fn make_room(&mut self, protect: u64, incoming: &[u32]) -> io::Result<u64> {
        let made = self.evict_to_budget(protect, Pages::Keep).and_then(|evicted| {
            for &id in incoming {
                self.recycle_into(id)?;
            }
            self.release_spare()?;
            Ok(evicted)
        });
        if made.is_err() {
            self.release_spare()?;
            for &id in incoming {
                self.forget(id, Pages::Release)?;
            }
        }
        made
    }

    /// Moves a spare run of exactly the right size under each slice of
    /// entry `id` (a slice with none left faults its pages in at the read).
    /// Whole runs only: every mapping boundary a move creates then falls on
    /// a slice's page window, so a region splits into at most two mappings
    /// per slice plus one, which the store checks fits at open.
    fn recycle_into(&mut self, id: u32) -> io::Result<()> {
        let (il, e) = (id as usize / self.n_expert, id as usize % self.n_expert);
        let windows: Vec<(usize, usize, usize)> = (self.layers[il].iter().enumerate())
            .filter_map(|(p, proj)| {
                let (to, need) = Region::whole_pages(proj.lead() + e * proj.slice_bytes, proj.slice_bytes)?;
                Some((p, to, need))
            })
            .collect();
        for (p, to, need) in windows {
            let slot = id as usize * self.n_proj + p;
            if let Some(pick) = self.spare.iter().rposition(|r| r.len == need) {
                let run = self.spare.swap_remove(pick);
                let source = &self.regions[run.il][run.p];
                match source.move_pages(run.offset, &self.regions[il][p], to, need) {
                    Ok(()) => {
                        self.recycled_bytes += need as u64;
                        if let Some(held) = self.arena_held.get_mut(slot) {
                            *held = run.arena_run.map_or(ArenaPages::Own, |at| ArenaPages::Held(at, need, false));
                        }
                        continue;
                    }
                    Err(err) => {
                        // The chunk is released instead; a kernel without
                        // mremap's DONTUNMAP turns recycling off for good.
                        if matches!(err.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS))
                            || err.kind() == io::ErrorKind::Unsupported
                        {
                            self.recycle = false;
                        }
                        self.release_run(run)?;
                    }
                }
            }
            if let Some(runs) = &mut self.arena {
                // No spare run of the size: a free arena run, mapped now;
                // with none left (a prompt's wide loads can run past the
                // budget) the pages fault in as the region's own, read
                // without io_uring.
                let region = &self.regions[il][p];
                let held = &mut self.arena_held[slot];
                match runs.take(need) {
                    Some((run, _)) => {
                        // Page tables are filled by the lane after the read
                        // (`FixedSpan::populate`), off the compute thread.
                        if let Err(err) = region.map_arena(to, runs.arena(), run, need, false) {
                            runs.give(run, need);
                            return Err(err);
                        }
                        *held = ArenaPages::Held(run, need, true);
                    }
                    None if *held == ArenaPages::Stale => {
                        region.unmap_arena(to, need)?;
                        *held = ArenaPages::Own;
                    }
                    None => {}
                }
            }
        }
        Ok(())
    }

    /// Releases the spare runs no incoming entry took.
    fn release_spare(&mut self) -> io::Result<()> {
        for run in std::mem::take(&mut self.spare) {
            self.release_run(run)?;
        }
        Ok(())
    }

    /// Releases a spare run's pages: an arena run goes back to the arena,
    /// its old place keeping the mapping without page-table entries.
    fn release_run(&mut self, run: SpareRun) -> io::Result<()> {
        self.regions[run.il][run.p].release(run.offset, run.len)?;
        if let (Some(at), Some(runs)) = (run.arena_run, &mut self.arena) {
            runs.give(at, run.len);
        }
        Ok(())
    }

    /// True while evictions hand their pages to the next entries read
    /// (cache on, Linux, the mapping limit leaves room, and not turned off),
    /// by page moves or through the arena.
    pub fn recycles_pages(&self) -> bool {
        self.recycle || self.arena.is_some()
    }

    /// Turns page recycling off (`false`) or leaves it as open found it.
    pub fn recycling_pages(mut self, wanted: bool) -> ExpertStore {
        self.recycle &= wanted;
        self
    }

    /// Changes the cache budget between generations, evicting in the
    /// policy's order (and releasing their pages) down to a smaller one.
    /// Returns the evictions; an error when the cache is off (the store
    /// then holds full-bank slots, which only a reopen can change).
    pub fn set_budget(&mut self, budget: u64) -> io::Result<u64> {
        let Residency::Cache(cache) = &mut self.residency else {
            return Err(io::Error::other("the expert cache is off: a budget needs a reopen"));
        };
        if self.arena.is_some() && budget != cache.budget {
            return Err(io::Error::other(
                "the cache's memory is registered with io_uring at its size: a new budget needs a reopen",
            ));
        }
        cache.budget = budget;
        if let Some(duel) = &mut cache.duel {
            duel.set_budget(budget);
        }
        self.finish_prefetch(None)?;
        // Nothing is in flight between generations: protect nothing.
        self.evict_to_budget(u64::MAX, Pages::Release)
    }

    /// Evicts entries in the policy's order until the budget holds, never
    /// touching entries used by the load in flight (`protect`).
    fn evict_to_budget(&mut self, protect: u64, pages: Pages) -> io::Result<u64> {
        let mut evicted = 0;
        loop {
            let Residency::Cache(cache) = &self.residency else { return Ok(0) };
            if cache.resident <= cache.budget {
                return Ok(evicted);
            }
            let in_flight = &self.in_flight;
            let Some(victim) = cache.victim(|id| cache.stamp[id as usize] == protect || in_flight[id as usize]) else {
                return Ok(evicted);
            };
            if let Residency::Cache(cache) = &mut self.residency
                && cache.duel.as_ref().is_some_and(|d| d.trusts_prior())
            {
                cache.prior_evictions += 1;
            }
            self.forget(victim, pages)?;
            evicted += 1;
        }
    }
}
