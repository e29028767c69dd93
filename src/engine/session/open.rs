//! Opening a session: loading the model (whole, or from its lean copy),
//! placing layers on RPC servers, and, when streaming, capturing the
//! expert tensors, sizing the cache and rebinding the experts to bmoe's
//! memory.

use super::*;
use crate::llama::invariant_sgemm;
use crate::moe::profile;

impl Session {
    /// Loads the model and, when streaming, captures and rebinds its experts.
    pub fn open(options: SessionOptions) -> Result<Session, EngineError> {
        let start = Instant::now();
        let read_before = crate::telemetry::mem::storage_read_bytes();
        let files = ModelFiles::open(&options.model)?;
        let meta = files.meta();
        let arch = meta
            .architecture()
            .ok_or_else(|| {
                EngineError::Unsupported(format!("{}: no general.architecture key", options.model.display()))
            })?
            .to_string();
        let n_expert = meta.arch_u64("expert_count").unwrap_or(0) as u32;
        let mut n_expert_used = meta.arch_u64("expert_used_count").unwrap_or(0) as u32;
        let mut overrides = Vec::new();
        if let Some(k) = options.n_expert_used {
            if n_expert == 0 || k == 0 || k > n_expert {
                return Err(EngineError::Request(format!(
                    "--n-expert-used {k} is not possible: the model has {n_expert} experts per layer"
                )));
            }
            overrides.push((format!("{arch}.expert_used_count"), i64::from(k)));
            n_expert_used = k;
        }
        let mtp_layers = meta.arch_u64("nextn_predict_layers").unwrap_or(0);
        if options.mtp.is_some() && mtp_layers == 0 {
            return Err(EngineError::Request(format!(
                "--mtp: {} has no MTP layers ({arch}.nextn_predict_layers is 0 or missing); drafting needs a model \
                 that ships them (GLM-4.5+, DeepSeek-V3), or use a draft plugin",
                options.model.display()
            )));
        }
        let run = crate::gguf::RunShape {
            expert_used_count: options.n_expert_used.map(u64::from),
            mtp: options.mtp.is_some(),
        };
        crate::gguf::check_model(&files, &run)
            .map_err(|e| EngineError::Unsupported(format!("{}: {e}", options.model.display())))?;
        let mut notices = Vec::new();
        if options.stream.is_some() {
            if n_expert == 0 {
                return Err(EngineError::Unsupported(format!(
                    "{arch} model has no experts to stream ({arch}.expert_count is missing or 0); run with \
                     --moe-stream=off"
                )));
            }
            if let Some(why) = recipe::refusal(&arch) {
                return Err(EngineError::Unsupported(format!(
                    "cannot stream architecture {arch}: {why}; run with --moe-stream=off"
                )));
            }
            capability::check_file(&files).map_err(|e| {
                EngineError::Unsupported(format!("cannot stream this {arch} file: {e}; run with --moe-stream=off"))
            })?;
            if let Some(note) = recipe::ungated_notice(&arch) {
                notices.push(note);
            }
        }
        let remote = match &options.rpc {
            Some(rpc) => place_remote(rpc, &files, &options, &mut notices)?,
            None => RemoteLayers::default(),
        };
        // Under MTP drafting too: the draft graph's experts stream, and its
        // other reads are checked against the copy's holes like the trunk's.
        // Not with layers on RPC servers: llama.cpp uploads theirs from the
        // file it loads, and a lean copy's experts are holes.
        let lean = options
            .stream
            .as_ref()
            .and_then(|s| s.lean.as_ref())
            .filter(|_| remote.total() == 0)
            .and_then(|l| lean_copy(&files, l, &mut notices));
        let load_path = lean.as_ref().map_or(options.model.as_path(), |l| l.paths[0].as_path());
        let memory = MemoryLimits::read().tightest();
        // `--repack auto` streams repacked only from a whole repacked copy.
        let from_copy = options.stream.as_ref().is_some_and(|s| {
            s.repacked_copy
                .as_ref()
                .is_some_and(|dir| crate::moe::repacked::whole_copy_expected(&files, dir, s.repacked_copy_max_bytes))
        });
        // An RPC server computes its layers' banks in the file's layout (it
        // has no repacked buffers), and a repacked kernel rounds differently:
        // with layers there, the banks here keep that layout too, so the
        // output is the single-process `--repack off` run's, bit for bit.
        let repack = remote.total() == 0 && options.repack.applies(files.total_bytes(), memory, from_copy);
        // A resident run has llama.cpp repack the banks as it loads them; a
        // streamed one reads them repacked from a copy, or repacks each
        // slice as it reads it (`attach_stream`).
        let resident_banks = if repack && options.stream.is_none() { repackable_banks(&files) } else { Vec::new() };
        // A batch-invariant run takes llamafile's sgemm order for its dense
        // f16 and f32 matmuls at every width (src/llama/invariant_sgemm.rs);
        // not with layers on RPC servers, whose weights stay where llama.cpp
        // puts them.
        let invariant = if options.batch_invariant && remote.total() == 0 && invariant_sgemm::available() {
            invariant_sgemm::name_patterns(&invariant_sgemm::invariant_weights(&files))
        } else {
            Vec::new()
        };
        let model = Arc::new(
            Model::load(
                load_path,
                &overrides,
                &name_patterns(&resident_banks),
                &invariant,
                options.mtp.is_some(),
                &remote,
            )
            .map_err(|e| EngineError::Llama(e.to_string()))?,
        );
        let abort = Arc::new(AtomicBool::new(false));
        let hook = options.stream.as_ref().map(|_| Box::new(MoeHook::new(abort.clone())));
        if options.mtp.is_some() && model.has_recurrent_state() {
            return Err(EngineError::Unsupported(format!(
                "--mtp: {arch} keeps a recurrent state, which cannot drop the drafts the model rejects; run without \
                 --mtp"
            )));
        }
        // Several sequences that can copy their cells get a spare one to
        // exchange them through (`Session::seq_swap`).
        let spare_seq = options.sequences > 1 && !model.has_recurrent_state();
        let params = ContextParams {
            n_ctx: options.ctx_size,
            n_batch: options.batch,
            n_ubatch: options.ubatch,
            n_threads: options.threads,
            n_seq: options.sequences,
            spare_seq,
            batch_invariant: options.batch_invariant,
        };
        let mut ctx = Context::new(model.clone(), params, hook, abort.clone()).map_err(EngineError::Llama)?;
        if remote.total() > 0 {
            // The connections the model's and the context's remote buffers hold.
            rpc::close_sockets_on_exec();
        }
        // Attached before anything is decoded: the warm-up below captures
        // the MTP layer's experts too, and they stream like the trunk's.
        if let Some(mtp) = options.mtp {
            ctx.attach_mtp(mtp).map_err(EngineError::Llama)?;
        }
        let mut info = OpenReport {
            arch,
            n_layer: model.n_layer(),
            n_expert,
            n_expert_used,
            layers: layer_bytes(&files, u64::from(n_expert)),
            repacked_banks: resident_banks.len() as u32,
            remote_layers: remote.total(),
            streaming: options.stream.is_some(),
            ..OpenReport::default()
        };
        if let Some(stream) = &options.stream {
            attach_stream(&mut ctx, &files, stream, repack, &mut info)?;
            if let (Some(mtp), Some(hook)) = (options.mtp, ctx.hook_mut()) {
                let experts = match mtp.experts {
                    MtpExperts::Cached if !hook.can_drop() => {
                        info.notices.push(
                            "MTP drafts read every routed expert: this graph's routing weights come after its first \
                             expert matmul, so a draft cannot skip the experts the cache lacks"
                                .into(),
                        );
                        MtpExperts::All
                    }
                    experts => experts,
                };
                hook.set_draft_experts(experts);
                if let Some(note) = mtp_width_note(&info, mtp.draft_max) {
                    info.notices.push(note);
                }
            }
            if let Some(copy) = &lean {
                finish_lean_open(&mut ctx, copy)?;
            }
        }
        info.notices.splice(0..0, notices);
        info.load_s = start.elapsed().as_secs_f64();
        info.open_read_bytes = read_before
            .zip(crate::telemetry::mem::storage_read_bytes())
            .map(|(before, after)| after.saturating_sub(before));
        info.open_peak_rss_mib = crate::telemetry::mem::peak_rss_mib();
        let can_read_ahead = ctx.hook_mut().is_some_and(|h| h.read_ahead_active());
        let tuner = options.tune.then(|| StepTuner::new(1, options.threads, can_read_ahead));
        let ctx_threads = options.threads;
        Ok(Session {
            ctx,
            abort,
            info,
            history: Vec::new(),
            pending: None,
            turn: 0,
            drafter: None,
            draft_max: 3,
            tuner,
            run_queue: Some(RunQueueDelay::new()),
            other_load: OtherLoad::new(),
            unread_ns: 0,
            queued_share: None,
            ctx_threads,
            force_polling: None,
            remote: remote.holding().map(|(d, _)| (d.endpoint.clone(), rpc::ConnectionWatch::new(d.addr))).collect(),
            other_seqs: vec![Vec::new(); options.sequences.max(1) as usize - 1],
            spare_seq: spare_seq.then_some(options.sequences as usize),
            profile_saved: Instant::now(),
            profile_save_every: PROFILE_SAVE_EVERY,
            options,
        })
    }
}

