//! The engine thread of `bmoe chat`: it owns the session host, takes
//! requests from the UI and queues everything the host reports. The UI
//! never waits on it; a running turn is stopped through the abort handle.
//!
//! Updates are queued without waking the UI: tokens and step reports are
//! collected by the UI at its next frame, so a fast decode costs the UI one
//! wake-up per frame, not one per event (a wake-up is a context switch that
//! can stall the compute threads). Only updates that change what the UI
//! waits for (a turn starting or ending, a setting applied) wake it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use crate::chat::Kind;
use crate::engine::{AbortHandle, StepReport};
use crate::host::{Apply, Host, HostEvent};
use crate::telemetry::summary::RunSummary;

use super::app::{HostInfo, TurnStats};

/// What the UI asks of the engine thread.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// A chat turn with this user message.
    Chat(String),
    /// Change a setting (`section.key`, value in its text form).
    Set(String, String),
    /// Start a new conversation.
    Reset,
}

/// What the engine thread reports.
#[derive(Debug, Clone)]
pub enum Update {
    /// The model and settings in effect (after open, a setting, a reopen).
    Info(Box<HostInfo>),
    /// A turn started.
    TurnStarted,
    /// Generated text.
    Text(Kind, String),
    /// A prompt batch was decoded.
    Prefill(Box<StepReport>),
    /// A generated token was decoded.
    Step(Box<StepReport>),
    /// Something the user should know.
    Notice(String),
    /// The reply called a function (shown as `name(arguments)`).
    ToolCall(String),
    /// A turn ended (stopped turns included); the error text if it failed.
    TurnDone(Result<TurnStats, String>),
    /// A setting was applied (its description) or refused (why).
    SetDone(Result<String, String>),
    /// The conversation was cleared.
    ResetDone,
    /// A repacked copy of the experts is being written (while a setting
    /// reopens the model): bytes written, of the whole.
    CopyProgress(u64, u64),
}

impl Update {
    /// The update for one host event (the UI's copy of it).
    pub fn from_host(event: &HostEvent<'_>) -> Update {
        match event {
            HostEvent::Text { kind, text } => Update::Text(*kind, text.to_string()),
            HostEvent::Prefill(r) => Update::Prefill(Box::new((*r).clone())),
            HostEvent::Step(r) => Update::Step(Box::new((*r).clone())),
            HostEvent::Notice(n) => Update::Notice(n.to_string()),
            HostEvent::ToolCall(call) => Update::ToolCall(call.to_string()),
        }
    }

    /// Whether the UI should wake for it now (else it waits for the next frame).
    fn is_urgent(&self) -> bool {
        !matches!(self, Update::Text(..) | Update::Prefill(_) | Update::Step(_))
    }
}

/// A running engine thread.
pub struct Worker {
    requests: Option<Sender<Request>>,
    abort: AbortHandle,
    /// Raised when the UI quits: requests still queued are dropped.
    closing: Arc<AtomicBool>,
    queue: Arc<Mutex<Vec<Update>>>,
    thread: Option<JoinHandle<(Host, RunSummary)>>,
}

impl Worker {
    /// Moves `host` to its own thread. Updates queue up for
    /// [`Worker::take_updates`]; the urgent ones also send `wake` to `waker`.
    pub fn start<E: Send + 'static>(host: Host, waker: Sender<E>, wake: fn() -> E) -> std::io::Result<Worker> {
        let abort = host.abort_handle();
        let (requests, inbox) = std::sync::mpsc::channel();
        let queue = Arc::new(Mutex::new(Vec::new()));
        let shared = queue.clone();
        let push: Push = Arc::new(move |u: Update| {
            let urgent = u.is_urgent();
            shared.lock().unwrap_or_else(PoisonError::into_inner).push(u);
            if urgent {
                let _ = waker.send(wake());
            }
        });
        let closing = Arc::new(AtomicBool::new(false));
        let stop = closing.clone();
        let thread =
            std::thread::Builder::new().name("bmoe-engine".into()).spawn(move || serve(host, &inbox, &stop, &push))?;
        Ok(Worker { requests: Some(requests), abort, closing, queue, thread: Some(thread) })
    }

    /// The updates queued since the last call, oldest first.
    pub fn take_updates(&self) -> Vec<Update> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Queues a request (ignored once the thread has ended).
    pub fn send(&self, request: Request) {
        if let Some(r) = &self.requests {
            let _ = r.send(request);
        }
    }

    /// Stops the running turn at its next graph node.
    pub fn abort(&self) {
        self.abort.abort();
    }

    /// Stops any turn, ends the thread and returns the host (to close its
    /// telemetry files); None if the thread panicked.
    pub fn finish(mut self) -> Option<(Host, RunSummary)> {
        self.closing.store(true, Ordering::SeqCst);
        self.abort.abort();
        self.requests = None;
        self.thread.take()?.join().ok()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        self.abort.abort();
        self.requests = None;
    }
}

