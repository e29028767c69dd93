//! The eval hook: captures the expert tensors during a warm-up decode, then
//! isolates each layer's `ffn_moe_topk-<il>` node, gathers the routed ids
//! through the view's strides and loads exactly those experts before the
//! layer's expert matmuls run. It also reads the layer's final routing
//! weights (the last `ffn_moe_weights*` node), for telemetry and for drop
//! policies: with a policy armed, the load moves from the topk node to the
//! weights node, where dropped slots are zeroed and repointed first.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::predict::{PredictionScore, ReadAhead, RouterPredictor, RouterWeights};
use super::recipe::parse_expert_tensor;
use super::store::{ExpertStore, PrefetchReport};
use crate::llama::{EvalHook, MtpExperts, Tensor, TensorBinding, TensorHandle};
use crate::policy::{DropCall, Dropper};

/// One expert tensor seen during capture.
#[derive(Debug, Clone)]
pub struct CapturedTensor {
    /// Layer index.
    pub layer: u32,
    /// Index into [`super::recipe::EXPERT_SUFFIXES`].
    pub suffix: usize,
    /// Tensor name.
    pub name: String,
    /// The live tensor.
    pub handle: TensorHandle,
    /// Elements per dimension.
    pub ne: [i64; 4],
    /// Byte strides.
    pub nb: [usize; 4],
    /// ggml type id.
    pub type_id: u32,
}

/// Nodes of the weight chain, in the order `build_moe_ffn` may produce them.
/// (Names without the `ffn_moe_` prefix and `-<il>` suffix.)
const WEIGHT_NODES: [&str; 4] = ["weights", "weights_softmax", "weights_norm", "weights_scaled"];

/// The first layer's attention norm, `rms_norm(x) * weight` over the
/// step's token embeddings `x`: the first point in the graph where they are
/// computed and named the same way in every architecture.
const EMBEDDING_NODE: &str = "attn_norm-0";
/// A decode step of more tokens than this (a speculative verify batch)
/// reads ahead nothing: the union of its guesses would read too much.
const MAX_PREDICTED_TOKENS: usize = 4;
/// ggml's id for f32.
const GGML_TYPE_F32: u32 = 0;
/// Decode layers in a row that found everything resident (routed experts
/// and read-ahead guesses) before the router prediction rests: a cache that
/// came to hold what decode routes has nothing left to read ahead, and the
/// prediction's scoring would be its only cost. The next miss resumes it.
const PREDICT_REST_LAYERS: u32 = 64;

/// A router input computed as `rms_norm(x) * weight`, optionally with a
/// constant scale after the norm (gemma4): `(x, weight)`. A positive scale
/// changes no ranking, so it is not needed to predict.
fn normed<'a>(input: Tensor<'a>) -> Option<(Tensor<'a>, Tensor<'a>)> {
    let weight = input.src(1).filter(|w| input.is_mul() && w.is_leaf())?;
    let mut norm = input.src(0)?;
    if norm.is_scale() {
        norm = norm.src(0)?;
    }
    norm.is_rms_norm().then_some(())?;
    Some((norm.src(0)?, weight))
}

/// The hidden state a layer's router reads, before its norm, seen from its
/// topk node. The residual stream is still live there (the layer adds it
/// back after its experts), unlike the normed copy the router consumed.
fn router_input<'a>(topk: Tensor<'a>, il: usize) -> Option<Tensor<'a>> {
    let input = topk.find_source(&format!("ffn_moe_logits-{il}"), 8)?.src(1)?;
    normed(input).map(|(x, _)| x)
}

/// Where layer `next`'s predicted experts go: `near` for the first layer
/// predicted (scored against its routing), `far` for the ones after it.
fn prediction_slot<'a>(
    near: &'a mut [Vec<u32>],
    far: &'a mut [Vec<u32>],
    first: usize,
    next: usize,
) -> &'a mut Vec<u32> {
    if next == first { &mut near[next] } else { &mut far[next] }
}

/// Splits `ffn_moe_<what>-<il>` into (what, il).
fn parse_moe_node(name: &str) -> Option<(&str, usize)> {
    let rest = name.strip_prefix("ffn_moe_")?;
    let (what, il) = rest.rsplit_once('-')?;
    if il.is_empty() || !il.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((what, il.parse().ok()?))
}

/// How many layers ahead a decode step of `nt` tokens runs the routers
/// (`router` asked for): a verify batch only the next layer. Its guesses
/// two layers ahead are the union of every position's, less often right,
/// and they evict what the batch is about to use (measured on the MTP
/// bench model under a cap: 179 against 137 MiB read per token).
fn decode_reach(router: u32, nt: usize) -> usize {
    if nt > 1 { 1 } else { router.max(1) as usize }
}

/// The slots a draft drafting with cached experts skips: those not
/// `resident`; when none is, every slot but the one of largest weight in
/// `weights` (read, so the draft has an expert).
fn cached_mask(resident: &[bool], weights: &[f32]) -> Vec<bool> {
    let mut mask: Vec<bool> = resident.iter().map(|r| !r).collect();
    if mask.iter().all(|&d| d)
        && let Some(top) = (0..weights.len()).max_by(|&a, &b| weights[a].total_cmp(&weights[b]))
    {
        mask[top] = false;
    }
    mask
}

/// One routed (token, slot) of one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouteRow {
    /// Token index within the decoded batch.
    pub token: u32,
    /// Layer.
    pub layer: u32,
    /// Router rank (0 = highest weight).
    pub slot: u32,
    /// Expert id chosen by the router.
    pub expert: u32,
    /// The router's applied weight (NaN when the graph exposed none).
    pub weight: f32,
    /// The expert was resident before this layer's load.
    pub hit: bool,
    /// Bytes read for this expert (charged on its first row in the load).
    pub bytes: u64,
    /// A drop policy skipped this slot.
    pub dropped: bool,
}