/// Captures the expert tensors with a warm-up decode, opens the read lanes,
/// rebinds the experts to engine memory and switches the hook to streaming.
fn attach_stream(
    ctx: &mut Context<MoeHook>,
    files: &ModelFiles,
    stream: &StreamOptions,
    repack: bool,
    info: &mut OpenReport,
) -> Result<(), EngineError> {
    let bos = ctx.model().tokenize("", true).first().copied().unwrap_or(0);
    ctx.decode(&[bos], 0, Logits::None)?;
    if ctx.has_mtp() {
        // One draft-context decode after it shows the MTP layer's experts
        // in the draft graph.
        ctx.mtp_follow().map_err(EngineError::Llama)?;
        ctx.mtp_warm_up(1, bos).map_err(EngineError::Llama)?;
    }
    ctx.clear_kv();
    let n_ctx = ctx.n_ctx();
    let n_trunk = ctx.model().n_layer() as usize;
    let hook = ctx.hook_mut().ok_or_else(|| EngineError::Llama("the context has no eval hook".into()))?;
    if let Some(gap) = hook.routing_gap() {
        return Err(EngineError::Unsupported(format!("cannot stream {}: {gap}; run with --moe-stream=off", info.arch)));
    }
    let mut banks = resolve_banks(hook.captured(), files, repack).map_err(EngineError::Unsupported)?;
    info.repacked_banks = banks.layers.iter().flatten().filter(|p| p.repacker.is_some()).count() as u32;
    let mut notices = Vec::new();
    let mut read_paths = files.paths().to_vec();
    let mut partial_copy = None;
    if let Some(dir) = stream.repacked_copy.as_ref().filter(|_| info.repacked_banks > 0) {
        match repacked::prepare(files, &banks.layers, banks.n_expert, dir, stream.repacked_copy_max_bytes) {
            Ok(copy) if copy.partial.is_some() => {
                let whole: u64 = banks.layers.iter().flatten().map(|p| (p.slice_bytes * banks.n_expert) as u64).sum();
                let partial = copy.partial.clone().expect("checked");
                let [whole, budget, used] = crate::units::sizes([whole, partial.budget(), partial.used()]);
                notices.push(format!(
                    "the repacked copy of the experts ({whole}) is over its disk budget of {budget} \
                     (moe.repacked_copy_max_gb): it holds {used}, and the experts read are added to it \
                     as they are repacked, while the budget lasts"
                ));
                partial_copy = Some((partial, read_paths.len()));
                read_paths.extend(copy.paths);
            }
            Ok(copy) => {
                if copy.written > 0 {
                    notices.push(format!(
                        "wrote a repacked copy of the experts ({}, the CPU's kernels' layout) to {}",
                        crate::units::size(copy.written),
                        copy.paths[0].parent().unwrap_or(dir).display()
                    ));
                }
                read_paths = copy.paths;
                banks.layers.iter_mut().flatten().for_each(|p| p.stored_repacked = p.repacker.is_some());
            }
            Err(e) => notices.push(format!(
                "no repacked copy of the experts ({e}): each is repacked as it is read, which costs CPU \
                 (--repack off is faster on few cores, with the file's layout)"
            )),
        }
    }
    let (lanes, lane_notices) = ReadLanes::open(&read_paths, stream.io_threads, stream.o_direct)
        .map_err(|e| EngineError::Stream(format!("opening read lanes: {e}")))?;
    notices.extend(lane_notices);
    let in_place = banks.layers.iter().flatten().any(|p| p.repacker.is_none() || p.stored_repacked);
    let mut details = Vec::new();
    if banks.unaligned && lanes.o_direct() && in_place {
        details.push(
            "expert slices are not 4096-byte aligned in this file: O_DIRECT reads each slice's enclosing \
             page window straight into place (the extra bytes are counted as window bytes)"
                .into(),
        );
    }
    info.streamed_layers = banks.layers.iter().filter(|l| !l.is_empty()).count() as u32;
    info.io_threads = lanes.lanes();
    info.o_direct = lanes.o_direct();
    // Router prediction fills the cache from spare lanes: without them it is
    // not set up at all. Set up before the process is measured, so the
    // budget leaves room for what it holds (the norm weights as f32; the
    // routers are scored where the model keeps them).
    let mut read_ahead = stream.read_ahead;
    if stream.cache == CacheBudget::Off || stream.io_threads < 2 {
        read_ahead.router = 0;
    }
    if read_ahead.router > 0 && !hook.can_predict_routers() {
        read_ahead.router = 0;
        notices.push(
            "router prediction is off: this graph's routers do not read a normalized hidden state bmoe can score \
             ahead (experts are still read as each layer routes)"
                .into(),
        );
    }
    hook.set_read_ahead(read_ahead).map_err(EngineError::Unsupported)?;
    // Measured before the dense weights move into anonymous memory: they
    // are counted once, as dense weights, not again as the process's own.
    let dense_mode = stream.dense.resolve(resident_dense_bytes(hook.dense(), files, DenseWeights::Anon, n_ctx));
    let dense_bytes = resident_dense_bytes(hook.dense(), files, dense_mode, n_ctx);
    let held = holdings(&banks, dense_bytes, files, info, n_ctx);
    let (tensors, bytes) = dense::apply(dense_mode, hook, files, &lanes).map_err(EngineError::Stream)?;
    let chosen = if stream.dense == DenseWeights::Auto { " (auto)" } else { "" };
    if tensors > 0 {
        let what = if dense_mode == DenseWeights::Anon { "copied into bmoe's memory" } else { "made resident" };
        details.push(format!(
            "dense weights {}{chosen}: {tensors} tensors, {:.1} MiB {what}",
            dense_mode.name(),
            bytes as f64 / 1048576.0
        ));
    } else if dense_mode == DenseWeights::Mmap {
        details.push(format!(
            "dense weights mmap{chosen}: {:.1} MiB left in llama.cpp's mapping",
            dense_bytes as f64 / 1048576.0
        ));
    }
    let decision = budget::decide(stream.cache, &held, &MemoryLimits::read()).map_err(EngineError::Request)?;
    notices.extend(decision.note);
    let mut store = ExpertStore::new(banks.layers, banks.n_expert, decision.bytes, stream.cache_policy, lanes)
        .map_err(|e| EngineError::Stream(format!("reserving expert memory: {e}")))?
        .recycling_pages(stream.recycle_pages);
    // An MTP layer's experts stream too, read by the draft context.
    store.set_trunk_layers(n_trunk);
    if let Some((copy, base)) = partial_copy {
        store.use_partial_copy(copy, base);
    }
    if decision.bytes > 0 && stream.io_uring {
        match store.use_arena() {
            Ok(()) => details.push(format!(
                "reads: io_uring into {:.1} MiB of cache memory registered at open (no page pinned per read)",
                decision.bytes as f64 / 1048576.0
            )),
            Err(e) => details.push(format!("reads: positioned reads, not io_uring ({e})")),
        }
    }
    info.io_uring = store.uses_arena();
    if decision.bytes > 0 && stream.recycle_pages && !store.recycles_pages() {
        notices.push(
            "evicted expert pages are released, not recycled: page moves need Linux 5.7 or later \
             (mremap's MREMAP_DONTUNMAP, which qemu-user does not emulate) and room under vm.max_map_count"
                .into(),
        );
    }
    if decision.bytes > 0 && stream.cache_policy != CachePolicy::default() {
        details.push(format!("expert cache policy: {}", stream.cache_policy.name()));
    }
    info.bank_bytes = store.bank_bytes();
    info.cache_budget = decision.bytes;
    info.holdings = Some(held);
    let ra = read_ahead;
    if ra.any() && !store.can_prefetch() {
        // Router prediction is on by default and quietly needs the cache;
        // asking for temporal read-ahead is explicit and gets told why not.
        if ra.layers > 0 {
            let why = if store.budget() == 0 { "the expert cache is off" } else { "there is a single read lane" };
            notices.push(format!("read-ahead is off: it reads into the expert cache on spare lanes, and {why}"));
        }
        hook.set_read_ahead(ReadAhead::default()).map_err(EngineError::Unsupported)?;
    } else if ra.any() {
        let mut what = Vec::new();
        if ra.layers > 0 {
            what.push(format!("the previous token's experts of the next {} layer(s)", ra.layers));
        }
        if ra.router > 0 {
            what.push(format!("the choice of the next {} layer(s)' routers", ra.router));
        }
        if ra.router > 0 && ra.prefill {
            what.push("in prompts, the next layer's router's picks for every prompt token".into());
        }
        details.push(format!("read-ahead: {}", what.join(", and ")));
    }
    open_route_profile(&mut store, files, stream, info, &mut notices, &mut details);
    info.notices = notices;
    info.details = details;
    hook.start_streaming(store);
    Ok(())
}

