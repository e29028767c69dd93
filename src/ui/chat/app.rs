//! The state of `bmoe chat` and how events change it. Drawing only reads
//! it (`view.rs`); `update` says whether anything visible changed and what
//! to ask of the engine thread.

use ratatui::crossterm::event::{Event as TermEvent, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::input::InputBox;
use super::keymap::{self, Action, Context};
use super::routing::{Routing, View};
use super::telemetry::Telemetry;
use super::transcript::{Entry, Transcript};
use super::worker::{Request, Update};
use crate::chat::Kind;
use crate::host::{Host, SETTINGS, Turn};

/// What the status line and the settings popup show about the host.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostInfo {
    /// Model file name.
    pub model: String,
    /// Architecture.
    pub arch: String,
    /// Transformer layers.
    pub n_layer: u32,
    /// Experts per MoE layer.
    pub n_expert: u32,
    /// Experts routed per token.
    pub k: u32,
    /// Layer ids with experts.
    pub moe_layers: Vec<u32>,
    /// Streaming experts from disk.
    pub streaming: bool,
    /// Cache budget, MiB (0 = off).
    pub cache_mib: f64,
    /// All streamed experts, MiB.
    pub bank_mib: f64,
    /// Read lanes.
    pub lanes: usize,
    /// Draft plugin (empty = none).
    pub draft: String,
    /// Drop plugin (empty = none).
    pub drop: String,
    /// The last layers, held by RPC servers (their routing is not seen here).
    pub remote_layers: u32,
    /// Every setting and its value, as `bmoe.toml` keys.
    pub settings: Vec<(String, String)>,
}

impl HostInfo {
    /// Reads it off a host.
    pub fn of(host: &Host) -> HostInfo {
        let info = host.info();
        let config = host.config();
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        HostInfo {
            model: host.model().file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            arch: info.arch.clone(),
            n_layer: info.n_layer,
            n_expert: info.n_expert,
            k: info.n_expert_used,
            moe_layers: info.layers.iter().filter(|l| l.expert_bytes > 0).map(|l| l.layer).collect(),
            streaming: info.streaming,
            cache_mib: mib(info.cache_budget),
            bank_mib: mib(info.bank_bytes),
            lanes: info.io_threads,
            // MTP drafting shows as the drafter's name.
            draft: if config.plugins.mtp { "mtp".into() } else { config.plugins.draft_plugin.clone() },
            drop: config.plugins.drop_plugin.clone(),
            remote_layers: info.remote_layers,
            settings: config.resolved_pairs(),
        }
    }

    /// The value of setting `key`.
    pub fn setting(&self, key: &str) -> &str {
        self.settings.iter().find(|(k, _)| k == key).map_or("", |(_, v)| v)
    }
}

/// The figures of a finished turn.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TurnStats {
    /// Tokens generated.
    pub tokens: usize,
    /// Prompt tokens decoded (the rest were held from earlier turns).
    pub prefilled: u64,
    /// Decode tokens per second.
    pub decode_tps: Option<f64>,
    /// Cache hit rate, percent.
    pub hit_pct: Option<f64>,
    /// MiB read per decoded token.
    pub mib_per_token: Option<f64>,
    /// Stopped by the user.
    pub stopped: bool,
    /// Draft tokens accepted, percent, when a draft policy ran.
    pub acceptance_pct: Option<f64>,
    /// What the token limit cut off, when it did.
    pub cut: Option<crate::host::Cut>,
    /// The limit that ended the reply, when one did (not the model).
    pub limit: Option<crate::host::Limit>,
}

impl TurnStats {
    /// Reads it off a turn.
    pub fn of(turn: &Turn) -> TurnStats {
        let s = &turn.generation.summary;
        TurnStats {
            tokens: turn.generation.tokens.len(),
            prefilled: turn.prefilled,
            decode_tps: s.decode_tps(),
            hit_pct: s.hit_rate_pct(),
            mib_per_token: if s.streaming { s.mib_per_token() } else { None },
            stopped: turn.generation.aborted,
            acceptance_pct: (s.drafted > 0).then(|| 100.0 * s.accepted as f64 / s.drafted as f64),
            cut: turn.ending.cut,
            limit: turn.ending.limit,
        }
    }

