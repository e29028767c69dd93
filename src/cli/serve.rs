//! `bmoe serve`: the OpenAI-compatible server, with the flags every run
//! takes and `[serve]`'s address, key and queue.

use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use clap::Args;

use super::generate::{RunFlags, TurnFlags, resolve_config};
use crate::interrupt;
use crate::serve::{ServeOptions, Server, Status};

/// `bmoe serve` arguments.
#[derive(Args, Debug)]
#[command(mut_arg("n_predict", |a| a.help(
    "The token limit of a request that sets no max_tokens; without it such a request may use the room left in \
     its context")))]
pub struct ServeArgs {
    /// Address to listen on [serve.host, default 127.0.0.1]; another than loopback without
    /// --api-key lets anyone who can reach the port use the model.
    #[arg(long)]
    pub host: Option<String>,
    /// Port to listen on; 0 picks a free one [serve.port, default 8080].
    #[arg(long)]
    pub port: Option<u16>,
    /// Key clients must send as `Authorization: Bearer KEY` [serve.api_key; BMOE_API_KEY].
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Requests that may wait for the model; more are answered 429 [serve.queue, default 16].
    #[arg(long, value_name = "N")]
    pub queue: Option<u32>,
    /// Requests decoded together, each with the whole context (--ctx-size) [serve.parallel, default
    /// 4; 1 with a draft plugin or MTP].
    #[arg(long, value_name = "N")]
    pub parallel: Option<u32>,
    /// Seconds the requests running when the server is stopped (SIGTERM, Ctrl-C) get to finish;
    /// new requests get 503 meanwhile, and a reply still running then ends with an error chunk
    /// [serve.shutdown_grace_s, default 5].
    #[arg(long, value_name = "SECONDS")]
    pub shutdown_grace: Option<f64>,
    /// Origins of browser apps served elsewhere that may call the API (CORS), comma-separated,
    /// e.g. http://localhost:3000; `*` allows any [serve.cors, default none].
    #[arg(long, value_name = "ORIGINS")]
    pub cors: Option<String>,
    /// While streams are running, hold newcomers' prompt tokens per step to a budget that keeps a
    /// running stream's step within X times its plain decode step (sized from measured step
    /// times); 0 lets a prompt take the whole batch [serve.step_target, default 3].
    #[arg(long, value_name = "X")]
    pub step_target: Option<f64>,
    /// Model and engine settings.
    #[command(flatten)]
    pub run: RunFlags,
    /// Length, sampling, chat and telemetry settings (a request's own fields win).
    #[command(flatten)]
    pub turn: TurnFlags,
}

/// The demo's cache budget in `bmoe serve`, as in `bmoe chat`.
const DEMO_CACHE_MIB: f64 = 64.0;