/// Reads the model's route profile as `stream.route_profile` says: its
/// prior for the cache's evictions and a warm start, and this run's routing
/// added to it. A profile that is corrupt or of another model is ignored
/// with one notice (and replaced when the session updates it).
fn open_route_profile(
    store: &mut ExpertStore,
    files: &ModelFiles,
    stream: &StreamOptions,
    info: &mut OpenReport,
    notices: &mut Vec<String>,
    details: &mut Vec<String>,
) {
    let open = &stream.route_profile;
    if !open.mode.reads() || store.budget() == 0 {
        return;
    }
    let identity = match profile::model_identity(files) {
        Ok(id) => id,
        Err(e) => {
            notices.push(format!("route profile off: the model's identity could not be read ({e})"));
            return;
        }
    };
    let path = profile::profile_path(&open.dir, &identity);
    let (n_layer, n_expert) = (store.layer_count(), store.n_expert());
    let fresh = || RouteProfile::new(&identity, n_layer, n_expert, info.n_expert_used as usize);
    let found = match RouteProfile::load(&path) {
        Ok(p) if p.fits(&identity, n_layer, n_expert) => Some(p),
        Ok(_) => {
            notices.push(format!("route profile {} ignored: it is of another model", path.display()));
            None
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            notices.push(format!("route profile {} ignored: {e}", path.display()));
            None
        }
    };
    match &found {
        Some(p) if !p.is_empty() => {
            store.use_profile(p);
            match store.warm_start(p) {
                Ok(warm) => {
                    info.warm_bytes = warm.bytes;
                    details.push(format!(
                        "route profile {} ({:.0} tokens learned): evictions weigh it while it misses less than \
                         decay; warm start reading {} experts, {:.1} MiB",
                        path.display(),
                        p.tokens(),
                        warm.entries,
                        warm.bytes as f64 / 1048576.0
                    ));
                }
                Err(e) => notices.push(format!("warm start skipped: {e}")),
            }
        }
        _ => details.push(format!("route profile {}: none yet for this model", path.display())),
    }
    if open.mode.writes() {
        let mut learning = found.unwrap_or_else(fresh);
        let model = &files.paths()[0];
        learning.model_path = std::fs::canonicalize(model).unwrap_or_else(|_| model.clone()).display().to_string();
        store.learn_profile(learning);
    }
    info.route_profile = Some(path);
}

