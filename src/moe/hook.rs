//! The eval hook: captures the expert tensors during a warm-up decode, then
//! isolates each layer's `ffn_moe_topk-<il>` node, gathers the routed ids
//! through the view's strides and loads exactly those experts before the
//! layer's expert matmuls run. It also reads the layer's final routing
//! weights for telemetry.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::recipe::parse_expert_tensor;
use super::store::ExpertStore;
use crate::llama::{EvalHook, Tensor, TensorHandle};

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

/// Splits `ffn_moe_<what>-<il>` into (what, il).
fn parse_moe_node(name: &str) -> Option<(&str, usize)> {
    let rest = name.strip_prefix("ffn_moe_")?;
    let (what, il) = rest.rsplit_once('-')?;
    if il.is_empty() || !il.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((what, il.parse().ok()?))
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
    /// Expert id.
    pub expert: u32,
    /// Final applied router weight (NaN when the graph exposed none).
    pub weight: f32,
    /// The expert was resident before this layer's load.
    pub hit: bool,
    /// Bytes read for this expert (charged on its first row in the load).
    pub bytes: u64,
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
    /// Time blocked on reads.
    pub read_ns: u64,
    /// Cache management time.
    pub mgmt_ns: u64,
    /// Distinct (layer, expert) lookups.
    pub lookups: u64,
    /// Lookups that found the expert resident.
    pub hits: u64,
    /// Cache entries evicted.
    pub evictions: u64,
}

enum Mode {
    /// Warm-up: record expert tensors and weight-chain nodes, isolate nothing.
    Capture,
    /// Generation: load experts at each topk node.
    Stream,
}

/// The MoE eval hook.
pub struct MoeHook {
    mode: Mode,
    captured: BTreeMap<(u32, usize), CapturedTensor>,
    /// Per layer, the index in WEIGHT_NODES of the last weight node (the applied weights).
    weight_node: Vec<Option<usize>>,
    store: Option<ExpertStore>,
    abort: Arc<AtomicBool>,
    error: Option<String>,
    trace: StepTrace,
    /// Tokens of the current ubatch seen so far in earlier ubatches of this decode.
    token_base: u32,
    ubatch_tokens: u32,
    last_layer: Option<usize>,
    batch_tokens: u32,
    /// Rows of the current layer awaiting their weights: (first row, tokens, top-k).
    pending: Option<(usize, usize, usize, usize)>,
    /// Scratch: the routed ids of the current layer, token-major.
    ids: Vec<i32>,
    /// Scratch: per expert of the current load, (was resident, read charged).
    residency: Vec<(bool, bool)>,
}

