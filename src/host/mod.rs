//! The session host: the one place that opens a model from a [`RunConfig`],
//! attaches its plugins and telemetry files, holds the conversation and its
//! chat format, and changes settings between turns. Every front end
//! (`generate`, `repl`, `chat`, `run`) sits on a host and consumes its
//! [`HostEvent`]s; none reaches into the engine's internals.

mod demo;
mod ending;
mod plugins;
mod prompt_tokens;
mod prompter;
mod recent;
mod settings;
mod sinks;
mod turn;

use std::path::{Path, PathBuf};

pub use demo::{demo_budget, resolve_model};
pub use recent::models_used;
pub use settings::{Apply, SETTINGS, apply_of, description};

use crate::chat::{ChatFormat, ChatPrompt, Conversation, Kind, Message, TemplateError, ThinkControl, ToolCall};
use crate::config::RunConfig;
use crate::engine::{
    AbortHandle, CacheBudget, EngineError, Event, GenerateRequest, Generation, OpenReport, Prompt, Session, StepReport,
};
use crate::gguf::ModelFiles;
use crate::telemetry::summary::RunSummary;
pub use ending::{Cut, Ending, FinishReason, Limit};
pub use prompter::{Prepared, Prompter};
use sinks::Sinks;
pub use turn::{StopScan, TurnSettings};

/// What a host reports while a turn runs.
#[derive(Debug)]
pub enum HostEvent<'a> {
    /// Generated text, markers removed: reasoning or answer.
    Text {
        /// Which part of the output.
        kind: Kind,
        /// Text to append.
        text: &'a str,
    },
    /// A prompt batch was decoded.
    Prefill(&'a StepReport),
    /// A generated token was decoded: its routing, reads and timings.
    Step(&'a StepReport),
    /// Something the user should know now.
    Notice(&'a str),
    /// The reply called a function (sent once the reply is complete).
    ToolCall(&'a ToolCall),
}

/// A consumer of host events.
pub type OnEvent<'a> = dyn FnMut(HostEvent<'_>) + 'a;

/// Why a turn or a setting failed. The host stays usable after any of them.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The chat template could not render the conversation.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The conversation no longer fits in the context.
    #[error(
        "the conversation needs {needed} tokens with room for a reply, more than the context's {n_ctx}: \
         start over (`:reset` in the REPL) or reopen with a larger generate.ctx_size"
    )]
    ContextFull {
        /// Tokens the prompt and a minimal reply need.
        needed: usize,
        /// The context size.
        n_ctx: u32,
    },
    /// The engine refused or failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A setting, plugin or file problem.
    #[error("{0}")]
    Setting(String),
}

/// The result of one turn.
#[derive(Debug, Clone, Default)]
pub struct Turn {
    /// The reasoning, markers removed (empty when the model gave none).
    pub reasoning: String,
    /// The answer, tool calls removed.
    pub answer: String,
    /// The functions the reply called, in order (each with an id).
    pub tool_calls: Vec<ToolCall>,
    /// Tokens, timings and totals of the generation.
    pub generation: Generation,
    /// Prompt tokens decoded for this turn (the rest were reused).
    pub prefilled: u64,
    /// How the reply ended, and what it left open if it ran out of tokens.
    pub ending: Ending,
    /// The stop string that ended it, if one did.
    pub stop_sequence: Option<String>,
}

/// A chat reply being generated ([`Host::begin_reply`]).
pub struct Reply {
    /// The rendered prompt.
    pub prompt: ChatPrompt,
    /// The prompt's tokens.
    pub tokens: Vec<i32>,
    /// Tokens to generate at most (the room left in the context caps it).
    pub n_predict: u32,
    /// The budget asked for, before the room capped it (`u32::MAX`: none).
    budget: u32,
    /// Token selection.
    pub sampling: crate::llama::Sampling,
    /// What the reply follows (a forced tool call's grammar, or the
    /// settings' constraint), if anything.
    pub constraint: Option<crate::llama::Constraint>,
    forced_call: bool,
    stop: StopScan,
    splitter: crate::chat::Splitter,
    tools: Option<serde_json::Value>,
    reasoning: String,
    answer: String,
}

impl Reply {
    /// The engine request that generates this reply from `prompt`.
    pub fn request(&self, prompt: Prompt, keep_logits: bool) -> GenerateRequest {
        GenerateRequest {
            prompt,
            n_predict: self.n_predict,
            sampling: self.sampling.clone(),
            continue_context: false,
            keep_logits,
            constraint: self.constraint.clone(),
        }
    }