/// Connects to the RPC servers and places the last layers on them; says
/// where each range went.
fn place_remote(
    rpc: &RpcOptions,
    files: &ModelFiles,
    options: &SessionOptions,
    notices: &mut Vec<String>,
) -> Result<RemoteLayers, EngineError> {
    if options.repack == Repack::On {
        return Err(EngineError::Request(
            "--repack on cannot hold with --rpc: a server computes its layers' expert banks in the file's layout, \
             and exact output needs the same kernels here; use --repack auto or off"
                .into(),
        ));
    }
    if options.mtp.is_some() {
        return Err(EngineError::Request(
            "--mtp runs on one machine only: its draft context cannot use layers on RPC servers; run without --rpc \
             or without --mtp"
                .into(),
        ));
    }
    let n_layer = files.meta().arch_u64("block_count").unwrap_or(0) as usize;
    // A streamed session keeps at least its first layer here.
    let max_remote = n_layer.saturating_sub(usize::from(options.stream.is_some()));
    let remote = remote::place(rpc, files, n_layer, max_remote).map_err(EngineError::Request)?;
    for (device, range) in remote.devices.iter().zip(remote.ranges()) {
        let what = match range.len() {
            0 => "no layers".to_string(),
            1 => format!("layer {}", range.start),
            _ => format!("layers {}-{}", range.start, range.end - 1),
        };
        let head = if range.end == remote.n_layer && !range.is_empty() { " and the output head" } else { "" };
        notices.push(format!(
            "rpc: {what}{head} on {} ({}, {:.0} MiB free)",
            device.endpoint,
            device.name,
            device.free_bytes as f64 / 1048576.0
        ));
    }
    Ok(remote)
}