/// What one decode call did inside the expert layers.
#[derive(Debug, Clone, Default)]
pub struct StepTrace {
    /// Routing rows in graph order.
    pub rows: Vec<RouteRow>,
    /// Bytes requested from storage.
    pub bytes_read: u64,
    /// Bytes transferred (O_DIRECT windows included).
    pub window_bytes: u64,
    /// Slices copied out of a lane's bounce buffer instead of read in place.
    pub bounced_slices: u64,
    /// Slices read through io_uring into registered memory.
    pub fixed_slices: u64,
    /// Time blocked on reads.
    pub read_ns: u64,
    /// Cache management time.
    pub mgmt_ns: u64,
    /// CPU time the read lanes spent during the call (reads of this step's
    /// layers and read-ahead alike): what reading cost the cores.
    pub lane_cpu_ns: u64,
    /// Distinct (layer, expert) lookups.
    pub lookups: u64,
    /// Lookups that found the expert resident.
    pub hits: u64,
    /// Cache entries evicted.
    pub evictions: u64,
    /// Bytes of evicted entries' pages moved under new entries instead of
    /// being released and faulted in again.
    pub recycled_bytes: u64,
    /// Routed slots a drop policy skipped.
    pub dropped: u64,
    /// Bytes the skipped experts would have cost to read.
    pub avoided_bytes: u64,
    /// Entries read ahead for coming layers (their bytes count in
    /// `bytes_read` when the load that needed them waited for them).
    pub prefetched: u64,
    /// Lookups that hit an entry read ahead and not used before.
    pub prefetch_used: u64,
    /// Per layer, how well the router prediction named the routed experts.
    pub predictions: Vec<PredictionScore>,
    /// The most bytes the expert cache held at any point of the call.
    pub cache_peak: u64,
}

impl StepTrace {
    /// Adds what `other` (another decode in the same step) did.
    pub fn absorb(&mut self, other: StepTrace) {
        self.rows.extend(other.rows);
        self.bytes_read += other.bytes_read;
        self.window_bytes += other.window_bytes;
        self.bounced_slices += other.bounced_slices;
        self.fixed_slices += other.fixed_slices;
        self.read_ns += other.read_ns;
        self.mgmt_ns += other.mgmt_ns;
        self.lane_cpu_ns += other.lane_cpu_ns;
        self.lookups += other.lookups;
        self.hits += other.hits;
        self.evictions += other.evictions;
        self.recycled_bytes += other.recycled_bytes;
        self.dropped += other.dropped;
        self.avoided_bytes += other.avoided_bytes;
        self.prefetched += other.prefetched;
        self.prefetch_used += other.prefetch_used;
        self.predictions.extend(other.predictions);
        self.cache_peak = self.cache_peak.max(other.cache_peak);
    }
}

enum Mode {
    /// Warm-up: record expert tensors and weight-chain nodes, isolate nothing.
    Capture,
    /// Generation: load experts at each topk node.
    Stream,
}

/// Where, in graph order, a layer's nodes of interest appeared at capture.
#[derive(Debug, Clone, Copy, Default)]
struct Order {
    /// Index of the last weight-chain node, and which one it was.
    weights: Option<(usize, usize)>,
    /// Index of the first expert matmul.
    first_matmul: Option<usize>,
    /// The layer's `ffn_moe_topk` node was seen.
    topk: bool,
}

/// A layer whose load waits for its weights node (drop policy armed).
#[derive(Debug, Clone, Copy)]
struct Deferred {
    layer: usize,
    k: usize,
    tokens: usize,
    first_token: u32,
}

/// The MoE eval hook.
pub struct MoeHook {
    mode: Mode,
    captured: BTreeMap<(u32, usize), CapturedTensor>,
    order: Vec<Order>,
    nodes_seen: usize,
    store: Option<ExpertStore>,
    dropper: Option<Dropper>,
    abort: Arc<AtomicBool>,
    error: Option<String>,
    trace: StepTrace,
    /// Tokens of earlier ubatches of this decode call.
    token_base: u32,
    ubatch_tokens: u32,
    last_layer: Option<usize>,
    batch_tokens: u32,
    decode_phase: bool,
    /// Rows of the current layer awaiting their weights: (layer, first row, tokens, top-k).
    pending: Option<(usize, usize, usize, usize)>,
    deferred: Option<Deferred>,
    /// Scratch: the routed ids of the current layer, token-major.
    ids: Vec<i32>,
    /// Scratch: the current layer's weights, token-major.
    weights: Vec<f32>,
    /// Scratch: per slot of the current layer, dropped by the policy.
    dropped: Vec<bool>,
    /// Scratch: per expert, (resident before the load, read charged to a row).
    residency: Vec<(bool, bool)>,
    /// Non-expert weights the graph read during capture, by name.
    dense: BTreeMap<String, TensorHandle>,
    /// Dense weights rebound to engine memory (`--dense-weights anon`).
    dense_bindings: Vec<TensorBinding>,
    /// Router weights per layer, found at capture.
    routers: BTreeMap<usize, RouterWeights>,
    /// What to read ahead during decode.
    read_ahead: ReadAhead,
    predictor: Option<RouterPredictor>,
    /// Per layer, the experts predicted for the token being decoded from
    /// the layer before.
    predicted: Vec<Vec<u32>>,
    /// Per layer, the experts predicted from two or more layers before.
    predicted_far: Vec<Vec<u32>>,
    /// Per layer, the experts the previous decode step routed.
    last_routed: Vec<Vec<u32>>,
    /// Scratch: one token's hidden state.
    hidden: Vec<f32>,
    /// Scratch: the streamed layers after the current one that read-ahead
    /// and the router prediction look at.
    ahead: Vec<usize>,
    /// Expert tensors the graph reads other than through an expert matmul.
    other_expert_uses: Vec<String>,
    /// Read each layer's applied routing weights (for route traces); the
    /// weights node is then a second graph split per layer.
    record_weights: bool,
    /// Read-ahead is set up but skipped for now (the step tuner's choice).
    read_ahead_paused: bool,
    /// Decode layers in a row whose routed experts and read-ahead guesses
    /// were all resident: past [`PREDICT_REST_LAYERS`] the router
    /// prediction rests until a layer misses.
    layers_all_resident: u32,
    /// Which layer, counted from the current one, the router predicts: 1,
    /// or 0 to check the predictor against the routing it reproduces.
    predict_distance: usize,
    /// Experts each token routes to, from the last routing seen.
    top_k: Option<usize>,
    /// When the current decode's first node on an RPC server was asked about.
    remote_since: Option<Instant>,
    /// The read lanes' CPU time when the step began.
    lane_cpu_at: u64,
    /// Capture saw nodes on RPC servers (only then does a decode look for them).
    has_remote_nodes: bool,
    /// The decodes since [`MoeHook::begin_side_batch`] are another
    /// context's (the MTP draft context), not the step's own.
    side_batch: bool,
    /// Which routed experts the draft context's layers compute with.
    draft_experts: MtpExperts,
}

