//! Sessions for scripts: `open` a model on a session host (the same host
//! the REPL and `bmoe chat` use), run `generate` and `chat`, change live
//! settings, and get every run back as a map of its figures.

use std::cell::RefCell;
use std::rc::Rc;

use rhai::{Array, Dynamic, EvalAltResult, Map};

mod scoring;
mod tool_loop;

pub use scoring::{Scores, kl};

use super::sandbox::OutDir;
use crate::config::RunConfig;
use crate::engine::{Generation, StepReport};
use crate::host::{Apply, Cut, Host, HostEvent, apply_of};
use crate::interrupt;
use crate::telemetry::csv::{COLUMNS, row_fields};
use crate::telemetry::summary::RunSummary;

/// A script error with its message (Rhai adds the position).
pub type Fallible<T> = Result<T, Box<EvalAltResult>>;

/// An error raised by the function `call`.
pub fn fail(call: &str, message: impl std::fmt::Display) -> Box<EvalAltResult> {
    format!("{call}: {message}").into()
}

/// A model open on a session host, shared by the script's copies of it.
#[derive(Clone)]
pub struct Session {
    host: Rc<RefCell<Host>>,
    runs: Rc<RefCell<u64>>,
    out: OutDir,
}

/// The text form `RunConfig::with` takes for a script value.
fn value_text(v: &Dynamic) -> String {
    if let Some(a) = v.clone().try_cast::<Array>() {
        return a.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    }
    v.to_string()
}

/// The text of setting `key` = `value`; telemetry files are resolved under
/// the output directory (scripts write nowhere else).
fn setting_text(key: &str, value: &Dynamic, out: &OutDir, call: &str) -> Fallible<(String, String)> {
    let full = RunConfig::resolve_key(key).map_err(|e| fail(call, e))?;
    let text = value_text(value);
    let text = match full.as_str() {
        "telemetry.csv" | "telemetry.route_trace" if !text.is_empty() => {
            out.resolve(&text).map_err(|e| fail(call, format!("{full}: {e}")))?.display().to_string()
        }
        _ => text,
    };
    Ok((full, text))
}

/// `base` with every entry of `settings` applied (`bmoe.toml` keys, full or bare).
pub fn configure(base: RunConfig, settings: &Map, out: &OutDir, call: &str) -> Fallible<RunConfig> {
    let texts: Vec<(String, String)> =
        settings.iter().map(|(k, v)| setting_text(k, v, out, call)).collect::<Fallible<_>>()?;
    let pairs: Vec<(&str, &str)> = texts.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    base.with_all(&pairs).map_err(|e| fail(call, e))
}

impl Session {
    /// Opens `model` (empty: the demo model) with `settings` over `base`.
    pub fn open(model: &str, settings: &Map, base: &RunConfig, out: &OutDir) -> Fallible<Session> {
        let mut config = configure(base.clone(), settings, out, "open")?;
        if !model.is_empty() {
            config.model.path = model.into();
        }
        let hub = match crate::hub::ModelRef::parse(model) {
            Ok(crate::hub::ModelRef::Hub(spec)) => Some(spec.to_string()),
            _ => model.strip_prefix("hf:").map(str::to_string),
        };
        if let Some(spec) = hub {
            // The sandbox: a script reaches no network and writes only under --out.
            return Err(fail(
                "open",
                format!(
                    "{model}: a script opens model files only: pull it first (bmoe pull {spec}) and open the path it prints"
                ),
            ));
        }
        let path = crate::host::resolve_model(&config).map_err(|e| fail("open", format!("{e:#}")))?;
        crate::host::demo_budget(&mut config);
        crate::notes::raise_to_verbose(config.telemetry.verbose);
        let mut host = Host::open(config, &path).map_err(|e| fail("open", e))?;
        host.print_open_notes("bmoe run", true);
        Ok(Session { host: Rc::new(RefCell::new(host)), runs: Rc::new(RefCell::new(0)), out: out.clone() })
    }