    /// The line under the reply.
    pub fn footer(&self) -> String {
        let mut parts = vec![format!("{} tokens", self.tokens)];
        if let Some(t) = self.decode_tps {
            parts.push(format!("{t:.1} tok/s"));
        }
        if let Some(m) = self.mib_per_token {
            parts.push(format!("{m:.1} MiB/token"));
        }
        if let Some(h) = self.hit_pct {
            parts.push(format!("hit {h:.0}%"));
        }
        if let Some(p) = self.acceptance_pct {
            parts.push(format!("draft {p:.0}% accepted"));
        }
        parts.push(format!("{} prompt tokens decoded", self.prefilled));
        if self.stopped {
            parts.push("stopped (Esc)".into());
        }
        if let Some(limit) = self.limit {
            let by = match limit {
                crate::host::Limit::Predict => "by the token limit (raise n_predict)",
                crate::host::Limit::Context => "by the end of the context (Ctrl-N starts a new conversation)",
            };
            let what = match self.cut {
                Some(crate::host::Cut::Reasoning) => "cut off inside the reasoning",
                Some(crate::host::Cut::ToolCall) => "cut off inside a tool call",
                Some(crate::host::Cut::Constrained) => "cut off before the output was complete",
                None => "cut off",
            };
            parts.push(format!("{what} {by}"));
        }
        parts.join(" · ")
    }
}

/// An overlay over the chat screen.
#[derive(Debug, Clone, PartialEq)]
pub enum Overlay {
    /// None: the chat screen has the keys.
    None,
    /// The help overlay, scrolled this many lines.
    Help(u16),
    /// The settings popup: the selected row, and the value being edited.
    Settings {
        /// Index into [`SETTINGS`].
        selected: usize,
        /// The new value being typed, when editing.
        editing: Option<InputBox>,
    },
}

/// Everything the chat screen shows.
pub struct App {
    /// The host's model and settings.
    pub info: HostInfo,
    /// The model has random weights (the demo).
    pub demo: bool,
    /// The conversation.
    pub transcript: Transcript,
    /// The message being typed.
    pub input: InputBox,
    /// The routing matrix.
    pub routing: Routing,
    /// Which routing view is shown.
    pub routing_view: View,
    /// First routing row shown.
    pub routing_scroll: usize,
    /// Telemetry aggregates.
    pub telemetry: Telemetry,
    /// The open overlay.
    pub overlay: Overlay,
    /// A turn is running.
    pub generating: bool,
    /// A setting request is being applied.
    pub applying: bool,
    /// The result of the last setting change, for the settings popup.
    pub settings_message: Option<Result<String, String>>,
    /// One Ctrl-C was pressed; the next quits.
    pub quit_armed: bool,
    /// Time to leave.
    pub should_quit: bool,
    /// Colours on.
    pub colour: bool,
}

/// What `update` asks of the event loop.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Effect {
    /// Something visible changed.
    pub redraw: bool,
    /// A request for the engine thread.
    pub request: Option<Request>,
    /// Stop the running turn.
    pub abort: bool,
}

impl Effect {
    fn redraw() -> Effect {
        Effect { redraw: true, ..Effect::default() }
    }
}

/// Conversation lines one PgUp/PgDn moves.
const PAGE: isize = 10;

impl App {
    /// A fresh screen for a host with `info`.
    pub fn new(info: HostInfo, demo: bool, colour: bool) -> App {
        let routing = Routing::new(info.moe_layers.clone(), info.n_expert as usize, info.cache_mib > 0.0);
        let telemetry = Telemetry::for_budget(info.cache_mib);
        App {
            routing,
            demo,
            transcript: Transcript::new(colour),
            input: InputBox::default(),
            routing_view: View::Now,
            routing_scroll: 0,
            telemetry,
            overlay: Overlay::None,
            generating: false,
            applying: false,
            settings_message: None,
            quit_armed: false,
            should_quit: false,
            colour,
            info,
        }
    }

    /// The key context in effect.
    pub fn context(&self) -> Context {
        match &self.overlay {
            Overlay::None => Context::Chat,
            Overlay::Help(_) => Context::Help,
            Overlay::Settings { editing: None, .. } => Context::Settings,
            Overlay::Settings { editing: Some(_), .. } => Context::SettingEdit,
        }
    }