impl MoeHook {
    /// A hook in capture mode; `abort` is raised if streaming fails mid-decode.
    pub fn new(abort: Arc<AtomicBool>) -> MoeHook {
        MoeHook {
            mode: Mode::Capture,
            captured: BTreeMap::new(),
            order: Vec::new(),
            nodes_seen: 0,
            store: None,
            dropper: None,
            abort,
            error: None,
            trace: StepTrace::default(),
            token_base: 0,
            ubatch_tokens: 0,
            last_layer: None,
            batch_tokens: 0,
            decode_phase: false,
            pending: None,
            deferred: None,
            ids: Vec::new(),
            weights: Vec::new(),
            dropped: Vec::new(),
            residency: Vec::new(),
            dense: BTreeMap::new(),
            dense_bindings: Vec::new(),
            routers: BTreeMap::new(),
            read_ahead: ReadAhead::default(),
            predictor: None,
            predicted: Vec::new(),
            predicted_far: Vec::new(),
            last_routed: Vec::new(),
            hidden: Vec::new(),
            ahead: Vec::new(),
            predict_distance: 1,
            record_weights: true,
            other_expert_uses: Vec::new(),
            read_ahead_paused: false,
            layers_all_resident: 0,
            top_k: None,
            remote_since: None,
            lane_cpu_at: 0,
            has_remote_nodes: false,
            side_batch: false,
            draft_experts: MtpExperts::All,
        }
    }

    /// True when read-ahead is set up, the store can do it and has
    /// something to read (the cache does not hold the whole bank).
    pub fn read_ahead_active(&self) -> bool {
        self.read_ahead.any() && self.store.as_ref().is_some_and(|s| s.can_prefetch() && !s.holds_whole_bank())
    }

    /// Skips read-ahead (and the router prediction) while `paused`.
    pub fn pause_read_ahead(&mut self, paused: bool) {
        self.read_ahead_paused = paused;
    }

    /// Expert tensors the capture graph read other than through an expert
    /// matmul (none in the supported architectures): they would compute
    /// with whatever their original bytes are, so a lean open refuses them.
    pub fn other_expert_uses(&self) -> &[String] {
        &self.other_expert_uses
    }

    /// Whether decode reads each layer's applied routing weights into the
    /// route rows (on by default). Off saves one graph split per layer;
    /// rows then carry NaN weights. A drop policy reads them regardless.
    pub fn set_record_weights(&mut self, on: bool) {
        self.record_weights = on;
    }

    /// Makes the router predictor predict each layer from its own input,
    /// which must reproduce the graph's routing (tests of the predictor).
    #[doc(hidden)]
    pub fn predict_own_layer(&mut self) {
        self.predict_distance = 0;
    }

    /// Whether capture found router weights whose input the predictor can
    /// score (`rms_norm(x) * weight` before each router); an architecture
    /// whose router reads the raw hidden state (smallthinker) has none.
    pub fn can_predict_routers(&self) -> bool {
        !self.routers.is_empty()
    }

    /// Sets what to read ahead while streaming and returns the bytes router
    /// prediction holds beside the model (the routers' norm weights as
    /// f32); it fails when the graph showed no routers it can score.
    pub fn set_read_ahead(&mut self, read_ahead: ReadAhead) -> Result<usize, String> {
        self.predictor = None;
        if read_ahead.router > 0 {
            if self.routers.is_empty() {
                return Err("router prediction: the graph shows no router weights (ffn_moe_logits)".into());
            }
            self.predictor =
                Some(RouterPredictor::build(&self.routers).map_err(|e| format!("router prediction: {e}"))?);
        }
        self.read_ahead = read_ahead;
        Ok(self.predictor.as_ref().map_or(0, RouterPredictor::bytes))
    }

    /// Non-expert leaf tensors the graph read during capture, by name (inputs and caches too: in no model file).
    pub fn dense(&self) -> &BTreeMap<String, TensorHandle> {
        &self.dense
    }

    /// Keeps dense-weight bindings alive as long as the hook (which is
    /// dropped before the model).
    pub fn hold_dense(&mut self, bindings: Vec<TensorBinding>) {
        self.dense_bindings.extend(bindings);
    }

    /// Why the captured graph cannot be streamed, if it cannot: it read no
    /// expert tensor through an expert matmul, or a layer that multiplies
    /// its experts shows no `ffn_moe_topk-<il>` node (bmoe would not see
    /// which experts it routes to).
    pub fn routing_gap(&self) -> Option<String> {
        if self.captured.is_empty() {
            return Some(
                "the graph multiplied no expert tensor (blk.N.ffn_*_exps) with an expert matmul (ggml_mul_mat_id)"
                    .into(),
            );
        }
        self.captured.values().find(|t| !self.order.get(t.layer as usize).is_some_and(|o| o.topk)).map(|t| {
            format!(
                "layer {} multiplies its experts ({}) but its graph has no ffn_moe_topk-{} node, so bmoe cannot \
                 see which experts it routes to",
                t.layer, t.name, t.layer
            )
        })
    }