    /// Takes generated text: passes on what precedes any stop string, split
    /// into reasoning and answer. True once a stop string was found (the
    /// generation should stop).
    pub fn push(&mut self, text: &str, on_event: &mut dyn FnMut(HostEvent<'_>)) -> bool {
        let text = self.stop.push(text);
        self.route(&text, on_event);
        self.stop.hit()
    }

    fn route(&mut self, text: &str, on_event: &mut dyn FnMut(HostEvent<'_>)) {
        for (kind, piece) in self.splitter.push(text) {
            self.add(kind, &piece, on_event);
        }
    }

    fn add(&mut self, kind: Kind, text: &str, on_event: &mut dyn FnMut(HostEvent<'_>)) {
        match kind {
            Kind::Reasoning => self.reasoning.push_str(text),
            Kind::Answer => self.answer.push_str(text),
        }
        on_event(HostEvent::Text { kind, text });
    }
}

/// What `set` did.
#[derive(Debug, Clone, PartialEq)]
pub struct SetOutcome {
    /// The full setting name.
    pub key: String,
    /// How it took effect.
    pub applied: Apply,
    /// Things to tell the user (plugin loads, evictions).
    pub notices: Vec<String>,
}

/// A loaded model with its conversation.
pub struct Host {
    config: RunConfig,
    model: PathBuf,
    session: Session,
    format: ChatFormat,
    conversation: Conversation,
    sinks: Sinks,
    totals: RunSummary,
    last_step: Option<StepReport>,
    notices: Vec<String>,
    /// The text the session's held tokens stand for, after a chat turn:
    /// the next prompt, if it starts with this text, extends those tokens
    /// exactly instead of being tokenized again.
    held_text: Option<String>,
    /// Keep every generated token's logits in the generation (scripts).
    keep_logits: bool,
    /// Thinking was asked off on a template with no switch bmoe knows, and
    /// the user has been told.
    told_no_switch: bool,
    /// The user was told the reasoning effort asked for changes nothing.
    told_effort_ignored: bool,
    /// How the last generation ended.
    last_ending: Option<Ending>,
}

/// Only a route trace file shows the applied routing weights.
fn wants_route_weights(config: &RunConfig) -> bool {
    !config.telemetry.route_trace.as_os_str().is_empty()
}

impl Host {
    /// Opens `model` with `config`: the session, its plugins, its chat
    /// format and its telemetry files.
    pub fn open(config: RunConfig, model: &Path) -> Result<Host, HostError> {
        Host::open_sequences(config, model, 1)
    }

    /// Opens `model` for `sequences` conversations decoded together (a
    /// server's slots): each gets the configured context length.
    pub fn open_sequences(config: RunConfig, model: &Path, sequences: u32) -> Result<Host, HostError> {
        let (session, format, notices) = open_session(&config, model, sequences)?;
        let sinks = Sinks::open(&config, model, session.info()).map_err(HostError::Setting)?;
        Ok(Host::assemble(config, model, session, format, sinks, notices))
    }

    fn assemble(
        config: RunConfig,
        model: &Path,
        session: Session,
        format: ChatFormat,
        sinks: Sinks,
        notices: Vec<String>,
    ) -> Host {
        let mut session = session;
        session.set_record_weights(wants_route_weights(&config));
        let conversation = Conversation { system: system_prompt(&config), messages: Vec::new() };
        Host {
            config,
            model: model.to_path_buf(),
            session,
            format,
            conversation,
            sinks,
            totals: RunSummary::default(),
            last_step: None,
            notices,
            held_text: None,
            keep_logits: false,
            told_no_switch: false,
            told_effort_ignored: false,
            last_ending: None,
        }
    }

    /// The configuration in effect.
    pub fn config(&self) -> &RunConfig {
        &self.config
    }

    /// The model file.
    pub fn model(&self) -> &Path {
        &self.model
    }

    /// What opening the model found.
    pub fn info(&self) -> &OpenReport {
        self.session.info()
    }

    /// The chat format in use.
    pub fn chat_format(&self) -> &ChatFormat {
        &self.format
    }

    /// The conversation so far.
    pub fn conversation(&self) -> &Conversation {
        &self.conversation
    }

    /// Replaces the conversation (e.g. one loaded from a file); the next
    /// turn reuses whatever prefix of it the session still holds.
    pub fn set_conversation(&mut self, conversation: Conversation) {
        self.conversation = conversation;
        self.held_text = None;
    }

    /// Sets or clears the system prompt of the conversation.
    pub fn set_system(&mut self, system: Option<String>) {
        self.conversation.system = system.filter(|s| !s.is_empty());
    }

    /// Starts a new conversation (the expert cache stays warm).
    pub fn reset(&mut self) {
        self.session.reset();
        self.held_text = None;
        self.conversation = Conversation { system: system_prompt(&self.config), messages: Vec::new() };
    }

    /// Totals over every turn since the host opened.
    pub fn totals(&self) -> &RunSummary {
        &self.totals
    }

    /// The last decode step (its routing), if any.
    pub fn last_step(&self) -> Option<&StepReport> {
        self.last_step.as_ref()
    }

    /// The context length of one conversation (of one sequence, when
    /// several are decoded together).
    pub fn slot_ctx(&self) -> u32 {
        self.session.seq_ctx()
    }

    /// The session, for a front end that drives several sequences itself.
    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    /// Adds a decode step a front end ran itself to the telemetry files
    /// and the totals.
    pub fn record_step(&mut self, report: &StepReport) {
        record(&mut self.sinks, &mut self.totals, &mut self.last_step, report);
    }

    /// Tokens the conversation holds and the context size.
    pub fn context_use(&self) -> (usize, u32) {
        (self.session.context_len(), self.session.n_ctx())
    }

    /// Notices gathered since the last call (open, plugins, settings).
    pub fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    /// Prints what opening the model had to say: its notices (the chat
    /// template's absence only when `chatting`) and, with `-v`, the details
    /// of how streaming was set up; each once per process
    /// ([`crate::notes`]).
    pub fn print_open_notes(&mut self, prefix: &str, chatting: bool) {
        for notice in self.take_notices() {
            if chatting || notice != NO_TEMPLATE_NOTICE {
                crate::notes::note(prefix, &notice);
            }
        }
        for detail in &self.session.info().details {
            crate::notes::detail(prefix, detail);
        }
    }

    /// Keeps (or stops keeping) the logits each generated token was chosen
    /// from, in [`Generation::logits`].
    pub fn keep_logits(&mut self, keep: bool) {
        self.keep_logits = keep;
    }

    /// A handle that stops the running turn at its next graph node.
    pub fn abort_handle(&self) -> AbortHandle {
        self.session.abort_handle()
    }

    /// One chat turn: `message` from the user, the model's reply streamed
    /// through `on_event`. On an error the conversation is unchanged; a
    /// stopped turn keeps what was generated.
    pub fn chat(&mut self, message: &str, on_event: &mut dyn FnMut(HostEvent<'_>)) -> Result<Turn, HostError> {
        self.chat_from(message, "", on_event)
    }

    /// One chat turn whose reply begins with `start` (prefill; empty: none):
    /// the model goes on from it, and the turn's answer is the rest (the
    /// conversation keeps the whole message).
    pub fn chat_from(
        &mut self,
        message: &str,
        start: &str,
        on_event: &mut dyn FnMut(HostEvent<'_>),
    ) -> Result<Turn, HostError> {
        let settings = self.turn_settings()?;
        let mut new = vec![Message::new("user", message)];
        if !start.is_empty() {
            new.push(Message::new("assistant", start));
        }
        self.reply(new, None, &settings, on_event)
    }

    /// The settings a turn runs with by the configuration.
    pub fn turn_settings(&self) -> Result<TurnSettings, HostError> {
        TurnSettings::from_config(&self.config).map_err(HostError::Setting)
    }

    /// The model's reply to `conversation` (which replaces the host's) with
    /// `settings` instead of the configuration's: a server's request,
    /// its prompt `prepared` already by this host's [`Prompter`] (`None`:
    /// rendered and tokenized here). The session keeps whatever prefix of
    /// the prompt it already holds.
    pub fn reply_to(
        &mut self,
        conversation: Conversation,
        prepared: Option<Prepared>,
        settings: &TurnSettings,
        on_event: &mut dyn FnMut(HostEvent<'_>),
    ) -> Result<Turn, HostError> {
        self.conversation = conversation;
        self.reply(Vec::new(), prepared, settings, on_event)
    }

    /// The calls of the last reply that no `tool` message answers yet
    /// (results answer calls in order).
    pub fn pending_calls(&self) -> Vec<ToolCall> {
        let messages = &self.conversation.messages;
        let Some(last) = messages.iter().rposition(|m| m.role == "assistant") else { return Vec::new() };
        let answered = messages[last + 1..].iter().filter(|m| m.role == "tool").count();
        messages[last].tool_calls.iter().skip(answered).cloned().collect()
    }

    /// Answers the first pending call with `result` (a `tool` message joins
    /// the conversation); the call answered. [`Host::continue_reply`] lets
    /// the model go on once every call has its answer.
    pub fn answer_call(&mut self, result: &str) -> Result<ToolCall, HostError> {
        let call = self.pending_calls().into_iter().next();
        let call = call.ok_or_else(|| {
            HostError::Setting(match self.last_ending.filter(|e| e.cut == Some(Cut::ToolCall)) {
                Some(e) => format!(
                    "the last reply's tool call was cut off at {} tokens before it closed, so there is no call to \
                     answer (raise -n / generate.n_predict and ask again)",
                    e.tokens
                ),
                None => "the last reply has no call left to answer".into(),
            })
        })?;
        self.conversation.messages.push(Message::tool_result(&call, result));
        Ok(call)
    }

    /// The model's next reply to the conversation as it stands (after tool
    /// results).
    pub fn continue_reply(&mut self, on_event: &mut dyn FnMut(HostEvent<'_>)) -> Result<Turn, HostError> {
        if self.conversation.messages.last().is_none_or(|m| m.role != "tool") {
            return Err(HostError::Setting(
                "nothing to reply to: the conversation does not end in a tool result".into(),
            ));
        }
        let settings = self.turn_settings()?;
        self.reply(Vec::new(), None, &settings, on_event)
    }

    /// Sets the tools shown to the model from the next turn, over
    /// `chat.tools` (`None`: back to what `chat.tools` names).
    pub fn set_tools(&mut self, tools: Option<serde_json::Value>) -> Result<(), HostError> {
        let tools = match tools {
            Some(tools) => Some(tools),
            None => self.config.chat.tool_list().map_err(|e| HostError::Setting(format!("chat.tools: {e}")))?,
        };
        self.format.set_tools(tools);
        Ok(())
    }

    /// Shows `tools` (and only them) to the model from the next turn, and
    /// renders with `effort` (`None`: the template's default): what one
    /// server request asks for, whatever the configuration says.
    pub fn show_for_request(&mut self, tools: Option<serde_json::Value>, effort: Option<String>) {
        self.format.set_tools(tools);
        self.format.set_reasoning_effort(effort);
    }

    /// The model's reply to the conversation with `new` messages appended
    /// (its prompt `prepared` already, or rendered here); on success both
    /// join the conversation.
    fn reply(
        &mut self,
        new: Vec<Message>,
        prepared: Option<Prepared>,
        settings: &TurnSettings,
        on_event: &mut dyn FnMut(HostEvent<'_>),
    ) -> Result<Turn, HostError> {
        let mut messages = self.conversation.rendered_messages();
        messages.extend(new.iter().cloned());
        let prepared = match prepared {
            Some(prepared) => prepared,
            None => self.prepare(&messages, settings.think)?,
        };
        let mut reply = self.begin_prepared_reply(prepared, &messages, settings, on_event)?;
        let continued = reply.prompt.continues;
        let tokens = self.prompt_tokens(&reply.prompt.text, reply.tokens.clone());
        let prompt_len = tokens.len();
        let request = reply.request(Prompt::Tokens(tokens), self.keep_logits);
        let abort = self.session.abort_handle();
        let mut generation = self.run(
            &request,
            &mut |event, on_event| {
                if let Event::Token { text, .. } = event
                    && reply.push(text, on_event)
                {
                    abort.abort();
                }
            },
            on_event,
        )?;
        // The held tokens stand for this text only if the session holds all
        // of them: a turn stopped during its prompt keeps less.
        if self.session.context_len() == prompt_len + generation.tokens.len() {
            self.held_text = Some(reply.prompt.text.clone() + generation.text.as_str());
        }
        let called_before: usize = self.conversation.messages.iter().map(|m| m.tool_calls.len()).sum();
        let turn = self.end_reply(reply, &mut generation, called_before, on_event);
        self.conversation.messages.extend(new);
        let reasoning = (!turn.reasoning.is_empty()).then(|| turn.reasoning.clone());
        match self.conversation.messages.last_mut() {
            // A continued message takes the rest of its text (and calls).
            Some(last) if continued => {
                last.content.push_str(&turn.answer);
                last.tool_calls.extend(turn.tool_calls.iter().cloned());
            }
            _ => {
                let message = Message::reply(&turn.answer, reasoning, turn.tool_calls.clone());
                self.conversation.messages.push(message);
            }
        }
        Ok(turn)
    }

    /// Starts a reply to `messages` (the system prompt first) with
    /// `settings`: the rendered prompt, the grammar, and the splitting of
    /// what is generated into reasoning and answer. Whoever runs the
    /// generation feeds its text to [`Reply::push`] and ends it with
    /// [`Host::end_reply`]. The tools shown are the format's now.
    pub fn begin_reply(
        &mut self,
        messages: &[Message],
        settings: &TurnSettings,
        on_event: &mut dyn FnMut(HostEvent<'_>),
    ) -> Result<Reply, HostError> {
        let prepared = self.prepare(messages, settings.think)?;
        self.begin_prepared_reply(prepared, messages, settings, on_event)
    }

    /// The prompt for a reply to `messages`, rendered with the tools and
    /// effort the format shows now, and tokenized.
    fn prepare(&self, messages: &[Message], think: bool) -> Result<Prepared, HostError> {
        let prompt = self.format.prompt(messages, think)?;
        prompter::chat_prepared(self.session.model(), prompt, messages, self.config.chat.markers_in_content)
    }

    /// A renderer and tokenizer of this host's prompts for other threads:
    /// a second copy of its chat format, and the model's vocabulary.
    pub fn prompter(&self) -> Result<Prompter, HostError> {
        let format = chat_format(&self.config, &self.model, &self.session)?;
        Ok(Prompter::new(format, self.session.model().clone(), self.config.chat.markers_in_content))
    }

    /// [`Host::begin_reply`] with its prompt `prepared` already (by this
    /// host's [`Prompter`], with the tools and effort shown now).
    pub fn begin_prepared_reply(
        &mut self,
        prepared: Prepared,
        messages: &[Message],
        settings: &TurnSettings,
        on_event: &mut dyn FnMut(HostEvent<'_>),
    ) -> Result<Reply, HostError> {
        let Prepared { prompt, tokens } = prepared;
        if !settings.think && !self.told_no_switch && self.format.think_control() == ThinkControl::None {
            self.told_no_switch = true;
            on_event(HostEvent::Notice(&self.format.no_switch_notice()));
        }
        if !self.told_effort_ignored
            && let Some(notice) = self.format.effort_notice()
        {
            self.told_effort_ignored = true;
            on_event(HostEvent::Notice(&notice));
        }
        let n_ctx = self.slot_ctx();
        let room = (n_ctx as usize).saturating_sub(tokens.len());
        if room < 2 {
            return Err(HostError::ContextFull { needed: tokens.len() + 2, n_ctx });
        }
        let mut constraint = settings.constraint.clone();
        // A reply to the user that must call a tool follows the call grammar.
        let forced_call = messages.last().is_some_and(|m| m.role == "user") && settings.require_call;
        if forced_call {
            if constraint.is_some() {
                return Err(HostError::Setting(
                    "chat.tool_choice = required and a grammar (generate.grammar or json_schema) both constrain the \
                     reply: unset one"
                        .into(),
                ));
            }
            let call = self.format.call_grammar(prompt.reply_opening());
            let call = call.map_err(|e| HostError::Setting(format!("chat.tool_choice = required: {e}")))?;
            constraint = Some(crate::llama::Constraint::Grammar(call));
        }
        Ok(Reply {
            splitter: self.format.splitter(&prompt),
            prompt,
            tokens,
            n_predict: settings.n_predict.min(room as u32),
            budget: settings.n_predict,
            sampling: settings.sampling.clone(),
            constraint,
            forced_call,
            stop: StopScan::new(&settings.stop),
            tools: self.format.tools().cloned(),
            reasoning: String::new(),
            answer: String::new(),
        })
    }

    /// Starts a raw completion of `prompt` (no template, special tokens
    /// read) as a reply: all of it answer text, no tools. `prepared` holds
    /// its tokens already (`None`: tokenized here).
    pub fn begin_completion(
        &mut self,
        prompt: &str,
        prepared: Option<Prepared>,
        settings: &TurnSettings,
    ) -> Result<Reply, HostError> {
        let tokens = match prepared {
            Some(prepared) => prepared.tokens,
            None => self.session.tokenize_rendered(prompt),
        };
        self.completion_reply(prompt, tokens, settings)
    }

    /// A raw completion of a prompt given as token ids (each below the
    /// vocabulary's size, else an error naming it).
    pub fn begin_completion_of_tokens(&mut self, tokens: &[i32], settings: &TurnSettings) -> Result<Reply, HostError> {
        let n_vocab = self.session.n_vocab();
        if let Some(bad) = tokens.iter().find(|&&t| t < 0 || t as usize >= n_vocab) {
            return Err(HostError::Setting(format!("token id {bad} is not in the vocabulary (0 to {})", n_vocab - 1)));
        }
        let model = self.session.model().clone();
        let text: Vec<u8> = tokens.iter().flat_map(|&t| model.token_bytes(t)).collect();
        self.completion_reply(&String::from_utf8_lossy(&text), tokens.to_vec(), settings)
    }

    fn completion_reply(
        &mut self,
        prompt: &str,
        tokens: Vec<i32>,
        settings: &TurnSettings,
    ) -> Result<Reply, HostError> {
        let n_ctx = self.slot_ctx();
        let room = (n_ctx as usize).saturating_sub(tokens.len());
        if room < 2 {
            return Err(HostError::ContextFull { needed: tokens.len() + 2, n_ctx });
        }
        Ok(Reply {
            splitter: crate::chat::Splitter::new(crate::chat::Family::Plain, ""),
            prompt: ChatPrompt::plain(prompt),
            tokens,
            n_predict: settings.n_predict.min(room as u32),
            budget: settings.n_predict,
            sampling: settings.sampling.clone(),
            constraint: settings.constraint.clone(),
            forced_call: false,
            stop: StopScan::new(&settings.stop),
            tools: None,
            reasoning: String::new(),
            answer: String::new(),
        })
    }

    /// Ends `reply` with its `generation` (cut at its stop string): the
    /// reasoning and answer with tool calls parsed out (ids numbered after
    /// the `called_before` calls of the conversation), and how it ended.
    pub fn end_reply(
        &mut self,
        mut reply: Reply,
        generation: &mut Generation,
        called_before: usize,
        on_event: &mut dyn FnMut(HostEvent<'_>),
    ) -> Turn {
        let rest = reply.stop.finish();
        reply.route(&rest, on_event);
        cut_at_stop(generation, &reply.stop);
        let reasoning_open = reply.splitter.kind() == Kind::Reasoning;
        for (kind, piece) in reply.splitter.finish() {
            reply.add(kind, &piece, on_event);
        }
        let format = self.format.tool_format().filter(|_| reply.tools.is_some());
        let found = format.map_or_else(Vec::new, |f| f.parse(&generation.text, reply.tools.as_ref()));
        let call_open = format.is_some_and(|f| f.has_unfinished_call(&generation.text, found.len()));
        let open = if reasoning_open {
            Some(Cut::Reasoning)
        } else if call_open || reply.forced_call {
            Some(Cut::ToolCall)
        } else {
            reply.constraint.as_ref().map(|_| Cut::Constrained)
        };
        let ending = self.ending(generation, found.len(), reply.budget, open);
        let strip = |text: &str| format.map_or_else(|| text.trim().to_string(), |f| f.strip_calls(text, &found));
        let (reasoning, mut answer) = (strip(&reply.reasoning), strip(&reply.answer));
        if reply.prompt.continues && !answer.is_empty() {
            // The rest of a message: the space that joins it to its start stays.
            let lead = &reply.answer[..reply.answer.len() - reply.answer.trim_start().len()];
            answer.insert_str(0, lead);
        }
        let tool_calls: Vec<ToolCall> = found
            .into_iter()
            .enumerate()
            .map(|(i, f)| ToolCall { id: f.call.id.or_else(|| Some(format!("call_{}", called_before + i))), ..f.call })
            .collect();
        for call in &tool_calls {
            on_event(HostEvent::ToolCall(call));
        }
        let prefilled = generation.summary.prompt_tokens;
        let stop_sequence = reply.stop.matched().map(str::to_string);
        Turn { reasoning, answer, tool_calls, generation: std::mem::take(generation), prefilled, ending, stop_sequence }
    }

    /// How `generation` ended (with `calls` complete tool calls, under
    /// `n_predict`, `open` unfinished at its end), kept as the last ending.
    fn ending(&mut self, generation: &Generation, calls: usize, n_predict: u32, open: Option<Cut>) -> Ending {
        let tokens = generation.tokens.len();
        let ending = Ending::new(tokens, generation.stopped_at_eog, generation.aborted, calls, n_predict, open);
        self.last_ending = Some(ending);
        ending
    }

    /// How the last generation (a chat turn or a completion) ended.
    pub fn last_ending(&self) -> Option<Ending> {
        self.last_ending
    }

    /// Plain completion of `prompt` (no template): a fresh context, or with
    /// `continue_context` appended to what the session holds.
    pub fn complete(
        &mut self,
        prompt: &str,
        continue_context: bool,
        on_event: &mut dyn FnMut(HostEvent<'_>),
    ) -> Result<Generation, HostError> {
        let settings = self.turn_settings()?;
        let mut n_predict = settings.n_predict;
        if n_predict == u32::MAX {
            // No budget: the room a fresh context leaves after the prompt
            // (its tokens and a BOS), or after what it holds.
            let held = if continue_context { self.session.context_len() } else { 0 };
            let prompt_len = self.session.tokenize_continuation(prompt).len() + 1;
            n_predict = (self.slot_ctx() as usize).saturating_sub(held + prompt_len).max(1) as u32;
        }
        let mut request = self.request(Prompt::Text(prompt.to_string()), &settings, n_predict);
        request.continue_context = continue_context;
        let generation = self.complete_request(&request, &settings.stop, on_event)?;
        if let Some(ending) = self.last_ending.as_mut().filter(|_| settings.n_predict == u32::MAX) {
            // The room ended it, not a budget.
            if ending.limit.is_some() {
                ending.limit = Some(Limit::Context);
            }
        }
        Ok(generation)
    }

    /// Plain completion of `prompt` (no template, special tokens read)
    /// with `settings`: a server's raw completion (`prepared`: its tokens,
    /// when tokenized already). The session keeps
    /// whatever prefix of the prompt it already holds; the token limit is
    /// capped by the room left in the context.
    pub fn complete_with(
        &mut self,
        prompt: &str,
        prepared: Option<Prepared>,
        settings: &TurnSettings,
        on_event: &mut dyn FnMut(HostEvent<'_>),
    ) -> Result<Generation, HostError> {
        let reply = self.begin_completion(prompt, prepared, settings)?;
        let request = reply.request(Prompt::Tokens(reply.tokens.clone()), self.keep_logits);
        self.complete_request(&request, &settings.stop, on_event)
    }

    /// Runs a completion, its text passed on until a `stop` string.
    fn complete_request(
        &mut self,
        request: &GenerateRequest,
        stops: &[String],
        on_event: &mut dyn FnMut(HostEvent<'_>),
    ) -> Result<Generation, HostError> {
        let mut stop = StopScan::new(stops);
        let abort = self.session.abort_handle();
        let mut generation = self.run(
            request,
            &mut |event, on_event| {
                if let Event::Token { text, .. } = event {
                    let text = stop.push(text);
                    if !text.is_empty() {
                        on_event(HostEvent::Text { kind: Kind::Answer, text: &text });
                    }
                    if stop.hit() {
                        abort.abort();
                    }
                }
            },
            on_event,
        )?;
        let rest = stop.finish();
        if !rest.is_empty() {
            on_event(HostEvent::Text { kind: Kind::Answer, text: &rest });
        }
        cut_at_stop(&mut generation, &stop);
        let open = request.constraint.as_ref().map(|_| Cut::Constrained);
        self.ending(&generation, 0, request.n_predict, open);
        Ok(generation)
    }

    /// Decodes `prompt` for `n` tokens and forgets the text: it fills the
    /// expert cache (and the page cache) and settles the thread count before
    /// a measured run. Nothing reaches the telemetry files or the totals;
    /// the context is cleared afterwards, the expert cache kept.
    pub fn warm_up(&mut self, prompt: &str, n: u32) -> Result<Generation, HostError> {
        let settings = self.turn_settings()?;
        let mut request = self.request(Prompt::Text(prompt.to_string()), &settings, n);
        request.keep_logits = false;
        let generation = self.session.generate(&request, &mut |_| {});
        self.session.reset();
        self.held_text = None;
        Ok(generation?)
    }

    /// The tokens of a rendered prompt: what the session holds plus the new
    /// text when the prompt extends the held text, else `rendered`, the
    /// whole prompt tokenized (the session then keeps the longest common
    /// prefix).
    fn prompt_tokens(&self, prompt: &str, rendered: Vec<i32>) -> Vec<i32> {
        match &self.held_text {
            Some(held) if prompt.starts_with(held.as_str()) => {
                let mut tokens = self.session.held_tokens();
                tokens.extend(self.session.tokenize_continuation(&prompt[held.len()..]));
                tokens
            }
            _ => rendered,
        }
    }

    fn request(&self, prompt: Prompt, settings: &TurnSettings, n_predict: u32) -> GenerateRequest {
        GenerateRequest {
            prompt,
            n_predict,
            sampling: settings.sampling.clone(),
            continue_context: false,
            keep_logits: self.keep_logits,
            constraint: settings.constraint.clone(),
        }
    }

    /// Runs one generation: telemetry, totals and the last step are kept
    /// here; `on_token` turns token events into text events.
    fn run(
        &mut self,
        request: &GenerateRequest,
        on_token: &mut dyn FnMut(&Event<'_>, &mut OnEvent<'_>),
        on_event: &mut OnEvent<'_>,
    ) -> Result<Generation, HostError> {
        // Whatever happens, the held tokens are no longer known to match a text.
        self.held_text = None;
        let (sinks, totals, last_step) = (&mut self.sinks, &mut self.totals, &mut self.last_step);
        let generation = self.session.generate(request, &mut |event| {
            match &event {
                Event::Prefill(r) => {
                    record(sinks, totals, last_step, r);
                    on_event(HostEvent::Prefill(r));
                }
                Event::Step(r) => {
                    record(sinks, totals, last_step, r);
                    on_event(HostEvent::Step(r));
                }
                Event::Notice(text) => on_event(HostEvent::Notice(text)),
                Event::Token { .. } => {}
            }
            on_token(&event, on_event);
            if let Some(e) = sinks.take_error() {
                on_event(HostEvent::Notice(&e));
            }
        });
        let generation = match generation {
            Err(EngineError::ContextFull { needed, n_ctx, .. }) => {
                return Err(HostError::ContextFull { needed, n_ctx });
            }
            other => other?,
        };
        self.totals.load_s = generation.summary.load_s;
        self.totals.streaming = generation.summary.streaming;
        self.totals.cached = generation.summary.cached;
        self.totals.speculative = generation.summary.speculative;
        self.totals.dropping = generation.summary.dropping;
        Ok(generation)
    }

    /// Changes a setting (`section.key`, or a bare key one section has) from
    /// its text form. Live settings apply from the next turn; others open
    /// the model again with the conversation kept. On an error nothing changes.
    pub fn set(&mut self, key: &str, value: &str) -> Result<SetOutcome, HostError> {
        let mut new = self.config.with(key, value);
        let key = RunConfig::resolve_key(key).map_err(HostError::Setting)?;
        // Counts per server of the old server list would refuse a new one.
        let mut kept = (String::new(), None);
        if key == "model.rpc" {
            let servers =
                self.config.with_all(&[(&key, value), ("model.rpc_layers", "")]).map_err(HostError::Setting)?;
            kept = crate::engine::RpcOptions::layers_for(&servers.model.rpc, &self.config.model.rpc_layers);
            new = self.config.with_all(&[(&key, value), ("model.rpc_layers", &kept.0)]);
        }
        let new = new.map_err(HostError::Setting)?;
        let mut applied = apply_of(&key);
        // The io_uring arena is sized at open: a new budget reopens.
        let streaming = self.session.info().streaming;
        if key == "moe.cache_mb"
            && (!budget_change_is_live(streaming, &self.config, &new) || self.session.info().io_uring)
        {
            applied = Apply::Reopen;
        }
        let mut notices = match applied {
            Apply::Reopen => self.reopen(new)?,
            Apply::Live | Apply::ServeStart => self.apply_live(&key, new)?,
        };
        notices.extend(kept.1);
        Ok(SetOutcome { key, applied, notices })
    }

    /// Applies a live setting; on an error the old configuration stays.
    fn apply_live(&mut self, key: &str, new: RunConfig) -> Result<Vec<String>, HostError> {
        let mut notices = Vec::new();
        let section = key.split_once('.').map_or(key, |(s, _)| s);
        match section {
            "plugins" => {
                let attached = plugins::attach(&mut self.session, &new);
                // Put the old plugins back if the new ones are refused.
                notices = attached.map_err(|e| {
                    let _ = plugins::attach(&mut self.session, &self.config);
                    HostError::Setting(e)
                })?;
            }
            "chat" if ["chat.template", "chat.reasoning_effort", "chat.tools"].contains(&key) => {
                self.format = chat_format(&new, &self.model, &self.session)?;
            }
            "chat" if key == "chat.system" => self.conversation.system = system_prompt(&new),
            "telemetry" if key == "telemetry.verbose" => crate::llama::set_verbose(new.telemetry.verbose),
            "telemetry" => {
                let mut sinks = Sinks::open(&new, &self.model, self.session.info()).map_err(HostError::Setting)?;
                std::mem::swap(&mut self.sinks, &mut sinks);
                sinks.finish(&self.totals).map_err(HostError::Setting)?;
                self.session.set_record_weights(wants_route_weights(&new));
            }
            "moe" if key == "moe.cache_mb" => {
                if let budget @ CacheBudget::Fixed { .. } = new.cache_budget() {
                    let evicted = self.session.set_cache_budget(budget)?;
                    if evicted > 0 {
                        notices.push(format!("{evicted} experts evicted to fit the new budget"));
                    }
                }
            }
            _ => {}
        }
        self.config = new;
        Ok(notices)
    }

    /// Opens the model again with `new`; the old session stays in use if
    /// that fails. The conversation is kept: the next turn prefills it.
    fn reopen(&mut self, new: RunConfig) -> Result<Vec<String>, HostError> {
        // Named as every command takes a model: a file, or a hub model.
        let model = if new.model.path.as_os_str().is_empty() {
            self.model.clone()
        } else {
            resolve_model(&new).map_err(|e| HostError::Setting(format!("model.path: {e:#}")))?
        };
        let sequences = self.session.sequences() as u32;
        let (mut session, format, mut notices) = open_session(&new, &model, sequences)?;
        session.continue_turns_from(self.session.next_turn());
        // The same model keeps its telemetry files; another model starts new
        // ones (their headers describe the model) once the old are closed.
        let sinks = if model == self.model {
            std::mem::take(&mut self.sinks)
        } else {
            let sinks = Sinks::open(&new, &model, session.info()).map_err(HostError::Setting)?;
            self.sinks.finish(&self.totals).map_err(HostError::Setting)?;
            sinks
        };
        notices.push(format!("reopened {} (the conversation is prefilled again on the next turn)", model.display()));
        let mut host = Host::assemble(new, &model, session, format, sinks, Vec::new());
        host.conversation = std::mem::take(&mut self.conversation);
        host.totals = std::mem::take(&mut self.totals);
        *self = host;
        Ok(notices)
    }

    /// Closes the telemetry files with the totals of every turn.
    pub fn finish(&mut self) -> Result<(), HostError> {
        self.sinks.finish(&self.totals).map_err(HostError::Setting)
    }
}

/// Writes a decode step to the telemetry files and the totals; a decode
/// step (not a prompt batch) becomes the last step.
fn record(sinks: &mut Sinks, totals: &mut RunSummary, last_step: &mut Option<StepReport>, report: &StepReport) {
    sinks.write(report);
    totals.add(report);
    if report.phase == crate::engine::Phase::Decode {
        *last_step = Some(report.clone());
    }
}

/// A generation a stop string ended: its text cut before the stop string,
/// and counted as ended by the model rather than stopped by the user.
fn cut_at_stop(generation: &mut Generation, stop: &StopScan) {
    if stop.hit() {
        generation.text.truncate(stop.passed());
        generation.aborted = false;
        generation.stopped_at_eog = true;
    }
}

/// Whether a new `moe.cache_mb` can be applied to the live cache: a fixed
/// budget to a fixed one, while `streaming`. `auto`, or turning the cache on
/// or off, changes how experts are held: a reopen.
fn budget_change_is_live(streaming: bool, old: &RunConfig, new: &RunConfig) -> bool {
    let fixed = |c: &RunConfig| matches!(c.cache_budget(), CacheBudget::Fixed { .. });
    streaming && fixed(old) && fixed(new)
}

/// The notice of a model without a chat template (worth showing only
/// where chat turns are run).
pub const NO_TEMPLATE_NOTICE: &str = "the model has no chat template: chat turns use plain User:/Assistant: lines";

/// Opens the session for `config`, attaches its plugins and compiles its
/// chat format; the notices gathered on the way.
fn open_session(
    config: &RunConfig,
    model: &Path,
    sequences: u32,
) -> Result<(Session, ChatFormat, Vec<String>), HostError> {
    crate::llama::set_verbose(config.telemetry.verbose);
    let sequences = sequences.max(1);
    let n_ctx = config.generate.ctx_size.saturating_mul(sequences);
    let stream = crate::fit::choose_streaming(
        config.moe.stream,
        config.stream_needed_by(),
        model,
        n_ctx,
        &crate::moe::budget::MemoryLimits::read(),
    );
    let mut options = config.session_options(model, stream.on);
    options.sequences = sequences;
    options.ctx_size = n_ctx;
    let mut session = Session::open(options)?;
    let mut notices = vec![stream.notice()];
    notices.extend(session.info().notices.iter().cloned());
    notices.extend(plugins::attach(&mut session, config).map_err(HostError::Setting)?);
    let format = chat_format(config, model, &session)?;
    if format.is_fallback() {
        notices.push(NO_TEMPLATE_NOTICE.into());
    }
    Ok((session, format, notices))
}

/// The system prompt a new conversation starts with.
fn system_prompt(config: &RunConfig) -> Option<String> {
    Some(config.chat.system.clone()).filter(|s| !s.is_empty())
}

/// The chat format: `chat.template` if set, else the model's own template,
/// else the plain fallback.
fn chat_format(config: &RunConfig, model: &Path, session: &Session) -> Result<ChatFormat, HostError> {
    let (name, source) = if config.chat.template.as_os_str().is_empty() {
        let files = ModelFiles::open(model).map_err(|e| HostError::Setting(e.to_string()))?;
        let source = files.meta().get_str("tokenizer.chat_template").map(str::to_string);
        (model.display().to_string(), source)
    } else {
        let path = &config.chat.template;
        // A bundled template's name where no such file exists.
        let bundled = path.to_str().filter(|_| !path.exists()).and_then(crate::chat::named_template);
        let source = match bundled {
            Some(source) => source.to_string(),
            None => std::fs::read_to_string(path).map_err(|e| {
                HostError::Setting(format!(
                    "chat.template: reading {}: {e} (bundled templates: {})",
                    path.display(),
                    crate::chat::named_template_list()
                ))
            })?,
        };
        (path.display().to_string(), Some(source))
    };
    let (bos, eos) = session.special_texts();
    let effort = Some(config.chat.reasoning_effort.clone()).filter(|e| !e.is_empty());
    let tools = config.chat.tool_list().map_err(|e| HostError::Setting(format!("chat.tools: {e}")))?;
    let format = ChatFormat::new(&name, source.as_deref(), &bos, &eos)?;
    if tools.is_some() && format.is_fallback() {
        return Err(HostError::Setting(format!(
            "chat.tools: {name} has no chat template, so nothing shows the tools to the model; give one with \
             --chat-template FILE|NAME (bundled: {})",
            crate::chat::named_template_list()
        )));
    }
    Ok(format.with_reasoning_effort(effort).with_tools(tools))
}