/// Runs the server until Ctrl-C (or SIGTERM).
pub fn serve(args: ServeArgs) -> Result<()> {
    let mut config = resolve_config(&args.run, &args.turn)?;
    let s = &mut config.serve;
    if let Some(host) = args.host {
        s.host = host;
    }
    if let Some(port) = args.port {
        s.port = port;
    }
    if let Some(key) = args.api_key {
        s.api_key = key;
    }
    if let Some(queue) = args.queue {
        s.queue = queue;
    }
    if let Some(parallel) = args.parallel {
        s.parallel = parallel;
    }
    if let Some(grace) = args.shutdown_grace {
        s.shutdown_grace_s = grace;
    }
    if let Some(cors) = args.cors {
        s.cors = cors;
    }
    if let Some(target) = args.step_target {
        s.step_target = target;
    }
    if config.serve.parallel > config.generate.batch {
        anyhow::bail!(
            "--parallel {} is more than --batch {}: every step's batch holds a token of each request",
            config.serve.parallel,
            config.generate.batch
        );
    }
    let speculative = config.plugins.mtp || !config.plugins.draft_plugin.is_empty();
    if speculative && config.serve.parallel > 1 {
        if args.parallel.is_some_and(|p| p > 1) {
            eprintln!("bmoe serve: one request at a time with a draft plugin or MTP (--parallel 1)");
        }
        config.serve.parallel = 1;
    }
    config.validate()?;
    // Each request at once holds a whole context: by default, no more of
    // them than the memory holds beside the model.
    if args.parallel.is_none()
        && let Some(fits) = contexts_that_fit(&config).filter(|&n| n < config.serve.parallel)
    {
        eprintln!(
            "bmoe serve: --parallel {fits}: this memory holds {fits} {}-token context{} beside the model, not {} \
             (--parallel or a smaller --ctx-size to choose)",
            config.generate.ctx_size,
            if fits == 1 { "" } else { "s" },
            config.serve.parallel
        );
        config.serve.parallel = fits;
    }
    // A server's replies must not depend on what else it decodes.
    if config.generate.batch_invariant == crate::config::BatchInvariance::Auto {
        config.generate.batch_invariant = crate::config::BatchInvariance::On;
    }
    let demo = config.model.path.as_os_str().is_empty();
    if demo && args.run.config.is_none() && args.run.cache_mb.is_none() && args.run.moe_stream.is_none() {
        config.moe.stream = crate::config::StreamMode::On;
        config.moe.cache_mb = crate::config::CacheMb::Mib(DEMO_CACHE_MIB);
    }
    let mut options = ServeOptions::from_config(&config).map_err(|e| anyhow!(e))?;
    // -n given: the limit of a request that sets none (else the context's room).
    options.default_max_tokens = args.turn.n_predict;
    interrupt::install()?;
    interrupt::also_on_sigterm()?;
    crate::notes::raise_to_verbose(config.telemetry.verbose);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bmoe-http")
        .enable_all()
        .build()
        .map_err(|e| anyhow!("starting the HTTP runtime: {e}"))?;
    // A local file that is not there fails now, before a port is taken
    // (a hub model or the demo is fetched or made while the server listens).
    let given = &config.model.path;
    let local = !given.as_os_str().is_empty() && given.to_str().and_then(crate::hub::HubSpec::from_model_arg).is_none();
    if local && !given.exists() {
        crate::host::resolve_model(&config)?;
    }
    let opened = config.clone();
    let server = Server::bind(&runtime, &options, config.clone(), move || {
        let model = crate::host::resolve_model(&opened).map_err(|e| e.to_string())?;
        let sequences = opened.serve.parallel;
        let _bar = super::generate::CopyBar::show();
        let mut host = crate::host::Host::open_sequences(opened, &model, sequences).map_err(|e| e.to_string())?;
        host.print_open_notes("bmoe serve", true);
        Ok(host)
    })
    .map_err(|e| anyhow!(e))?;
    let url = format!("http://{}", server.addr);
    println!("bmoe serve: listening on {url} (the model is loading; /health answers 503 until it is ready)");
    println!("  chat page:  {url}/");
    // In double quotes, so the shell the line is pasted into puts the key in.
    let auth = options.api_key.as_ref().map_or(String::new(), |_| " -H \"Authorization: Bearer $BMOE_API_KEY\"".into());
    println!(
        "  try:        curl {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\\n              \
         -d '{{\"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}], \"max_tokens\": 64}}'"
    );
    if options.api_key.is_some() && std::env::var_os("BMOE_API_KEY").is_none() {
        println!("              (with BMOE_API_KEY set to the key given with --api-key)");
    }
    if crate::serve::is_exposed(&server.addr) && options.api_key.is_none() {
        eprintln!(
            "bmoe serve: warning: listening on {} without --api-key: anyone who can reach this port can use the model",
            server.addr
        );
    }
    let engine = server.engine.clone();
    runtime.spawn(async move { report_ready(&engine).await });
    let grace = Duration::from_secs_f64(config.serve.shutdown_grace_s);
    let engine = server.engine.clone();
    let failed = std::sync::Mutex::new(None);
    runtime.block_on(server.run(async {
        // A model that fails to load stops the server: clients get a
        // refused connection, not 503s to retry forever, and the exit
        // status says it failed.
        while !interrupt::requested() {
            if let Status::Failed(e) = engine.status() {
                *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        drain(&engine, grace).await;
    }));
    // The engine thread may be mid-reply; the process ends with it.
    runtime.shutdown_timeout(Duration::from_secs(1));
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        bail!("the model failed to load: {e}");
    }
    eprintln!("bmoe serve: stopped");
    Ok(())
}

/// Lets the requests in flight finish within `grace` while new ones are
/// answered 503, then ends those still running (a second Ctrl-C exits at
/// once).
async fn drain(engine: &crate::serve::Engine, grace: Duration) {
    engine.begin_drain();
    let running = engine.in_flight();
    if running > 0 {
        eprintln!(
            "bmoe serve: stopping: {running} request(s) in flight get {:.0} s to finish (new ones get 503; Ctrl-C \
             again stops at once)",
            grace.as_secs_f64()
        );
    }
    let until_empty = |deadline: std::time::Instant| async move {
        while engine.in_flight() > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    until_empty(std::time::Instant::now() + grace).await;
    if engine.in_flight() > 0 {
        eprintln!("bmoe serve: ending {} request(s) still running", engine.in_flight());
        engine.stop_running();
        until_empty(std::time::Instant::now() + Duration::from_secs(5)).await;
    }
}

/// Says on stdout when the model is ready (or on stderr why it failed).
async fn report_ready(engine: &crate::serve::Engine) {
    loop {
        match engine.status() {
            Status::Loading => tokio::time::sleep(Duration::from_millis(50)).await,
            Status::Ready(ready) => {
                let (model_id, n_ctx, parallel, kv_bytes) =
                    (&ready.model_id, ready.n_ctx, ready.parallel, ready.kv_bytes);
                let each = if parallel > 1 { format!(" each, {parallel} requests at once") } else { String::new() };
                println!(
                    "bmoe serve: ready: model `{model_id}`, context {n_ctx} tokens{each}: KV cache {:.0} MiB",
                    kv_bytes as f64 / 1048576.0
                );
                return;
            }
            // The server stops with the error (`serve`).
            Status::Failed(_) => return,
        }
    }
}

/// How many of `config`'s contexts (`generate.ctx_size` tokens each, up to
/// `serve.parallel`) fit in the memory bmoe may use beside the model,
/// resident or streamed, by `bmoe fit`'s estimate; at least 1. `None` when
/// the model file cannot be read (the open says why) or memory has no limit.
fn contexts_that_fit(config: &crate::config::RunConfig) -> Option<u32> {
    use crate::fit::{Machine, Mode, ModelShape, estimate};
    let path = &config.model.path;
    if path.as_os_str().is_empty() {
        return None;
    }
    let files = crate::gguf::ModelFiles::open(path).ok()?;
    let shape = ModelShape::of(&files).ok()?;
    let memory = crate::moe::budget::MemoryLimits::read();
    memory.tightest()?;
    let machine = Machine { memory, disk_bytes_s: None, weights_s: None };
    // The server's kernels: batch-invariant unless set off.
    let invariant = config.generate.batch_invariant.resolve(true);
    let fits = |n: u32| {
        let e = estimate(&shape, &machine, crate::fit::served_positions(config.generate.ctx_size, n, invariant));
        !matches!(e.mode, Mode::DoesNotFit { .. })
    };
    Some((1..=config.serve.parallel).rev().find(|&n| fits(n)).unwrap_or(1))
}
