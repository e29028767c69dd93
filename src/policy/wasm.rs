//! The WebAssembly plugin host (wasmtime, component model, no WASI).
//!
//! Every plugin gets its own store with a linear-memory cap, and every call
//! a CPU-time budget, checked through epoch deadlines (a ticker thread
//! advances the engine's epoch each millisecond). A plugin must import nothing and export exactly one
//! `bmoe:policy` interface of a compatible version.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, ResourceLimiter, Store, Trap, UpdateDeadline};

use super::{DraftPolicy, DropCall, DropPolicy, PluginKind};

mod bindings {
    pub mod drafter {
        wasmtime::component::bindgen!({ world: "drafter", path: "plugins/wit" });
    }
    pub mod dropper {
        // Both worlds use the same `types` interface: share its Rust types.
        wasmtime::component::bindgen!({
            world: "dropper",
            path: "plugins/wit",
            with: { "bmoe:policy/types": super::drafter::bmoe::policy::types },
        });
    }
}

mod embedded {
    /// Bundled plugins: (name, component bytes), built from `plugins/` by
    /// `scripts/build-plugins.sh` and committed, so building bmoe needs no
    /// wasm toolchain. CI checks they are what their sources build.
    pub const BUNDLED: &[(&str, &[u8])] = &[
        ("ngram", include_bytes!("../../plugins/dist/ngram.wasm")),
        ("ngram-multi", include_bytes!("../../plugins/dist/ngram-multi.wasm")),
        ("suffix", include_bytes!("../../plugins/dist/suffix.wasm")),
        ("drop-cold", include_bytes!("../../plugins/dist/drop-cold.wasm")),
    ];
}

/// The interface version this host implements.
pub const INTERFACE_VERSION: (u64, u64, u64) = (0, 1, 0);

/// Resource limits of one plugin.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// CPU time one call may use, in milliseconds (checked every millisecond
    /// of wall-clock time; time the thread spends preempted does not count).
    pub call_ms: u64,
    /// Largest linear memory, in bytes.
    pub memory_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { call_ms: 50, memory_bytes: 64 << 20 }
    }
}

/// What a plugin says about itself, plus what the host found.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginInfo {
    /// Name from `describe`.
    pub name: String,
    /// The plugin's own version.
    pub version: String,
    /// One line.
    pub description: String,
    /// (name, default, description) of each parameter.
    pub params: Vec<(String, String, String)>,
    /// Drafter or dropper.
    pub kind: PluginKind,
    /// The `bmoe:policy` version it was built against.
    pub interface: String,
    /// `bundled` or the file path.
    pub source: String,
}

/// Where plugin bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A plugin built into bmoe, by name.
    Bundled(&'static str),
    /// A file (a component, or a core module carrying the component type).
    File(PathBuf),
}

impl Source {
    /// A bundled name, otherwise a path.
    pub fn parse(spec: &str) -> Source {
        match embedded::BUNDLED.iter().find(|(n, _)| *n == spec) {
            Some((name, _)) => Source::Bundled(name),
            None => Source::File(PathBuf::from(spec)),
        }
    }

    /// A bundled name or an existing file; an error naming the bundled
    /// plugins otherwise.
    pub fn resolve(spec: &str) -> Result<Source, String> {
        let source = Source::parse(spec);
        match &source {
            Source::File(p) if !p.exists() => {
                Err(format!("no bundled plugin or file named `{spec}` (bundled: {})", bundled_names().join(", ")))
            }
            _ => Ok(source),
        }
    }

    fn describe(&self) -> String {
        match self {
            Source::Bundled(n) => format!("bundled plugin `{n}`"),
            Source::File(p) => p.display().to_string(),
        }
    }
}

/// How often the plugin clock ticks; a call's CPU time is checked at each tick.
const TICK: Duration = Duration::from_millis(1);

/// The shared engine, with a ticker thread driving epoch deadlines.
fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut config = Config::new();
        config.epoch_interruption(true);
        let engine = Engine::new(&config).expect("a default wasmtime configuration is valid");
        let ticker = engine.clone();
        std::thread::Builder::new()
            .name("bmoe-plugin-clock".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(TICK);
                    ticker.increment_epoch();
                }
            })
            .expect("spawning the plugin clock thread");
        engine
    })
}

/// CPU time the calling thread has used so far.
fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Per-store state: the limits and which of them a call hit.
struct Cap {
    /// Largest linear memory, in bytes.
    limit: usize,
    /// The size a refused memory growth asked for.
    refused: Option<usize>,
    /// CPU time one call may use.
    call_cpu: Duration,
    /// The thread's CPU time at the first clock tick of the current call.
    cpu_mark: Option<Duration>,
}