    /// Expert tensors recorded during capture, by (layer, suffix).
    pub fn captured(&self) -> &BTreeMap<(u32, usize), CapturedTensor> {
        &self.captured
    }

    /// Switches to streaming through `store`.
    pub fn start_streaming(&mut self, store: ExpertStore) {
        self.store = Some(store);
        self.mode = Mode::Stream;
    }

    /// The store, once streaming.
    pub fn store(&self) -> Option<&ExpertStore> {
        self.store.as_ref()
    }

    /// The store, mutable, between decodes.
    pub fn store_mut(&mut self) -> Option<&mut ExpertStore> {
        self.store.as_mut()
    }

    /// True when every streamed layer computes its final routing weights
    /// before its first expert matmul, so a load can wait for them.
    pub fn can_drop(&self) -> bool {
        let Some(store) = &self.store else { return false };
        (0..self.order.len().max(1)).filter(|&il| store.has_layer(il)).all(|il| {
            let o = self.order.get(il).copied().unwrap_or_default();
            matches!((o.weights, o.first_matmul), (Some((w, _)), Some(m)) if w < m)
        })
    }

    /// Arms (or removes) a drop policy; it is asked during decode only.
    pub fn set_dropper(&mut self, dropper: Option<Dropper>) {
        self.dropper = dropper;
    }

    /// The drop policy, between decodes.
    pub fn dropper_mut(&mut self) -> Option<&mut Dropper> {
        self.dropper.as_mut()
    }

    /// Sets which routed experts the draft context's decodes compute with
    /// ([`MtpExperts::Cached`] needs [`MoeHook::can_drop`]; without it every
    /// routed expert is read).
    pub fn set_draft_experts(&mut self, experts: MtpExperts) {
        self.draft_experts = experts;
    }

    /// Prepares for a decode of `tokens` tokens (`decode`: not a prompt chunk).
    pub fn begin_batch(&mut self, tokens: u32, decode: bool) {
        self.begin_side_batch(tokens);
        self.side_batch = false;
        self.trace = StepTrace::default();
        self.remote_since = None;
        self.lane_cpu_at = self.store.as_ref().map_or(0, ExpertStore::lane_cpu_ns);
        self.decode_phase = decode;
        self.predicted.iter_mut().for_each(Vec::clear);
        self.predicted_far.iter_mut().for_each(Vec::clear);
    }

    /// Prepares for a decode of `tokens` tokens in another context sharing
    /// this hook (the MTP draft context) without ending the step: what it
    /// reads adds to the current trace.
    pub fn begin_side_batch(&mut self, tokens: u32) {
        self.side_batch = true;
        self.token_base = 0;
        self.ubatch_tokens = 0;
        self.last_layer = None;
        self.batch_tokens = tokens;
        self.pending = None;
        self.deferred = None;
    }

    /// Takes what the last decode did.
    pub fn take_trace(&mut self) -> StepTrace {
        if let Some(d) = self.deferred.take() {
            // The graph never showed the weights node the load waited for:
            // the layer computed with experts that were not read.
            self.fail(format!("layer {}: its experts were never loaded (no routing-weights node came)", d.layer));
        }
        let lanes_now = self.store.as_ref().map_or(0, ExpertStore::lane_cpu_ns);
        self.trace.lane_cpu_ns = lanes_now.saturating_sub(self.lane_cpu_at);
        self.lane_cpu_at = lanes_now;
        std::mem::take(&mut self.trace)
    }

    /// Takes when the last decode started its part on RPC servers, if it
    /// had one.
    pub fn take_remote_start(&mut self) -> Option<Instant> {
        self.remote_since.take()
    }

    /// Takes the error that aborted the last decode, if any.
    pub fn take_error(&mut self) -> Option<String> {
        self.error.take()
    }

    fn fail(&mut self, msg: String) {
        if self.error.is_none() {
            self.error = Some(msg);
        }
        self.abort.store(true, Ordering::Relaxed);
    }

    fn order_of(&mut self, il: usize) -> &mut Order {
        if self.order.len() <= il {
            self.order.resize(il + 1, Order::default());
        }
        &mut self.order[il]
    }

    fn capture(&mut self, node: Tensor<'_>) {
        self.nodes_seen += 1;
        let at = self.nodes_seen;
        // Tensors held on an RPC server compute there: nothing to stream,
        // rebind or read for them here.
        if !node.is_host() {
            self.has_remote_nodes = true;
            return;
        }
        for src in node.srcs().filter(|s| s.is_leaf() && s.is_host()) {
            let name = src.name();
            let expert = parse_expert_tensor(name).is_some();
            // Any name (`ssm_a`, `ssm_d`): `dense::apply` keeps those in the files.
            if !expert && !self.dense.contains_key(name) {
                self.dense.insert(name.to_string(), src.handle());
            }
            if expert && !node.is_mul_mat_id() && !self.other_expert_uses.iter().any(|n| n == name) {
                self.other_expert_uses.push(name.to_string());
            }
        }
        // The last weight node of a layer in graph order holds the applied weights.
        if let Some((what, il)) = parse_moe_node(node.name()) {
            if let Some(k) = WEIGHT_NODES.iter().position(|w| *w == what) {
                self.order_of(il).weights = Some((at, k));
            }
            if what == "topk" {
                self.order_of(il).topk = true;
            }
            if what == "logits"
                && let Some(router) = node.src(0).filter(Tensor::is_leaf)
            {
                // Without a norm to fold in, there is no live input to predict from.
                if let Some((_, norm)) = node.src(1).and_then(normed) {
                    let w = RouterWeights { router: router.handle(), norm: norm.handle(), bias: None };
                    self.routers.entry(il).or_insert(w);
                }
            }
            if what == "logits_biased"
                && let Some(bias) = node.src(1).filter(Tensor::is_leaf)
                && let Some(r) = self.routers.get_mut(&il)
            {
                r.bias = Some(bias.handle());
            }
        }
        if !node.is_mul_mat_id() {
            return;
        }
        if let Some(src) = node.src(0)
            && let Some((layer, suffix)) = parse_expert_tensor(src.name())
            && src.ne()[2] > 0
        {
            self.order_of(layer as usize).first_matmul.get_or_insert(at);
            self.captured.entry((layer, suffix)).or_insert_with(|| CapturedTensor {
                layer,
                suffix,
                name: src.name().to_string(),
                handle: src.handle(),
                ne: src.ne(),
                nb: src.nb(),
                type_id: src.type_id(),
            });
        }
    }