/// The lean copy to load instead of the model, when `lean` asks for one for
/// this model and it can be found or written (else a notice says why not).
fn lean_copy(files: &ModelFiles, lean: &LeanOpen, notices: &mut Vec<String>) -> Option<lean::LeanCopy> {
    let is_expert = |name: &str| recipe::parse_expert_tensor(name).is_some();
    let expert_bytes: u64 = files.tensors().filter(|t| is_expert(&t.info.name)).map(|t| t.info.size).sum();
    let tight = || MemoryLimits::read().tightest().is_some_and(|m| files.total_bytes() > m);
    if expert_bytes < lean.min_expert_bytes || (lean.only_when_larger_than_memory && !tight()) {
        return None;
    }
    match lean::prepare(files, is_expert, &lean.dir) {
        Ok(copy) => {
            if copy.written > 0 {
                notices.push(format!(
                    "wrote a lean copy of the model for fast opens ({:.1} MiB of dense bytes, the experts \
                     left as holes) to {}",
                    copy.written as f64 / 1048576.0,
                    copy.paths[0].parent().unwrap_or(&lean.dir).display()
                ));
            }
            Some(copy)
        }
        Err(e) => {
            notices.push(format!("lean open unavailable ({e}); loading the whole model file"));
            None
        }
    }
}