/// Where the engine thread's updates go (the UI's queue).
type Push = Arc<dyn Fn(Update) + Send + Sync>;

/// Tells the screen of a repacked copy written while it lives (a setting
/// that reopens the model): the announcement, then its progress.
struct CopyReport;

impl CopyReport {
    fn install(push: Push) -> CopyReport {
        let mut shown = None;
        crate::moe::repacked::report_progress(Some(Box::new(move |done, total| {
            if shown.is_none() {
                push(Update::Notice(crate::moe::repacked::copy_announcement(total)));
            }
            // One update per percent.
            let percent = done.saturating_mul(100) / total.max(1);
            if shown != Some(percent) {
                shown = Some(percent);
                push(Update::CopyProgress(done, total));
            }
            std::ops::ControlFlow::Continue(())
        })));
        CopyReport
    }
}

impl Drop for CopyReport {
    fn drop(&mut self) {
        crate::moe::repacked::report_progress(None);
    }
}

/// Serves requests until the UI hangs up; returns the host and the totals
/// of the turns run while the thread was alive.
fn serve(mut host: Host, inbox: &Receiver<Request>, closing: &AtomicBool, push: &Push) -> (Host, RunSummary) {
    let out = &mut |u: Update| push(u);
    out(Update::Info(Box::new(HostInfo::of(&host))));
    for notice in host.take_notices() {
        out(Update::Notice(notice));
    }
    let mut chat_totals = RunSummary::default();
    while let Ok(request) = inbox.recv() {
        // A turn queued just before the UI quit would start (and clear the
        // abort flag) after the quit: skip whatever is left.
        if closing.load(Ordering::SeqCst) {
            continue;
        }
        match request {
            Request::Chat(message) => {
                out(Update::TurnStarted);
                let result = host.chat(&message, &mut |event| out(Update::from_host(&event)));
                let done = result.map(|turn| {
                    merge(&mut chat_totals, &turn.generation.summary);
                    TurnStats::of(&turn)
                });
                out(Update::TurnDone(done.map_err(|e| e.to_string())));
            }
            Request::Set(key, value) => {
                let _copy = CopyReport::install(push.clone());
                let done = host.set(&key, &value).map(|o| {
                    let how = match o.applied {
                        Apply::Live => "from the next turn",
                        Apply::Reopen => "model reopened",
                        Apply::ServeStart => "kept for `bmoe serve`, which reads it when it starts",
                    };
                    let mut text = format!("{} = {value} ({how})", o.key);
                    for n in o.notices {
                        text.push_str("; ");
                        text.push_str(&n);
                    }
                    text
                });
                out(Update::SetDone(done.map_err(|e| e.to_string())));
                out(Update::Info(Box::new(HostInfo::of(&host))));
            }
            Request::Reset => {
                host.reset();
                out(Update::ResetDone);
            }
        }
    }
    (host, chat_totals)
}

/// Adds one generation's decode totals to the chat's.
fn merge(into: &mut RunSummary, s: &RunSummary) {
    into.generated += s.generated;
    into.decode_tokens += s.decode_tokens;
    into.decode_ns += s.decode_ns;
    into.decode_steps += s.decode_steps;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// While a setting applies, a copy's progress reaches the screen: its
    /// announcement once, then one update per percent; nothing after.
    #[test]
    fn a_copy_written_while_a_setting_applies_is_told() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        let push: Push = Arc::new(move |u| sink.lock().unwrap().push(u));
        let report = CopyReport::install(push);
        for done in [0, 5, 500, 1000] {
            assert!(crate::moe::repacked::tell(done << 20, 1000 << 20));
        }
        drop(report);
        crate::moe::repacked::tell(1, 2);
        let seen = seen.lock().unwrap();
        let Update::Notice(first) = &seen[0] else { panic!("{:?}", seen[0]) };
        assert!(first.contains("writing a repacked copy of the experts, once: 1000.0 MiB into"), "{first}");
        let progress: Vec<(u64, u64)> = seen[1..]
            .iter()
            .map(|u| match u {
                Update::CopyProgress(d, t) => (d >> 20, t >> 20),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(progress, [(0, 1000), (500, 1000), (1000, 1000)]);
    }
}