    /// Applies an engine update.
    pub fn on_update(&mut self, update: Update) -> Effect {
        match update {
            Update::Info(info) => {
                if info.moe_layers != self.info.moe_layers
                    || info.n_expert != self.info.n_expert
                    || (info.cache_mib > 0.0) != (self.info.cache_mib > 0.0)
                {
                    self.routing = Routing::new(info.moe_layers.clone(), info.n_expert as usize, info.cache_mib > 0.0);
                }
                if self.info.cache_mib != info.cache_mib {
                    self.telemetry.set_budget(info.cache_mib);
                }
                self.info = *info;
            }
            Update::TurnStarted => {
                self.generating = true;
                self.telemetry.start_turn();
                self.transcript.push(Entry::Reply { reasoning: String::new(), answer: String::new(), footer: None });
            }
            Update::Text(kind, text) => {
                if let Some((reasoning, answer, _)) = self.transcript.live_reply() {
                    match kind {
                        Kind::Reasoning => reasoning.push_str(&text),
                        Kind::Answer => answer.push_str(&text),
                    }
                }
            }
            Update::Prefill(r) => {
                self.routing.observe(&r);
                self.telemetry.observe(&r);
            }
            Update::Step(r) => {
                self.routing.observe(&r);
                self.telemetry.observe(&r);
            }
            Update::Notice(n) => self.transcript.push(Entry::Notice(n)),
            Update::CopyProgress(done, total) => {
                let [done, total] = crate::units::sizes([done, total]);
                self.transcript.progress(format!("writing the repacked copy of the experts: {done} of {total}"));
            }
            Update::ToolCall(call) => self.transcript.push(Entry::ToolCall(call)),
            Update::TurnDone(result) => {
                self.generating = false;
                match result {
                    Ok(stats) => {
                        if let Some((_, _, footer)) = self.transcript.live_reply() {
                            *footer = Some(stats.footer());
                        }
                    }
                    Err(e) => {
                        self.transcript.fail_live_reply();
                        self.transcript.push(Entry::Error(e));
                    }
                }
            }
            Update::SetDone(result) => {
                self.applying = false;
                let entry = match &result {
                    Ok(text) => Entry::Notice(format!("set {text}")),
                    Err(e) => Entry::Error(e.clone()),
                };
                self.transcript.push(entry);
                self.settings_message = Some(result);
            }
            Update::ResetDone => {
                self.transcript.clear();
                self.transcript.push(Entry::Notice("new conversation".into()));
            }
        }
        Effect::redraw()
    }

    /// Applies a terminal event.
    pub fn on_terminal(&mut self, event: TermEvent) -> Effect {
        match event {
            TermEvent::Key(key) if key.kind != KeyEventKind::Release => self.on_key(key),
            TermEvent::Paste(text) => {
                match &mut self.overlay {
                    Overlay::None => self.input.insert(&text),
                    Overlay::Settings { editing: Some(edit), .. } => edit.insert(&text.replace('\n', " ")),
                    _ => return Effect::default(),
                }
                Effect::redraw()
            }
            TermEvent::Resize(..) => Effect::redraw(),
            TermEvent::Mouse(m) => match m.kind {
                ratatui::crossterm::event::MouseEventKind::ScrollUp => self.scroll(3),
                ratatui::crossterm::event::MouseEventKind::ScrollDown => self.scroll(-3),
                _ => Effect::default(),
            },
            _ => Effect::default(),
        }
    }

    fn scroll(&mut self, lines: isize) -> Effect {
        self.transcript.scroll(lines);
        Effect::redraw()
    }

    fn on_key(&mut self, key: KeyEvent) -> Effect {
        let action = keymap::action(self.context(), &key);
        if action != Some(Action::Quit) {
            self.quit_armed = false;
        }
        match action {
            Some(Action::Quit) => {
                if self.quit_armed {
                    self.should_quit = true;
                    return Effect { abort: self.generating, ..Effect::redraw() };
                }
                self.quit_armed = true;
                Effect::redraw()
            }
            Some(action) => match self.context() {
                Context::Chat => self.chat_action(action, &key),
                Context::Help => {
                    let Overlay::Help(scroll) = &mut self.overlay else { return Effect::default() };
                    match action {
                        Action::Prev => *scroll = scroll.saturating_sub(1),
                        // The view stops at the last line of help.
                        Action::Next => *scroll = scroll.saturating_add(1),
                        _ => self.overlay = Overlay::None,
                    }
                    Effect::redraw()
                }
                Context::Settings | Context::SettingEdit => self.settings_action(action),
                Context::Global => Effect::default(),
            },
            None => self.type_key(&key),
        }
    }