impl Cap {
    /// Called at each clock tick while a call runs: stop the call once it
    /// has used its CPU time. CPU time rather than wall-clock time, so that a
    /// busy machine that preempts the plugin's thread cannot make a
    /// well-behaved plugin fault. Before the first tick the call ran for at
    /// most one tick, which is counted in full.
    fn on_tick(&mut self) -> UpdateDeadline {
        let now = thread_cpu_time();
        let mark = *self.cpu_mark.get_or_insert(now);
        if now.saturating_sub(mark) + TICK >= self.call_cpu {
            UpdateDeadline::Interrupt
        } else {
            UpdateDeadline::Continue(1)
        }
    }
}

impl ResourceLimiter for Cap {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.refused = Some(desired);
            return Err(wasmtime::Error::msg("memory limit"));
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}

/// Reads, checks and compiles a plugin of `kind`.
fn compile(source: &Source, kind: PluginKind) -> Result<(Component, String), String> {
    let name = source.describe();
    let bytes = match source {
        Source::Bundled(n) => {
            embedded::BUNDLED.iter().find(|(b, _)| b == n).map(|(_, b)| b.to_vec()).unwrap_or_default()
        }
        Source::File(p) => std::fs::read(p).map_err(|e| format!("cannot read plugin {name}: {e}"))?,
    };
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(format!("{name} is not a WebAssembly file"));
    }
    let bytes =
        if is_core_module(&bytes) { wrap_core_module(&bytes).map_err(|e| format!("{name} {e}"))? } else { bytes };
    let engine = engine();
    let component = match source {
        // Bundled plugins are compiled once per process.
        Source::Bundled(n) => {
            static COMPILED: Mutex<Vec<(&str, Component)>> = Mutex::new(Vec::new());
            let mut compiled = COMPILED.lock().map_err(|_| "plugin cache poisoned".to_string())?;
            match compiled.iter().find(|(b, _)| b == n) {
                Some((_, c)) => c.clone(),
                None => {
                    let c = Component::new(engine, &bytes)
                        .map_err(|e| format!("{name} is not a valid component: {e:#}"))?;
                    compiled.push((n, c.clone()));
                    c
                }
            }
        }
        Source::File(_) => {
            Component::new(engine, &bytes).map_err(|e| format!("{name} is not a valid component: {e:#}"))?
        }
    };
    let ty = component.component_type();
    // The only import allowed is the types-only interface `bmoe:policy/types`
    // that the exported interface uses; it carries no functions.
    let imports: Vec<String> =
        ty.imports(engine).map(|(n, _)| n.to_string()).filter(|n| !n.starts_with("bmoe:policy/types@")).collect();
    if !imports.is_empty() {
        return Err(format!(
            "{name} imports {}; bmoe plugins may import nothing (build for wasm32-unknown-unknown)",
            imports.join(", ")
        ));
    }
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let wanted = format!("bmoe:policy/{}-policy", kind.name());
    let Some(found) = exports.iter().find(|e| e.starts_with("bmoe:policy/")) else {
        return Err(format!("{name} exports no bmoe:policy interface (exports: {})", exports.join(", ")));
    };
    let (iface, version) = found.split_once('@').unwrap_or((found, "?"));
    if iface != wanted {
        let other = if kind == PluginKind::Drafter { "dropper" } else { "drafter" };
        return Err(format!("{name} is a {other} plugin ({iface}), not a {}", kind.name()));
    }
    if !compatible(version) {
        let (ma, mi, _) = INTERFACE_VERSION;
        return Err(format!(
            "{name} was built for bmoe:policy@{version}, but this bmoe speaks bmoe:policy@{ma}.{mi}.x; \
             rebuild the plugin against this bmoe's plugins/wit"
        ));
    }
    Ok((component, version.to_string()))
}

/// Whether `bytes` are a core Wasm module (version 1) rather than a component.
pub fn is_core_module(bytes: &[u8]) -> bool {
    bytes.len() >= 8 && bytes[..4] == *b"\0asm" && bytes[4..8] == [1, 0, 0, 0]
}

/// Wraps a core module built with wit-bindgen (which carries its component
/// type in a custom section) into a component. Loading does this for core
/// modules given as files; `scripts/build-plugins.sh` does it for the bundled
/// plugins through `bmoe plugin wrap`.
pub fn wrap_core_module(core: &[u8]) -> Result<Vec<u8>, String> {
    wit_component::ComponentEncoder::default()
        .module(core)
        .and_then(|e| e.validate(true).encode())
        .map_err(|e| format!("is a core Wasm module that cannot be made a bmoe plugin: {e:#}"))
}