    /// Reads the routed ids of a topk node, token-major, stride-aware.
    fn gather_ids(&mut self, node: Tensor<'_>) -> Option<(usize, usize)> {
        let ne = node.ne();
        let nb = node.nb();
        let (k, nt) = (usize::try_from(ne[0]).ok()?, usize::try_from(ne[1]).ok()?);
        self.ids.clear();
        for j in 0..nt {
            for s in 0..k {
                self.ids.push(node.read_i32(j * nb[1] + s * nb[0])?);
            }
        }
        Some((k, nt))
    }

    /// Byte offsets of (token, slot) in a weights node: `[1, k, nt]` or `[k, nt]`.
    fn weight_strides(node: Tensor<'_>, k: usize, nt: usize) -> Option<(usize, usize)> {
        let (ne, nb) = (node.ne(), node.nb());
        if ne[1] == k as i64 && ne[2] == nt as i64 {
            Some((nb[1], nb[2]))
        } else if ne[0] == k as i64 && ne[1] == nt as i64 {
            Some((nb[0], nb[1]))
        } else {
            None
        }
    }

    fn on_topk(&mut self, node: Tensor<'_>, il: usize) {
        let Some((k, nt)) = self.gather_ids(node) else {
            return self.fail(format!("layer {il}: cannot read the routed expert ids"));
        };
        // A layer index that does not increase starts the next ubatch.
        if self.last_layer.is_none_or(|last| il <= last) {
            self.token_base += self.ubatch_tokens;
            self.ubatch_tokens = nt as u32;
        }
        self.last_layer = Some(il);
        if nt == 0 {
            return;
        }
        self.top_k = Some(k);
        // Rows of a layer that saw fewer tokens than the ubatch (the last
        // layer computes only output rows) belong to the batch's last tokens.
        let first_token =
            if (nt as u32) < self.ubatch_tokens { self.batch_tokens - nt as u32 } else { self.token_base };
        self.dropped.clear();
        self.dropped.resize(k * nt, false);
        if self.decode_phase {
            let resting = self.layers_all_resident >= PREDICT_REST_LAYERS;
            if self.predictor.is_some() && !self.read_ahead_paused && !resting {
                self.predict_next(node, il, k, nt, false);
            }
            self.score_prediction(il);
        } else if self.reads_ahead_in_prompts() {
            self.predict_next(node, il, k, nt, true);
            self.score_prediction(il);
        }
        // Drafts skip uncached experts in prompts too: a turn's first draft
        // feeds the whole prompt through the MTP layer.
        if (self.dropper.is_some() && self.decode_phase) || self.drafts_with_cached() {
            self.deferred = Some(Deferred { layer: il, k, tokens: nt, first_token });
            return;
        }
        let first_row = self.trace.rows.len();
        self.load_and_record(il, k, nt, first_token);
        self.read_ahead_after(il);
        self.read_ahead_in_prompt(il);
        self.pending = Some((il, first_row, nt, k));
    }

    /// Compares the experts predicted for layer `il` with what it routed.
    fn score_prediction(&mut self, il: usize) {
        let Some(predicted) = self.predicted.get_mut(il).filter(|p| !p.is_empty()) else { return };
        let mut routed: Vec<u32> = self.ids.iter().map(|&e| e as u32).collect();
        routed.sort_unstable();
        routed.dedup();
        let right = routed.iter().filter(|e| predicted.contains(e)).count() as u32;
        predicted.clear();
        self.trace.predictions.push(PredictionScore { layer: il as u32, routed: routed.len() as u32, right });
    }

    /// True when prompt chunks read ahead (router prediction on, the store
    /// able to read in the background).
    fn reads_ahead_in_prompts(&self) -> bool {
        self.read_ahead.prefill
            && self.predictor.is_some()
            && self.error.is_none()
            && self.store.as_ref().is_some_and(|s| s.can_prefetch() && !s.holds_whole_bank())
    }

    /// Runs the routers of the next streamed layers (as many as the
    /// read-ahead asks) on layer `il`'s input, for each of the batch's
    /// tokens, and remembers the union of their top-k: the nearest one's in
    /// `predicted` (scored against its routing), farther ones in
    /// `predicted_far`. Layers without experts in between (dense layers of
    /// an architecture with MoE on some layers only) are skipped. A decode
    /// step predicts for up to a few tokens; a prompt chunk (`prompt`)
    /// predicts the next layer only, for every token of the ubatch, and
    /// never the last streamed layer, where llama.cpp computes only the rows
    /// whose logits are asked for.
    fn predict_next(&mut self, topk: Tensor<'_>, il: usize, k: usize, nt: usize, prompt: bool) {
        let Some(store) = self.store.as_ref() else { return };
        // Nothing to read ahead once the cache holds the whole bank.
        if (nt > MAX_PREDICTED_TOKENS && !prompt) || store.holds_whole_bank() {
            return;
        }
        let Some(input) = router_input(topk, il) else { return };
        // The layers predicted: the next streamed ones (or this one, when
        // checking the predictor).
        let ahead = &mut self.ahead;
        ahead.clear();
        if self.predict_distance == 0 {
            ahead.push(il);
        } else if prompt {
            let mut next = store.streamed_after(il).peekable();
            if let Some(n) = next.next().filter(|_| next.peek().is_some()) {
                ahead.push(n);
            }
        } else {
            ahead.extend(store.streamed_after(il).take(decode_reach(self.read_ahead.router, nt)));
        }
        self.predict_ahead(input, k, nt);
    }