    /// `s.generate(prompt, n)`: a plain completion from a fresh context.
    pub fn generate(&mut self, prompt: &str, n: i64, options: &Map) -> Fallible<Map> {
        let n = u32::try_from(n)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| fail("generate", format!("n = {n}: want 1 or more tokens")))?;
        let keep_logits = options.get("logits").is_some_and(|v| v.as_bool().unwrap_or(false));
        let schema = match options.get("json_schema") {
            None => None,
            Some(v) if v.is_map() => Some(dynamic_to_json(v).to_string()),
            Some(v) => Some(v.clone().into_string().map_err(|_| {
                fail("generate", "json_schema: a map, or a schema as JSON text, or a file holding one")
            })?),
        };
        let mut host = self.host.borrow_mut();
        let old = host.config().generate.n_predict;
        let old_schema = host.config().generate.json_schema.clone();
        if let Some(schema) = &schema {
            host.set("generate.json_schema", schema).map_err(|e| fail("generate", e))?;
        }
        host.set("generate.n_predict", &n.to_string()).map_err(|e| fail("generate", e))?;
        host.keep_logits(keep_logits);
        let mut steps = Vec::new();
        let result = run_guarded(&mut host, &mut steps, |h, on| h.complete(prompt, false, on));
        host.keep_logits(false);
        host.set("generate.n_predict", &old.to_string()).map_err(|e| fail("generate", e))?;
        if schema.is_some() {
            host.set("generate.json_schema", &old_schema).map_err(|e| fail("generate", e))?;
        }
        let generation = result.map_err(|e| fail("generate", e))?;
        drop(host);
        let mut map = self.result_map(&generation, None, &steps, keep_logits);
        if schema.is_some() {
            // The parsed value; () when the text stopped before the JSON was whole.
            let value = serde_json::from_str(&generation.text).map_or(Dynamic::UNIT, |v| json_to_dynamic(&v));
            map.insert("value".into(), value);
        }
        self.progress("generate", &generation.summary);
        check_interrupt(&generation, "generate")?;
        Ok(map)
    }

    /// `s.set(key, value)`: a setting the host changes live; the others
    /// need the model opened again, which a script does with `open`.
    pub fn set(&mut self, key: &str, value: &Dynamic) -> Fallible<()> {
        let (full, text) = setting_text(key, value, &self.out, "set")?;
        if apply_of(&full) == Apply::Reopen {
            return Err(fail(
                "set",
                format!("`{full}` needs the model opened again: open(path, #{{ {full}: ... }}) instead"),
            ));
        }
        let mut host = self.host.borrow_mut();
        let outcome = host.set(&full, &text).map_err(|e| fail("set", e))?;
        if outcome.applied == Apply::Reopen {
            // A budget change from fixed to auto or off reopened the model: allowed, but say so.
            crate::notes::note("bmoe run", &format!("{full} reopened the model"));
        }
        // Each note once per process, however often a loop sets the same thing.
        for n in outcome.notices {
            crate::notes::note("bmoe run", &n);
        }
        Ok(())
    }

    /// `s.reset()`: a new conversation (the expert cache stays warm).
    pub fn reset(&mut self) {
        self.host.borrow_mut().reset();
    }

    /// `s.config()`: every setting in effect, `bmoe.toml` keys to values.
    pub fn config(&mut self) -> Map {
        let host = self.host.borrow();
        host.config().resolved_pairs().into_iter().map(|(k, v)| (k.into(), scalar(&v))).collect()
    }

    /// `s.info()`: what opening the model found.
    pub fn info(&mut self) -> Map {
        let host = self.host.borrow();
        let i = host.info();
        let mib = |b: u64| Dynamic::from_float(b as f64 / 1048576.0);
        let mut m = Map::new();
        m.insert("model".into(), host.model().display().to_string().into());
        m.insert("arch".into(), i.arch.clone().into());
        m.insert("n_layer".into(), i64::from(i.n_layer).into());
        m.insert("n_expert".into(), i64::from(i.n_expert).into());
        m.insert("n_expert_used".into(), i64::from(i.n_expert_used).into());
        m.insert("streaming".into(), i.streaming.into());
        m.insert("bank_mib".into(), mib(i.bank_bytes));
        m.insert("cache_mib".into(), mib(i.cache_budget));
        // One token's working set: every layer's routed experts.
        let per_token: u64 = i.layers.iter().map(|l| l.expert_bytes).sum::<u64>() * u64::from(i.n_expert_used);
        m.insert("token_mib".into(), mib(per_token));
        m.insert("load_s".into(), Dynamic::from_float(i.load_s));
        m
    }

    /// Closes the host's telemetry files.
    pub fn finish(&self) -> Result<(), String> {
        self.host.borrow_mut().finish().map_err(|e| e.to_string())
    }

    fn progress(&self, what: &str, s: &RunSummary) {
        let mut runs = self.runs.borrow_mut();
        *runs += 1;
        let f = |v: Option<f64>, unit: &str| v.map_or_else(|| "-".into(), |x| format!("{x:.1}{unit}"));
        eprintln!(
            "bmoe run: [{}] {what}: {} tokens, {} tok/s, {} MiB/token, hit {}",
            *runs,
            s.generated,
            f(s.decode_tps(), ""),
            f(s.mib_per_token(), ""),
            f(s.hit_rate_pct(), "%")
        );
    }

    fn result_map(&self, g: &Generation, chat: Option<(&String, &String)>, steps: &[StepReport], logits: bool) -> Map {
        let s = &g.summary;
        let mut m = Map::new();
        let opt = |v: Option<f64>| v.map_or(Dynamic::UNIT, Dynamic::from_float);
        match chat {
            Some((reasoning, answer)) => {
                m.insert("text".into(), answer.clone().into());
                m.insert("reasoning".into(), reasoning.clone().into());
            }
            None => {
                m.insert("text".into(), g.text.clone().into());
            }
        }
        m.insert("tokens".into(), (g.tokens.len() as i64).into());
        m.insert(
            "token_ids".into(),
            g.tokens.iter().map(|&t| Dynamic::from_int(i64::from(t))).collect::<Array>().into(),
        );
        m.insert("decode_tps".into(), opt(s.decode_tps()));
        m.insert("prefill_tps".into(), opt(s.prefill_tps()));
        m.insert("mib_per_token".into(), opt(s.mib_per_token()));
        m.insert("hit_rate".into(), opt(s.hit_rate_pct()));
        m.insert("decode_tokens".into(), (s.decode_tokens as i64).into());
        m.insert("prompt_tokens".into(), (s.prompt_tokens as i64).into());
        m.insert("reused_tokens".into(), (g.reused_tokens as i64).into());
        m.insert("drafted".into(), (s.drafted as i64).into());
        m.insert("accepted".into(), (s.accepted as i64).into());
        m.insert("routings".into(), (s.routings as i64).into());
        m.insert("dropped".into(), (s.dropped as i64).into());
        m.insert("avoided_mib".into(), Dynamic::from_float(s.avoided_bytes as f64 / 1048576.0));
        m.insert("dropped_weight_pct".into(), opt(dropped_weight_pct(steps)));
        m.insert("stopped".into(), g.aborted.into());
        let ending = self.host.borrow().last_ending();
        m.insert("finish_reason".into(), ending.map_or(Dynamic::UNIT, |e| e.reason.as_str().into()));
        let cut = ending.and_then(|e| e.cut).map(|c| match c {
            Cut::Reasoning => "reasoning",
            Cut::ToolCall => "tool_call",
            Cut::Constrained => "constrained",
        });
        m.insert("cut".into(), cut.map_or(Dynamic::UNIT, Dynamic::from));
        let per_token: Array = steps.iter().map(|r| Dynamic::from_map(csv_row(r))).collect();
        m.insert("per_token".into(), per_token.into());
        if logits {
            let rows: Array = g
                .logits
                .iter()
                .map(|row| row.iter().map(|&x| Dynamic::from_float(f64::from(x))).collect::<Array>().into())
                .collect();
            m.insert("logits".into(), rows.into());
        }
        m
    }
}