/// [`INTERFACE_VERSION`] as text.
pub fn interface_version() -> String {
    let (a, b, c) = INTERFACE_VERSION;
    format!("{a}.{b}.{c}")
}

/// Which kind of plugin `source` is (compiles and inspects it).
pub fn kind_of(source: &Source) -> Result<PluginKind, String> {
    match compile(source, PluginKind::Drafter) {
        Ok(_) => Ok(PluginKind::Drafter),
        Err(e) if e.contains("is a dropper plugin") => Ok(PluginKind::Dropper),
        Err(e) => Err(e),
    }
}

/// Names of the bundled plugins, in build order.
pub fn bundled_names() -> Vec<&'static str> {
    embedded::BUNDLED.iter().map(|(n, _)| *n).collect()
}

/// Semver compatibility with [`INTERFACE_VERSION`]: same major, and for 0.x the same minor.
fn compatible(version: &str) -> bool {
    let parts: Vec<u64> = version.split(['.', '-', '+']).take(3).filter_map(|p| p.parse().ok()).collect();
    let [major, minor, _] = parts[..] else { return false };
    let (ma, mi, _) = INTERFACE_VERSION;
    major == ma && (ma > 0 || minor == mi)
}

/// A linker that provides only the (function-less) types interface.
fn linker(component: &Component) -> Result<Linker<Cap>, String> {
    let engine = engine();
    let mut linker = Linker::new(engine);
    for (name, _) in component.component_type().imports(engine) {
        linker.instance(name).map_err(|e| format!("linking {name}: {e:#}"))?;
    }
    Ok(linker)
}

/// A plugin's store: memory cap, per-call deadline, fault messages.
struct Sandbox {
    store: Store<Cap>,
    limits: Limits,
}

impl Sandbox {
    fn new(limits: Limits) -> Sandbox {
        let cap = Cap {
            limit: limits.memory_bytes,
            refused: None,
            call_cpu: Duration::from_millis(limits.call_ms.max(1)),
            cpu_mark: None,
        };
        let mut store = Store::new(engine(), cap);
        store.limiter(|cap| cap);
        store.epoch_deadline_callback(|mut ctx| Ok(ctx.data_mut().on_tick()));
        Sandbox { store, limits }
    }

    /// Runs one call into the plugin with a fresh CPU-time budget.
    fn call<R>(&mut self, f: impl FnOnce(&mut Store<Cap>) -> wasmtime::Result<R>) -> Result<R, String> {
        self.store.data_mut().cpu_mark = None;
        self.store.set_epoch_deadline(1);
        f(&mut self.store).map_err(|e| self.fault(e))
    }

    /// Explains why a call failed.
    fn fault(&self, e: wasmtime::Error) -> String {
        if let Some(bytes) = self.store.data().refused {
            return format!(
                "exceeded its memory limit of {} MiB (asked to grow to {} MiB)",
                self.limits.memory_bytes >> 20,
                bytes >> 20
            );
        }
        match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => format!("ran past its {} ms CPU-time limit per call", self.limits.call_ms),
            Some(trap) => format!("trapped: {trap}"),
            None => format!("failed: {e:#}"),
        }
    }
}

type Info = bindings::drafter::bmoe::policy::types::Info;
type Routed = bindings::dropper::exports::bmoe::policy::dropper_policy::Routed;

/// Compiles and instantiates a plugin of `kind`, then asks it to describe
/// and configure itself.
fn start<P>(
    source: &Source,
    kind: PluginKind,
    params: &[(String, String)],
    limits: Limits,
    instantiate: impl FnOnce(&mut Store<Cap>, &Component, &Linker<Cap>) -> wasmtime::Result<P>,
    describe: impl FnOnce(&P, &mut Store<Cap>) -> wasmtime::Result<Info>,
    configure: impl FnOnce(&P, &mut Store<Cap>, &[(String, String)]) -> wasmtime::Result<Result<(), String>>,
) -> Result<(Sandbox, P, PluginInfo), String> {
    let (component, interface) = compile(source, kind)?;
    let name = source.describe();
    let mut sandbox = Sandbox::new(limits);
    let linker = linker(&component)?;
    let plugin = sandbox
        .call(|s| instantiate(s, &component, &linker))
        .map_err(|e| format!("{name}: instantiation failed: {e}"))?;
    let info = sandbox.call(|s| describe(&plugin, s)).map_err(|e| format!("{name}: describe {e}"))?;
    let info = PluginInfo {
        name: info.name,
        version: info.version,
        description: info.description,
        params: info.params.into_iter().map(|p| (p.name, p.default, p.description)).collect(),
        kind,
        interface,
        source: match source {
            Source::Bundled(_) => "bundled".into(),
            Source::File(p) => p.display().to_string(),
        },
    };
    sandbox
        .call(|s| configure(&plugin, s, params))
        .map_err(|e| format!("{name}: configure {e}"))?
        .map_err(|msg| format!("plugin `{}` rejected its parameters: {msg}; {}", info.name, takes(&info)))?;
    Ok((sandbox, plugin, info))
}