/// Checks that every expert tensor the lean copy left out is streamed (so
/// none computes over a hole), then drops the holes' pages from the page
/// cache (llama.cpp's populate filled them with zeros).
fn finish_lean_open(ctx: &mut Context<MoeHook>, copy: &lean::LeanCopy) -> Result<(), EngineError> {
    let hook = ctx.hook_mut().ok_or_else(|| EngineError::Llama("the context has no eval hook".into()))?;
    if let Some(name) = hook.other_expert_uses().first() {
        return Err(EngineError::Unsupported(format!(
            "{name} is read by the graph other than as an expert matmul, so it cannot be left out at load: \
             open with --no-lean-open"
        )));
    }
    for (path, holes) in copy.paths.iter().zip(&copy.holes) {
        let file = std::fs::File::open(path).map_err(|e| EngineError::Stream(format!("{}: {e}", path.display())))?;
        for &(offset, len) in holes {
            crate::llama::memory::drop_file_cache(&file, offset, len)
                .map_err(|e| EngineError::Stream(format!("{}: {e}", path.display())))?;
        }
    }
    Ok(())
}

/// The bytes of dense weights that stay resident while streaming: those the
/// graph reads (not an MTP layer's, which decoding never runs). Held in
/// llama.cpp's mapping, the token embeddings are only gathered row by row,
/// so they cost at most one row per context position; a real vocabulary's
/// embedding matrix (150-600 MiB) would otherwise shrink the cache for
/// nothing. The output head is read whole every token and counts whole, and
/// so do tied embeddings (no `output.weight`: the embeddings are the head).
fn resident_dense_bytes(
    used: &std::collections::BTreeMap<String, crate::llama::TensorHandle>,
    files: &ModelFiles,
    mode: DenseWeights,
    n_ctx: u32,
) -> u64 {
    let tied = !files.tensors().any(|t| t.info.name == "output.weight");
    files
        .tensors()
        .filter(|t| used.contains_key(&t.info.name))
        .map(|t| {
            let rows = t.info.dims.get(1).copied().unwrap_or(1).max(1);
            if t.info.name == "token_embd.weight" && mode == DenseWeights::Mmap && !tied {
                t.info.size.min(t.info.size / rows * u64::from(n_ctx))
            } else {
                t.info.size
            }
        })
        .sum()
}