impl MoeHook {
    /// A hook in capture mode; `abort` is raised if streaming fails mid-decode.
    pub fn new(abort: Arc<AtomicBool>) -> MoeHook {
        MoeHook {
            mode: Mode::Capture,
            captured: BTreeMap::new(),
            weight_node: Vec::new(),
            store: None,
            abort,
            error: None,
            trace: StepTrace::default(),
            token_base: 0,
            ubatch_tokens: 0,
            last_layer: None,
            batch_tokens: 0,
            pending: None,
            ids: Vec::new(),
            residency: Vec::new(),
        }
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

    /// Prepares for a decode of `tokens` tokens.
    pub fn begin_batch(&mut self, tokens: u32) {
        self.trace = StepTrace::default();
        self.token_base = 0;
        self.ubatch_tokens = 0;
        self.last_layer = None;
        self.batch_tokens = tokens;
        self.pending = None;
    }

    /// Takes what the last decode did.
    pub fn take_trace(&mut self) -> StepTrace {
        std::mem::take(&mut self.trace)
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

    fn capture(&mut self, node: Tensor<'_>) {
        // The last weight node of a layer in graph order holds the applied weights.
        if let Some((what, il)) = parse_moe_node(node.name())
            && let Some(k) = WEIGHT_NODES.iter().position(|w| *w == what)
        {
            if self.weight_node.len() <= il {
                self.weight_node.resize(il + 1, None);
            }
            self.weight_node[il] = Some(k);
        }
        if !node.is_mul_mat_id() {
            return;
        }
        if let Some(src) = node.src(0)
            && let Some((layer, suffix)) = parse_expert_tensor(src.name())
            && src.ne()[2] > 0
        {
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
        let Some(store) = self.store.as_mut() else { return };
        let report = match store.load_layer(il, &self.ids) {
            Ok(r) => r,
            Err(e) => return self.fail(format!("expert stream failed in layer {il}: {e}")),
        };
        let t = &mut self.trace;
        t.bytes_read += report.read.bytes;
        t.window_bytes += report.read.window_bytes;
        t.read_ns += report.read_ns;
        t.mgmt_ns += report.mgmt_ns;
        t.lookups += report.experts.len() as u64;
        t.hits += report.experts.iter().filter(|(_, h)| *h).count() as u64;
        t.evictions += report.evictions;
        let entry = store.entry_bytes(il);
        // Rows of a layer that saw fewer tokens than the ubatch (the last
        // layer computes only output rows) belong to the batch's last tokens.
        let first_token =
            if (nt as u32) < self.ubatch_tokens { self.batch_tokens - nt as u32 } else { self.token_base };
        let first_row = t.rows.len();
        // Per expert of this load: was it resident, and has its read been charged to a row yet?
        self.residency.clear();
        self.residency.resize(store.n_expert(), (false, false));
        for &(e, hit) in &report.experts {
            self.residency[e as usize] = (hit, hit);
        }
        for j in 0..nt {
            for s in 0..k {
                let e = self.ids[j * k + s] as u32;
                let (hit, charged) = self.residency[e as usize];
                let bytes = if charged { 0 } else { entry };
                self.residency[e as usize].1 = true;
                t.rows.push(RouteRow {
                    token: first_token + j as u32,
                    layer: il as u32,
                    slot: s as u32,
                    expert: e,
                    weight: f32::NAN,
                    hit,
                    bytes,
                });
            }
        }
        self.pending = Some((il, first_row, nt, k));
    }

    fn on_weights(&mut self, node: Tensor<'_>, il: usize) {
        let Some((layer, first, nt, k)) = self.pending.take() else { return };
        if layer != il {
            return;
        }
        let ne = node.ne();
        let nb = node.nb();
        // [1, k, nt] (token stride nb[2], slot nb[1]) or [k, nt] (nb[1], nb[0]).
        let (slot_stride, token_stride) = if ne[1] == k as i64 && ne[2] == nt as i64 {
            (nb[1], nb[2])
        } else if ne[0] == k as i64 && ne[1] == nt as i64 {
            (nb[0], nb[1])
        } else {
            return;
        };
        for j in 0..nt {
            for s in 0..k {
                if let Some(w) = node.read_f32(j * token_stride + s * slot_stride) {
                    self.trace.rows[first + j * k + s].weight = w;
                }
            }
        }
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
                let Some((what, il)) = parse_moe_node(node.name()) else { return false };
                let Some(store) = &self.store else { return false };
                if !store.has_layer(il) {
                    return false;
                }
                what == "topk" || self.weight_node.get(il).copied().flatten().is_some_and(|k| WEIGHT_NODES[k] == what)
            }
        }
    }

    fn observe(&mut self, node: Tensor<'_>) {
        if self.error.is_some() {
            return;
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
    use super::parse_moe_node;

    #[test]
    fn node_names() {
        assert_eq!(parse_moe_node("ffn_moe_topk-12"), Some(("topk", 12)));
        assert_eq!(parse_moe_node("ffn_moe_weights_norm-0"), Some(("weights_norm", 0)));
        assert_eq!(parse_moe_node("ffn_moe_weights_norm-0 (reshaped)"), None);
        assert_eq!(parse_moe_node("ffn_moe_topk-"), None);
        assert_eq!(parse_moe_node("attn_norm-3"), None);
    }
}