/// The parameters a plugin says it takes, for an error about them.
fn takes(info: &PluginInfo) -> String {
    if info.params.is_empty() {
        return "it takes no parameters".into();
    }
    let each: Vec<String> =
        info.params.iter().map(|(name, default, _)| format!("{name} (default {default})")).collect();
    format!("it takes {}", each.join(", "))
}

/// A draft policy running as a Wasm plugin.
pub struct WasmDrafter {
    sandbox: Sandbox,
    plugin: bindings::drafter::Drafter,
    info: PluginInfo,
}

impl WasmDrafter {
    /// Loads, describes and configures a drafter plugin.
    pub fn load(source: &Source, params: &[(String, String)], limits: Limits) -> Result<WasmDrafter, String> {
        let (sandbox, plugin, info) = start(
            source,
            PluginKind::Drafter,
            params,
            limits,
            |s, c, l| bindings::drafter::Drafter::instantiate(s, c, l),
            |p: &bindings::drafter::Drafter, s| p.bmoe_policy_drafter_policy().call_describe(s),
            |p, s, params| p.bmoe_policy_drafter_policy().call_configure(s, params),
        )?;
        Ok(WasmDrafter { sandbox, plugin, info })
    }

    /// What the plugin said about itself.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }
}

impl DraftPolicy for WasmDrafter {
    fn reset(&mut self, context: &[i32]) -> Result<(), String> {
        let api = self.plugin.bmoe_policy_drafter_policy();
        self.sandbox.call(|s| api.call_reset(s, context))
    }

    fn observe(&mut self, accepted: &[i32]) -> Result<(), String> {
        let api = self.plugin.bmoe_policy_drafter_policy();
        self.sandbox.call(|s| api.call_observe(s, accepted))
    }

    fn draft(&mut self, max: u32) -> Result<Vec<i32>, String> {
        let api = self.plugin.bmoe_policy_drafter_policy();
        self.sandbox.call(|s| api.call_draft(s, max))
    }
}

/// A drop policy running as a Wasm plugin.
pub struct WasmDropper {
    sandbox: Sandbox,
    plugin: bindings::dropper::Dropper,
    info: PluginInfo,
    /// Scratch for the routed slots of one call.
    slots: Vec<Routed>,
}

impl WasmDropper {
    /// Loads, describes and configures a dropper plugin.
    pub fn load(source: &Source, params: &[(String, String)], limits: Limits) -> Result<WasmDropper, String> {
        let (sandbox, plugin, info) = start(
            source,
            PluginKind::Dropper,
            params,
            limits,
            |s, c, l| bindings::dropper::Dropper::instantiate(s, c, l),
            |p: &bindings::dropper::Dropper, s| p.bmoe_policy_dropper_policy().call_describe(s),
            |p, s, params| p.bmoe_policy_dropper_policy().call_configure(s, params),
        )?;
        Ok(WasmDropper { sandbox, plugin, info, slots: Vec::new() })
    }

    /// What the plugin said about itself.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }
}

impl DropPolicy for WasmDropper {
    fn decide(&mut self, call: &DropCall<'_>) -> Result<Vec<u32>, String> {
        self.slots.clear();
        self.slots.extend((0..call.experts.len()).map(|i| Routed {
            expert: call.experts[i],
            weight: call.weights[i],
            resident: call.resident[i],
        }));
        let api = self.plugin.bmoe_policy_dropper_policy();
        let slots = &self.slots;
        self.sandbox.call(|s| api.call_decide(s, call.layer, call.k, slots))
    }
}

/// Paths of the test-fixture plugins (hostile and future-version guests),
/// committed next to the bundled ones.
#[doc(hidden)]
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("plugins/dist/fixtures").join(format!("{name}.wasm"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_versions() {
        assert!(compatible("0.1.0"));
        assert!(compatible("0.1.7"));
        assert!(!compatible("0.2.0"));
        assert!(!compatible("1.0.0"));
        assert!(!compatible("garbage"));
    }
}