    /// Runs the routers of the layers in `self.ahead` on `input` (one
    /// hidden state of `n_embd` f32 per token of the batch) and remembers
    /// the union of their top-k: the first layer's in `predicted` (scored
    /// against its routing), later ones' in `predicted_far`. Layers whose
    /// routers take another width are left out, with every layer after them.
    fn predict_ahead(&mut self, input: Tensor<'_>, k: usize, nt: usize) {
        let Some(predictor) = self.predictor.as_mut() else { return };
        let [width, tokens, ..] = input.ne();
        if input.type_id() != GGML_TYPE_F32 || tokens != nt as i64 {
            self.ahead.clear();
            return;
        }
        let ahead = &mut self.ahead;
        let fits = ahead.iter().take_while(|&&n| predictor.width(n).is_some_and(|w| w as i64 == width)).count();
        ahead.truncate(fits);
        let (Some(&first), Some(&last)) = (ahead.first(), ahead.last()) else { return };
        let width = width as usize;
        for table in [&mut self.predicted, &mut self.predicted_far] {
            if table.len() <= last {
                table.resize_with(last + 1, Vec::new);
            }
        }
        for &next in ahead.iter() {
            prediction_slot(&mut self.predicted, &mut self.predicted_far, first, next).clear();
        }
        // Each token's hidden state is read once for every layer predicted.
        let nb = input.nb();
        for j in 0..nt {
            self.hidden.clear();
            self.hidden.extend((0..width).map(|i| input.read_f32(j * nb[1] + i * nb[0]).unwrap_or(0.0)));
            let rms = (self.hidden.iter().map(|x| x * x).sum::<f32>() / width as f32).sqrt();
            for &next in ahead.iter() {
                let out = prediction_slot(&mut self.predicted, &mut self.predicted_far, first, next);
                predictor.predict(next, &self.hidden, rms.max(f32::MIN_POSITIVE), k, out);
            }
        }
        for &next in ahead.iter() {
            let out = prediction_slot(&mut self.predicted, &mut self.predicted_far, first, next);
            out.sort_unstable();
            out.dedup();
        }
    }

    /// True when the step's token embeddings are worth reading: the router
    /// prediction is on and awake, and the store reads in the background.
    fn predicts_from_embedding(&self) -> bool {
        let awake = self.layers_all_resident < PREDICT_REST_LAYERS && !self.read_ahead_paused;
        self.predictor.is_some()
            && self.predict_distance > 0
            && self.top_k.is_some()
            && if self.decode_phase { awake && self.read_ahead_active() } else { self.reads_ahead_in_prompts() }
    }

    /// At the start of a step, runs the routers of the first streamed
    /// layers on the new tokens' embeddings and starts reading their picks
    /// while the first layer's attention computes: no earlier layer's
    /// hidden state exists to predict them from. The embedding is the
    /// first layer's residual input, so its router ranks the experts much
    /// as the layer will once attention has added its part; a wrong guess
    /// costs only a read. A decode step predicts as many layers as the
    /// router read-ahead reaches, a prompt chunk the first layer only (for
    /// every token of the ubatch, when a later streamed layer exists).
    fn on_embedding(&mut self, attn_norm: Tensor<'_>) {
        let Some((embd, _)) = normed(attn_norm) else { return };
        let (Some(k), Some(store)) = (self.top_k, self.store.as_ref()) else { return };
        let nt = usize::try_from(embd.ne()[1]).unwrap_or(0);
        let prompt = !self.decode_phase;
        if nt == 0 || (nt > MAX_PREDICTED_TOKENS && !prompt) {
            return;
        }
        let layers = store.streamed_layers();
        let reach = if prompt { usize::from(layers.len() > 1) } else { decode_reach(self.read_ahead.router, nt) };
        self.ahead.clear();
        self.ahead.extend(layers.iter().take(reach));
        self.predict_ahead(embd, k, nt);
        let mut targets = Vec::with_capacity(self.ahead.len());
        for (d, &layer) in self.ahead.iter().enumerate() {
            let table = if d == 0 { &self.predicted } else { &self.predicted_far };
            if let Some(p) = table.get(layer).filter(|p| !p.is_empty()) {
                targets.push((layer, p.clone()));
            }
        }
        let Some(store) = self.store.as_mut().filter(|_| !targets.is_empty()) else { return };
        store.begin_step();
        let result = store.prefetch(&targets);
        if let Some(r) = self.record_prefetch(None, result)
            && self.decode_phase
        {
            self.layers_all_resident = if r.entries == 0 { self.layers_all_resident + 1 } else { 0 };
        }
    }

    /// Starts reading what the coming layers will probably route, while
    /// layer `il` computes (decode only).
    fn read_ahead_after(&mut self, il: usize) {
        if !self.decode_phase || !self.read_ahead.any() || self.error.is_some() {
            return;
        }
        if self.read_ahead_paused {
            // Temporal read-ahead resumes from the next step's routing.
            self.last_routed.iter_mut().for_each(Vec::clear);
            return;
        }
        // The next streamed layers, nearest first (dense layers between
        // them have nothing to read).
        let Some(store) = self.store.as_ref() else { return };
        let reach = self.read_ahead.layers.max(self.read_ahead.router) as usize;
        self.ahead.clear();
        self.ahead.extend(store.streamed_after(il).take(reach));
        let mut targets: Vec<(usize, Vec<u32>)> = Vec::new();
        for &layer in self.ahead.iter().take(self.read_ahead.layers as usize) {
            if let Some(prev) = self.last_routed.get(layer).filter(|p| !p.is_empty()) {
                targets.push((layer, prev.clone()));
            }
        }
        let predictions =
            self.ahead.iter().take(self.read_ahead.router as usize).enumerate().filter_map(|(d, &layer)| {
                let table = if d == 0 { &self.predicted } else { &self.predicted_far };
                table.get(layer).filter(|p| !p.is_empty()).map(|p| (layer, p))
            });
        for (layer, p) in predictions {
            match targets.iter_mut().find(|(t, _)| *t == layer) {
                Some((_, experts)) => experts.extend(p.iter().filter(|e| !experts.contains(e)).collect::<Vec<_>>()),
                None => targets.push((layer, p.clone())),
            }
        }
        // Nearest layer first: the lanes read in this order.
        targets.sort_by_key(|(layer, _)| *layer);
        if self.read_ahead.layers > 0 {
            if self.last_routed.len() <= il {
                self.last_routed.resize_with(il + 1, Vec::new);
            }
            let routed = &mut self.last_routed[il];
            routed.clear();
            routed.extend(self.ids.iter().zip(&self.dropped).filter(|(_, d)| !**d).map(|(&e, _)| e as u32));
            routed.sort_unstable();
            routed.dedup();
        }
        let Some(store) = self.store.as_mut().filter(|_| !targets.is_empty()) else { return };
        let result = store.prefetch(&targets);
        if let Some(r) = self.record_prefetch(Some(il), result) {
            self.layers_all_resident = if r.entries == 0 { self.layers_all_resident + 1 } else { 0 };
        }
    }