/// The share of the router's applied weight that the drop policy
/// discarded over the decode steps, percent (None when the graph exposed no
/// weights).
fn dropped_weight_pct(steps: &[StepReport]) -> Option<f64> {
    let rows = steps.iter().filter(|r| r.phase == crate::engine::Phase::Decode).flat_map(|r| &r.trace.rows);
    let (mut all, mut dropped) = (0.0f64, 0.0f64);
    for row in rows.filter(|r| r.weight.is_finite()) {
        all += f64::from(row.weight);
        if row.dropped {
            dropped += f64::from(row.weight);
        }
    }
    (all > 0.0).then(|| 100.0 * dropped / all)
}

/// The largest absolute difference between two runs' logits (arrays of
/// per-token arrays), over the tokens both have.
pub fn max_abs_diff(a: &Array, b: &Array) -> Fallible<f64> {
    let rows = |x: &Array| -> Fallible<Vec<Array>> {
        x.iter()
            .map(|r| r.clone().try_cast::<Array>().ok_or_else(|| fail("max_abs_diff", "want the `logits` of two runs")))
            .collect()
    };
    let (a, b) = (rows(a)?, rows(b)?);
    let mut max = 0.0f64;
    for (ra, rb) in a.iter().zip(&b) {
        for (x, y) in ra.iter().zip(rb) {
            let (x, y) = (x.as_float().unwrap_or(f64::NAN), y.as_float().unwrap_or(f64::NAN));
            max = max.max((x - y).abs());
        }
    }
    Ok(max)
}