    /// Keys that edit text: the message box, or the setting being edited.
    fn type_key(&mut self, key: &KeyEvent) -> Effect {
        let input = match &mut self.overlay {
            Overlay::None => &mut self.input,
            Overlay::Settings { editing: Some(edit), .. } => edit,
            _ => return Effect::default(),
        };
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        match key.code {
            KeyCode::Char('u') if ctrl => input.set(""),
            KeyCode::Char('a') if ctrl => input.home(),
            KeyCode::Char('e') if ctrl => input.end(),
            KeyCode::Char(c) if !ctrl => input.insert(c.encode_utf8(&mut [0; 4])),
            KeyCode::Backspace => input.backspace(),
            KeyCode::Delete => input.delete(),
            KeyCode::Left => input.left(),
            KeyCode::Right => input.right(),
            KeyCode::Home => input.home(),
            KeyCode::End => input.end(),
            KeyCode::Up => input.up(),
            KeyCode::Down => input.down(),
            _ => return Effect::default(),
        }
        Effect::redraw()
    }

    fn chat_action(&mut self, action: Action, key: &KeyEvent) -> Effect {
        match action {
            Action::Send => {
                if self.input.text().trim().is_empty() {
                    return Effect::default();
                }
                if let Some(why) = self.busy() {
                    self.transcript.push(Entry::Notice(why.into()));
                    return Effect::redraw();
                }
                let message = self.input.take();
                self.transcript.push(Entry::User(message.clone()));
                self.transcript.scroll_back = 0;
                self.generating = true;
                Effect { request: Some(Request::Chat(message)), ..Effect::redraw() }
            }
            Action::Newline => {
                self.input.insert("\n");
                Effect::redraw()
            }
            Action::Stop => Effect { abort: self.generating, ..Effect::default() },
            Action::Help if key.code == KeyCode::Char('?') && !self.input.is_empty() => self.type_key(key),
            Action::Help => {
                self.overlay = Overlay::Help(0);
                Effect::redraw()
            }
            Action::Settings => {
                self.overlay = Overlay::Settings { selected: 0, editing: None };
                Effect::redraw()
            }
            Action::RoutingView => {
                self.routing_view = self.routing_view.next();
                Effect::redraw()
            }
            Action::ToggleThinking => {
                self.transcript.show_reasoning = !self.transcript.show_reasoning;
                Effect::redraw()
            }
            Action::ThinkSwitch => {
                if let Some(why) = self.busy() {
                    self.transcript.push(Entry::Notice(why.into()));
                    return Effect::redraw();
                }
                let thinking = self.info.setting("chat.think") != "false";
                self.applying = true;
                Effect { request: Some(Request::Set("chat.think".into(), (!thinking).to_string())), ..Effect::redraw() }
            }
            Action::PageUp => self.scroll(PAGE),
            Action::PageDown => self.scroll(-PAGE),
            Action::RoutingUp => {
                self.routing_scroll = self.routing_scroll.saturating_sub(1);
                Effect::redraw()
            }
            Action::RoutingDown => {
                self.routing_scroll = (self.routing_scroll + 1).min(self.routing.rows().saturating_sub(1));
                Effect::redraw()
            }
            Action::NewChat if self.generating => Effect::default(),
            Action::NewChat => Effect { request: Some(Request::Reset), ..Effect::default() },
            _ => Effect::default(),
        }
    }