    /// Adds what a read-ahead started after layer `after` (at the step's
    /// start: `None`) to the step's trace, or fails the step on its error.
    fn record_prefetch(
        &mut self,
        after: Option<usize>,
        result: std::io::Result<PrefetchReport>,
    ) -> Option<PrefetchReport> {
        match result {
            Ok(r) => {
                let t = &mut self.trace;
                t.cache_peak = t.cache_peak.max(r.resident);
                t.prefetched += r.entries;
                t.evictions += r.evictions;
                t.recycled_bytes += r.recycled_bytes;
                t.mgmt_ns += r.mgmt_ns;
                Some(r)
            }
            Err(e) => {
                let when = after.map_or("at the step's start".to_string(), |il| format!("after layer {il}"));
                self.fail(format!("expert read-ahead failed {when}: {e}"));
                None
            }
        }
    }

    /// In a prompt chunk, starts reading what the next layer's router picks
    /// for the ubatch's tokens (predicted at this layer's routing) while
    /// this layer computes.
    fn read_ahead_in_prompt(&mut self, il: usize) {
        if self.decode_phase || !self.reads_ahead_in_prompts() {
            return;
        }
        let Some(store) = self.store.as_mut() else { return };
        let Some(next) = store.streamed_after(il).next() else { return };
        let Some(experts) = self.predicted.get(next).filter(|p| !p.is_empty()) else { return };
        let result = store.prefetch(&[(next, experts.clone())]);
        self.record_prefetch(Some(il), result);
    }

    fn on_weights(&mut self, node: Tensor<'_>, il: usize) {
        if let Some(d) = self.deferred.take() {
            if d.layer != il {
                return self.fail(format!("layer {}: its weights node did not follow its routing", d.layer));
            }
            let (k, nt) = (d.k, d.tokens);
            self.weights.clear();
            self.weights.resize(k * nt, f32::NAN);
            if let Some((slot, token)) = Self::weight_strides(node, k, nt) {
                for j in 0..nt {
                    for s in 0..k {
                        self.weights[j * k + s] = node.read_f32(j * token + s * slot).unwrap_or(f32::NAN);
                    }
                }
                self.apply_drops(node, il, k, nt, (slot, token));
            }
            let first_row = self.trace.rows.len();
            self.load_and_record(il, k, nt, d.first_token);
            for (row, w) in self.trace.rows[first_row..].iter_mut().zip(&self.weights) {
                row.weight = *w;
            }
            self.read_ahead_after(il);
            return;
        }
        let Some((layer, first, nt, k)) = self.pending.take() else { return };
        if layer != il {
            return;
        }
        let Some((slot, token)) = Self::weight_strides(node, k, nt) else { return };
        for j in 0..nt {
            for s in 0..k {
                if let Some(w) = node.read_f32(j * token + s * slot) {
                    self.trace.rows[first + j * k + s].weight = w;
                }
            }
        }
    }

    /// True when the current decode is the draft context's and drafts with
    /// the cached experts only.
    fn drafts_with_cached(&self) -> bool {
        self.side_batch && self.draft_experts == MtpExperts::Cached
    }

    /// Asks the drop policy (in the draft context drafting with cached
    /// experts: the cache) about each token; writes zeroed weights and
    /// repointed ids of dropped slots back into the graph.
    fn apply_drops(&mut self, weights: Tensor<'_>, il: usize, k: usize, nt: usize, strides: (usize, usize)) {
        let cached_only = self.drafts_with_cached();
        let Some(store) = self.store.as_ref() else { return };
        let mut dropper = self.dropper.as_mut().filter(|_| !cached_only);
        if dropper.is_none() && !cached_only {
            return;
        }
        let Some(topk) = weights.find_source(&format!("ffn_moe_topk-{il}"), 8) else { return };
        let (id_slot, id_token) = (topk.nb()[0], topk.nb()[1]);
        let mut experts = Vec::with_capacity(k);
        let mut resident = Vec::with_capacity(k);
        for j in 0..nt {
            let row = j * k..(j + 1) * k;
            experts.clear();
            experts.extend(self.ids[row.clone()].iter().map(|&e| e as u32));
            resident.clear();
            resident.extend(experts.iter().map(|&e| store.is_resident(il, e)));
            let w = &self.weights[row.clone()];
            let mask = match dropper.as_mut() {
                Some(dropper) => {
                    let call =
                        DropCall { layer: il as u32, experts: &experts, weights: w, resident: &resident, k: k as u32 };
                    let Some(mask) = dropper.decide(&call) else { continue };
                    mask
                }
                None => cached_mask(&resident, w),
            };
            let total: f32 = w.iter().sum();
            let kept: f32 = w.iter().zip(&mask).filter(|(_, d)| !**d).map(|(x, _)| x).sum();
            // The kept slot with the largest weight takes the dropped slots' ids.
            let best = (0..k).filter(|&s| !mask[s]).fold(None, |b: Option<usize>, s| match b {
                Some(b) if w[b] >= w[s] => Some(b),
                _ => Some(s),
            });
            let Some(best) = best else { continue };
            let scale = if kept > 0.0 { total / kept } else { 1.0 };
            for s in 0..k {
                let new_weight = if mask[s] { 0.0 } else { w[s] * scale };
                let ok_w = weights.write_f32(j * strides.1 + s * strides.0, new_weight);
                let ok_id = !mask[s] || topk.write_i32(j * id_token + s * id_slot, self.ids[j * k + best]);
                if !(ok_w && ok_id) {
                    return self.fail(format!("layer {il}: cannot apply the drop decision to the graph"));
                }
            }
            self.dropped[row].copy_from_slice(&mask);
        }
    }