/// What the cache budget must leave room for: the bank, one token's working
/// set, the `dense` bytes that stay resident and the context (the process's
/// own memory now plus a KV cache filled to `n_ctx`).
fn holdings(banks: &Banks, dense: u64, files: &ModelFiles, info: &OpenReport, n_ctx: u32) -> Holdings {
    let entry = |l: &Vec<Projection>| l.iter().map(|p| p.slice_bytes as u64).sum::<u64>();
    let bank: u64 = banks.layers.iter().map(|l| entry(l) * banks.n_expert as u64).sum();
    let k = u64::from(info.n_expert_used.min(info.n_expert));
    let working_set = banks.layers.iter().map(|l| entry(l) * k).sum();
    let meta = files.meta();
    let head_width =
        meta.arch_u64("attention.key_length").unwrap_or(0) + meta.arch_u64("attention.value_length").unwrap_or(0);
    // KV heads summed over the layers: one count for all, or one per layer
    // (hybrids give their recurrent layers 0).
    let kv_heads: u64 = match meta.get(&format!("{}.attention.head_count_kv", info.arch)) {
        Some(v) => match v.as_array() {
            Some(per_layer) => per_layer.iter().filter_map(|h| h.as_u64()).sum(),
            None => v.as_u64().unwrap_or(0) * u64::from(info.n_layer),
        },
        // llama.cpp's default: as many KV heads as heads.
        None => meta.arch_u64("attention.head_count").unwrap_or(0) * u64::from(info.n_layer),
    };
    // f16 keys and values for every position of every attending layer.
    let kv = u64::from(n_ctx) * kv_heads * head_width * 2;
    let own = MemSnapshot::now().rss_anon_mib.map_or(0, |m| (m * 1048576.0) as u64);
    Holdings { bank, working_set, dense, context: own + kv }
}

/// A note when a verify batch of `draft_max` drafts and the last token
/// routes more experts than the expert cache holds: each position brings
/// its own, so a wide batch evicts what the next step needs.
fn mtp_width_note(info: &OpenReport, draft_max: u32) -> Option<String> {
    let working_set = info.holdings.as_ref()?.working_set;
    let tokens_held = info.cache_budget as f64 / working_set.max(1) as f64;
    if info.cache_budget == 0 || draft_max <= 1 || tokens_held >= f64::from(draft_max + 1) {
        return None;
    }
    Some(format!(
        "the expert cache holds about {tokens_held:.1} tokens' routed experts, and a verify batch of {} positions \
         routes each position's own: under this memory --draft 1 reads less per token (docs/mtp.md)",
        draft_max + 1
    ))
}