    /// What is under way that keeps a turn or a setting from starting now.
    fn busy(&self) -> Option<&'static str> {
        if self.generating {
            Some("a reply is still being written: Esc stops it")
        } else if self.applying {
            Some("a setting is still being applied: wait for it")
        } else {
            None
        }
    }

    fn settings_action(&mut self, action: Action) -> Effect {
        let busy = self.busy();
        let Overlay::Settings { selected, editing } = &mut self.overlay else { return Effect::default() };
        match (action, editing.is_some()) {
            (Action::Close, false) => self.overlay = Overlay::None,
            (Action::Close, true) => *editing = None,
            (Action::Prev, false) => *selected = selected.saturating_sub(1),
            (Action::Next, false) => *selected = (*selected + 1).min(SETTINGS.len() - 1),
            (Action::Enter, false) => {
                let mut edit = InputBox::default();
                // Selected, so typing replaces the value; a cursor key edits it.
                edit.set_selected(self.info.setting(SETTINGS[*selected].0));
                *editing = Some(edit);
                self.settings_message = None;
            }
            (Action::Enter, true) => {
                if let Some(why) = busy {
                    self.settings_message = Some(Err(why.into()));
                    return Effect::redraw();
                }
                let key = SETTINGS[*selected].0.to_string();
                let value = editing.take().map(|e| e.text().to_string()).unwrap_or_default();
                self.applying = true;
                self.settings_message = Some(Ok(format!("applying {key} = {value} …")));
                return Effect { request: Some(Request::Set(key, value)), ..Effect::redraw() };
            }
            _ => return Effect::default(),
        }
        Effect::redraw()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app() -> App {
        let info = HostInfo { moe_layers: vec![0, 1], n_expert: 4, k: 2, streaming: true, ..HostInfo::default() };
        App::new(info, false, false)
    }

    fn press(app: &mut App, code: KeyCode, mods: KeyModifiers) -> Effect {
        app.on_terminal(TermEvent::Key(KeyEvent::new(code, mods)))
    }

    fn key(app: &mut App, code: KeyCode) -> Effect {
        press(app, code, KeyModifiers::NONE)
    }

    /// Ctrl-T asks for `chat.think` the other way round from what is in
    /// effect, and not while a reply or a setting is under way.
    /// A reply a limit ended says so under it, by which limit, whether or
    /// not it was inside something; one the model ended says nothing.
    #[test]
    fn the_footer_marks_a_cut_reply() {
        use crate::host::{Cut, Limit};
        let stats = |cut, limit| TurnStats { tokens: 9, cut, limit, ..TurnStats::default() }.footer();
        assert!(stats(None, Some(Limit::Predict)).contains("cut off by the token limit (raise n_predict)"));
        assert!(stats(Some(Cut::Reasoning), Some(Limit::Context)).contains("cut off inside the reasoning by the end"));
        assert!(!stats(None, None).contains("cut off"));
    }

    #[test]
    fn ctrl_t_switches_thinking() {
        let mut a = app();
        a.info.settings = vec![("chat.think".into(), "true".into())];
        let effect = press(&mut a, KeyCode::Char('t'), KeyModifiers::CONTROL);
        assert_eq!(effect.request, Some(Request::Set("chat.think".into(), "false".into())));
        assert_eq!(press(&mut a, KeyCode::Char('t'), KeyModifiers::CONTROL).request, None, "one setting at a time");
        a.on_update(Update::SetDone(Ok("chat.think = false".into())));
        a.info.settings = vec![("chat.think".into(), "false".into())];
        let effect = press(&mut a, KeyCode::Char('t'), KeyModifiers::CONTROL);
        assert_eq!(effect.request, Some(Request::Set("chat.think".into(), "true".into())));
    }

    /// While a setting is applied, Enter and Ctrl-T say so (not that a
    /// reply is being written) and ask nothing of the engine.
    #[test]
    fn keys_refused_while_a_setting_applies_say_why() {
        let mut a = app();
        a.applying = true;
        a.on_terminal(TermEvent::Paste("hi".into()));
        assert_eq!(key(&mut a, KeyCode::Enter).request, None);
        assert_eq!(press(&mut a, KeyCode::Char('t'), KeyModifiers::CONTROL).request, None);
        let notices: Vec<&Entry> = a.transcript.entries().collect();
        let want = Entry::Notice("a setting is still being applied: wait for it".into());
        assert_eq!(notices, [&want, &want]);
        key(&mut a, KeyCode::F(2));
        key(&mut a, KeyCode::Enter);
        assert_eq!(key(&mut a, KeyCode::Enter).request, None);
        assert!(matches!(&a.settings_message, Some(Err(e)) if e.contains("a setting is still being applied")));
        a.on_update(Update::SetDone(Ok("chat.think = false".into())));
        key(&mut a, KeyCode::Esc);
        key(&mut a, KeyCode::Esc);
        assert_eq!(key(&mut a, KeyCode::Enter).request, Some(Request::Chat("hi".into())));
    }

    #[test]
    fn enter_sends_once_and_esc_stops_only_a_running_turn() {
        let mut a = app();
        assert!(!key(&mut a, KeyCode::Esc).abort);
        assert_eq!(key(&mut a, KeyCode::Enter).request, None, "nothing typed");
        a.on_terminal(TermEvent::Paste("hi?".into()));
        assert_eq!(a.input.text(), "hi?");
        assert_eq!(key(&mut a, KeyCode::Enter).request, Some(Request::Chat("hi?".into())));
        assert!(a.generating && a.input.is_empty());
        a.on_update(Update::TurnStarted);
        a.on_terminal(TermEvent::Paste("next".into()));
        assert_eq!(key(&mut a, KeyCode::Enter).request, None, "one turn at a time");
        assert!(key(&mut a, KeyCode::Esc).abort);
        a.on_update(Update::Text(Kind::Answer, "partial".into()));
        a.on_update(Update::TurnDone(Ok(TurnStats { tokens: 1, stopped: true, ..TurnStats::default() })));
        assert!(!a.generating);
        // The notice about the refused message came after the reply began.
        let reply = a.transcript.entries().find(|e| matches!(e, Entry::Reply { .. }));
        let Some(Entry::Reply { answer, footer: Some(f), .. }) = reply else { panic!("{reply:?}") };
        assert_eq!(answer, "partial");
        assert!(f.contains("stopped (Esc)"), "{f}");
        assert_eq!(key(&mut a, KeyCode::Enter).request, Some(Request::Chat("next".into())));
    }

    #[test]
    fn ctrl_c_twice_quits_and_anything_between_disarms_it() {
        let mut a = app();
        press(&mut a, KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert!(a.quit_armed && !a.should_quit);
        key(&mut a, KeyCode::Char('x'));
        assert!(!a.quit_armed);
        a.generating = true;
        press(&mut a, KeyCode::Char('c'), KeyModifiers::CONTROL);
        let effect = press(&mut a, KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert!(a.should_quit && effect.abort);
    }

    #[test]
    fn question_mark_opens_help_only_on_an_empty_message() {
        let mut a = app();
        key(&mut a, KeyCode::Char('?'));
        assert_eq!(a.overlay, Overlay::Help(0));
        key(&mut a, KeyCode::Down);
        assert_eq!(a.overlay, Overlay::Help(1));
        key(&mut a, KeyCode::Esc);
        assert_eq!(a.overlay, Overlay::None);
        key(&mut a, KeyCode::Char('w'));
        key(&mut a, KeyCode::Char('?'));
        assert_eq!((a.overlay.clone(), a.input.text()), (Overlay::None, "w?"));
    }

    #[test]
    fn a_refused_turn_leaves_an_error_not_an_empty_reply() {
        let mut a = app();
        a.on_update(Update::TurnStarted);
        a.on_update(Update::TurnDone(Err("the conversation needs 5000 tokens".into())));
        let entries: Vec<&Entry> = a.transcript.entries().collect();
        assert_eq!(entries, [&Entry::Error("the conversation needs 5000 tokens".into())]);
    }

    #[test]
    fn settings_apply_between_turns_only() {
        let mut a = app();
        a.info.settings = vec![("generate.n_predict".into(), "128".into())];
        key(&mut a, KeyCode::F(2));
        let row = SETTINGS.iter().position(|s| s.0 == "generate.n_predict").unwrap();
        for _ in 0..row {
            key(&mut a, KeyCode::Down);
        }
        key(&mut a, KeyCode::Enter);
        let Overlay::Settings { editing: Some(edit), .. } = &a.overlay else { panic!("{:?}", a.overlay) };
        assert_eq!(edit.text(), "128");
        press(&mut a, KeyCode::Char('u'), KeyModifiers::CONTROL);
        key(&mut a, KeyCode::Char('9'));
        a.generating = true;
        assert_eq!(key(&mut a, KeyCode::Enter).request, None);
        assert!(matches!(&a.settings_message, Some(Err(e)) if e.contains("a reply is still being written")));
        a.generating = false;
        let effect = key(&mut a, KeyCode::Enter);
        assert_eq!(effect.request, Some(Request::Set("generate.n_predict".into(), "9".into())));
        a.on_update(Update::SetDone(Err("generate.n_predict: bad".into())));
        assert!(!a.applying);
        assert!(matches!(a.transcript.entries().last(), Some(Entry::Error(_))));
    }

    #[test]
    fn a_copy_in_progress_is_one_notice_that_moves_on() {
        let mut a = app();
        a.on_update(Update::Notice("writing a repacked copy of the experts, once: 1.0 GiB into /c".into()));
        a.on_update(Update::CopyProgress(256 << 20, 1 << 30));
        a.on_update(Update::CopyProgress(1 << 30, 1 << 30));
        let notes: Vec<String> = a
            .transcript
            .entries()
            .filter_map(|e| match e {
                Entry::Notice(n) => Some(n.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert_eq!(notes[1], "writing the repacked copy of the experts: 1.0 GiB of 1.0 GiB");
    }
}