    /// Loads the layer's routed experts (ids in `self.ids`; dropped slots
    /// excluded) and appends one row per (token, slot).
    fn load_and_record(&mut self, il: usize, k: usize, nt: usize, first_token: u32) {
        let Some(store) = self.store.as_mut() else { return };
        self.residency.clear();
        self.residency.resize(store.n_expert(), (false, false));
        for &e in &self.ids {
            if let Some(r) = usize::try_from(e).ok().and_then(|e| self.residency.get_mut(e)) {
                r.0 = store.is_resident(il, e as u32);
            }
        }
        let load: Vec<i32> = self.ids.iter().zip(&self.dropped).filter(|(_, d)| !**d).map(|(&e, _)| e).collect();
        let report = match store.load_layer(il, &load) {
            Ok(r) => r,
            Err(e) => return self.fail(format!("expert stream failed in layer {il}: {e}")),
        };
        let entry = store.entry_bytes(il);
        let t = &mut self.trace;
        t.cache_peak = t.cache_peak.max(store.resident_bytes());
        t.bytes_read += report.read.bytes;
        t.window_bytes += report.read.window_bytes;
        t.bounced_slices += report.read.bounced;
        t.fixed_slices += report.read.fixed;
        t.read_ns += report.read_ns;
        t.mgmt_ns += report.mgmt_ns;
        t.lookups += report.experts.len() as u64;
        let hits = report.experts.iter().filter(|(_, h)| *h).count();
        t.hits += hits as u64;
        if hits < report.experts.len() {
            self.layers_all_resident = 0;
        }
        t.evictions += report.evictions;
        t.recycled_bytes += report.recycled_bytes;
        t.prefetch_used += report.prefetch_used;
        let loaded: Vec<u32> = report.experts.iter().map(|(e, _)| *e).collect();
        let mut avoided = Vec::new();
        for j in 0..nt {
            for s in 0..k {
                let e = self.ids[j * k + s] as u32;
                let dropped = self.dropped[j * k + s];
                let (hit, charged) = self.residency[e as usize];
                let bytes = if charged || hit || dropped { 0 } else { entry };
                if !dropped {
                    self.residency[e as usize].1 = true;
                } else {
                    t.dropped += 1;
                    if !hit && !loaded.contains(&e) && !avoided.contains(&e) {
                        avoided.push(e);
                    }
                }
                t.rows.push(RouteRow {
                    token: first_token + j as u32,
                    layer: il as u32,
                    slot: s as u32,
                    expert: e,
                    weight: f32::NAN,
                    hit,
                    bytes,
                    dropped,
                });
            }
        }
        t.avoided_bytes += avoided.len() as u64 * entry;
    }
}

impl EvalHook for MoeHook {
    fn ask(&mut self, node: Tensor<'_>) -> bool {
        match self.mode {
            Mode::Capture => {
                self.capture(node);
                false
            }
            Mode::Stream => {
                // The scheduler asks about a split's nodes just before it
                // runs the split: the first remote one starts the part of
                // the step on RPC servers.
                if self.has_remote_nodes && self.remote_since.is_none() && !node.is_host() {
                    self.remote_since = Some(Instant::now());
                }
                if node.name() == EMBEDDING_NODE {
                    return self.predicts_from_embedding();
                }
                let Some((what, il)) = parse_moe_node(node.name()) else { return false };
                let Some(store) = &self.store else { return false };
                if !store.has_layer(il) {
                    return false;
                }
                what == "topk"
                    || (self.record_weights || self.dropper.is_some() || self.drafts_with_cached())
                        && self.order.get(il).and_then(|o| o.weights).is_some_and(|(_, k)| WEIGHT_NODES[k] == what)
            }
        }
    }

    fn observe(&mut self, node: Tensor<'_>) {
        if self.error.is_some() {
            return;
        }
        if node.name() == EMBEDDING_NODE {
            return self.on_embedding(node);
        }
        let Some((what, il)) = parse_moe_node(node.name()) else { return };
        if what == "topk" {
            self.on_topk(node, il);
        } else {
            self.on_weights(node, il);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{cached_mask, decode_reach, parse_moe_node};

    #[test]
    fn verify_batches_read_ahead_one_layer() {
        assert_eq!(decode_reach(2, 1), 2);
        assert_eq!(decode_reach(0, 1), 1);
        assert_eq!((decode_reach(2, 2), decode_reach(3, 4)), (1, 1));
    }

    #[test]
    fn cached_drafts_keep_what_is_resident_or_the_top_slot() {
        assert_eq!(cached_mask(&[true, false, true], &[0.2, 0.5, 0.3]), [false, true, false]);
        assert_eq!(cached_mask(&[false, false, false], &[0.2, 0.5, 0.3]), [true, false, true]);
        assert_eq!(cached_mask(&[true, true], &[0.6, 0.4]), [false, false]);
    }

    #[test]
    fn node_names() {
        assert_eq!(parse_moe_node("ffn_moe_topk-12"), Some(("topk", 12)));
        assert_eq!(parse_moe_node("ffn_moe_weights_norm-0"), Some(("weights_norm", 0)));
        assert_eq!(parse_moe_node("ffn_moe_weights_norm-0 (reshaped)"), None);
        assert_eq!(parse_moe_node("ffn_moe_topk-"), None);
        assert_eq!(parse_moe_node("attn_norm-3"), None);
    }
}
