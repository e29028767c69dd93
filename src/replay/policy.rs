//! The cache policies `bmoe replay` compares, by name.

/// A cache policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The live default: decay, with the route profile's prior while its
    /// shadow misses less (`moe::duel`); plain decay without a profile.
    Default,
    /// Least recently used (a live policy).
    Lru,
    /// Fewest decayed uses (live; the default without a profile).
    Decay,
    /// Least frequently used, ties by least recent.
    Lfu,
    /// LRU-2: the entry whose second-to-last use is oldest.
    Lru2,
    /// Decay with the profile's prior always (the duel's second shadow).
    PriorDecay,
    /// The profile's share alone, ties by least recent: `popular` learned
    /// from other runs instead of known in advance.
    Prior,
    /// SpecMD's Least-Stale (Hoang et al., Apple 2026): entries not used in
    /// the current token's pass are stale and go first, oldest first; then
    /// current ones, oldest first.
    LeastStale,
    /// FlashMoE's learned recency-frequency mix (Kim et al. 2026), with a
    /// linear model in place of the paper's small network: the predicted
    /// distance to the next use from `1/recency` and `uses / layer's most`,
    /// fitted to Belady's distances on the learning traces; the entry
    /// predicted farthest goes.
    FlashMoe,
    /// fMoE's expert maps (Yu et al. 2025), on routing alone: the learning
    /// traces' per-token maps, matched to this token's routing so far,
    /// predict the next layer's experts; the entry with the least
    /// `predicted × uses` goes (a use resets its prediction to 1).
    FMoe,
    /// ARC (Megiddo and Modha 2003) over bytes: recency and frequency
    /// lists with ghosts steering their split.
    Arc,
    /// Offline reference: the entry the replayed loads use least often,
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
    pub const ALL: [Policy; 14] = [
        Policy::Default,
        Policy::Lru,
        Policy::Decay,
        Policy::Lfu,
        Policy::Lru2,
        Policy::PriorDecay,
        Policy::Prior,
        Policy::LeastStale,
        Policy::FlashMoe,
        Policy::FMoe,
        Policy::Arc,
        Policy::Popular,
        Policy::Foresight(0),
        Policy::Belady,
    ];

    /// Its name: `foresight` with its horizon as `foresight:N` unless it
    /// is one token's worth.
    pub fn name(self) -> String {
        match self {
            Policy::Default => "default".into(),
            Policy::Lru => "lru".into(),
            Policy::Decay => "decay".into(),
            Policy::Lfu => "lfu".into(),
            Policy::Lru2 => "lru2".into(),
            Policy::PriorDecay => "prior-decay".into(),
            Policy::Prior => "prior".into(),
            Policy::LeastStale => "least-stale".into(),
            Policy::FlashMoe => "flashmoe".into(),
            Policy::FMoe => "fmoe".into(),
            Policy::Arc => "arc".into(),
            Policy::Popular => "popular".into(),
            Policy::Foresight(0) => "foresight".into(),
            Policy::Foresight(n) => format!("foresight:{n}"),
            Policy::Belady => "belady".into(),
        }
    }

    /// True for the offline references (they know the future).
    pub fn offline(self) -> bool {
        matches!(self, Policy::Popular | Policy::Foresight(_) | Policy::Belady)
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
            let names: Vec<String> = Policy::ALL.iter().map(|p| p.name()).collect();
            format!("unknown cache policy `{s}`: {} (foresight takes :N)", names.join(", "))
        })
    }
}
