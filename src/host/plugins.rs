//! Loads the configured draft and drop plugins into a session.

use crate::config::{RunConfig, parse_params};
use crate::engine::Session;
use crate::policy::wasm::{Limits, Source, WasmDrafter, WasmDropper};
use crate::policy::{Drafter, Dropper};

/// Loads a plugin; a file that is not a usable plugin (not Wasm, another
/// interface version, imports) is refused with a notice and the run goes on
/// without it. Rejected parameters are the user's error.
fn load_or_skip<P>(what: &str, load: Result<P, String>, notices: &mut Vec<String>) -> Result<Option<P>, String> {
    match load {
        Ok(p) => Ok(Some(p)),
        Err(e) if e.contains("rejected its parameters") => Err(e),
        Err(e) => {
            notices.push(format!("{what} plugin refused, running without it: {e}"));
            Ok(None)
        }
    }
}

/// Replaces the session's plugins with the configured ones (none where the
/// setting is empty). Returns notices for the user.
pub fn attach(session: &mut Session, config: &RunConfig) -> Result<Vec<String>, String> {
    let p = &config.plugins;
    let limits = Limits { call_ms: p.call_ms, memory_bytes: (p.memory_mb as usize) << 20 };
    let mut notices = Vec::new();
    session.set_drafter(None, p.draft);
    if !p.draft_plugin.is_empty() {
        let params = parse_params("plugins.draft_params", &p.draft_params).map_err(|e| e.to_string())?;
        let source = Source::resolve(&p.draft_plugin)?;
        if let Some(plugin) = load_or_skip("draft", WasmDrafter::load(&source, &params, limits), &mut notices)? {
            let i = plugin.info().clone();
            notices.push(format!(
                "draft plugin {} {} ({}), up to {} tokens per step",
                i.name, i.version, i.source, p.draft
            ));
            session.set_drafter(Some(Drafter::new(&i.name, Box::new(plugin), session.n_vocab())), p.draft);
        }
    }
    if session.info().streamed_layers > 0 {
        session.set_dropper(None).map_err(|e| e.to_string())?;
    }
    if !p.drop_plugin.is_empty() {
        let params = parse_params("plugins.drop_params", &p.drop_params).map_err(|e| e.to_string())?;
        let source = Source::resolve(&p.drop_plugin)?;
        let Some(plugin) = load_or_skip("drop", WasmDropper::load(&source, &params, limits), &mut notices)? else {
            return Ok(notices);
        };
        let i = plugin.info().clone();
        notices
            .push(format!("drop plugin {} {} ({}): lossy, output depends on cache state", i.name, i.version, i.source));
        if session.info().cache_budget == 0 {
            notices.push("without a cache (moe.cache_mb) every expert is a cache miss to the drop plugin".into());
        }
        let n_expert = session.info().n_expert;
        session.set_dropper(Some(Dropper::new(&i.name, Box::new(plugin), n_expert))).map_err(|e| e.to_string())?;
    }
    Ok(notices)
}