/// One CSV telemetry row as a map: the same columns and the same numbers
/// as the `--csv` file.
pub fn csv_row(r: &StepReport) -> Map {
    COLUMNS.iter().zip(row_fields(r)).map(|(k, v)| ((*k).into(), scalar(&v))).collect()
}

/// A setting or CSV field as a script value: an integer, a float, a bool or text.
fn scalar(text: &str) -> Dynamic {
    if let Ok(i) = text.parse::<i64>() {
        return i.into();
    }
    if let Ok(b) = text.parse::<bool>() {
        return b.into();
    }
    match text.parse::<f64>() {
        Ok(f) => Dynamic::from_float(f),
        Err(_) => text.to_string().into(),
    }
}

/// Runs one generation on `host`, collecting its decode calls and
/// stopping it if Ctrl-C is pressed.
fn run_guarded<T, E>(
    host: &mut Host,
    steps: &mut Vec<StepReport>,
    run: impl FnOnce(&mut Host, &mut dyn FnMut(HostEvent<'_>)) -> Result<T, E>,
) -> Result<T, E> {
    let abort = host.abort_handle();
    let mut on_event = |e: HostEvent<'_>| {
        if interrupt::requested() {
            abort.abort();
        }
        match e {
            HostEvent::Prefill(r) | HostEvent::Step(r) => steps.push(r.clone()),
            HostEvent::Notice(n) => crate::notes::note("bmoe run", n),
            HostEvent::Text { .. } | HostEvent::ToolCall(_) => {}
        }
    };
    run(host, &mut on_event)
}

fn check_interrupt(g: &Generation, call: &str) -> Fallible<()> {
    if g.aborted && interrupt::requested() {
        return Err(fail(call, "interrupted by Ctrl-C"));
    }
    Ok(())
}

/// A JSON value as Rhai sees it: maps, arrays, integers, floats, strings,
/// booleans, and `()` for null.
fn json_to_dynamic(v: &serde_json::Value) -> Dynamic {
    use serde_json::Value;
    match v {
        Value::Null => Dynamic::UNIT,
        Value::Bool(b) => (*b).into(),
        Value::Number(n) => {
            n.as_i64().map_or_else(|| Dynamic::from_float(n.as_f64().unwrap_or(f64::NAN)), Dynamic::from)
        }
        Value::String(s) => s.clone().into(),
        Value::Array(items) => Dynamic::from_array(items.iter().map(json_to_dynamic).collect()),
        Value::Object(fields) => {
            Dynamic::from_map(fields.iter().map(|(k, v)| (k.as_str().into(), json_to_dynamic(v))).collect())
        }
    }
}

/// A Rhai value as JSON (`()` as null; other types by their text).
fn dynamic_to_json(value: &Dynamic) -> serde_json::Value {
    use serde_json::Value;
    if value.is_unit() {
        Value::Null
    } else if let Ok(b) = value.as_bool() {
        Value::Bool(b)
    } else if let Ok(i) = value.as_int() {
        Value::from(i)
    } else if let Ok(f) = value.as_float() {
        serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
    } else if let Some(items) = value.clone().try_cast::<Array>() {
        Value::Array(items.iter().map(dynamic_to_json).collect())
    } else if let Some(fields) = value.clone().try_cast::<Map>() {
        Value::Object(fields.iter().map(|(k, v)| (k.to_string(), dynamic_to_json(v))).collect())
    } else {
        Value::String(value.to_string())
    }
}
