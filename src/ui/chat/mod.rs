//! `bmoe chat`: a full-screen chat (ratatui + crossterm) with a live panel
//! of per-layer expert routing, cache residency and the time split of each
//! token.
//!
//! Three threads: the engine thread owns the session host (`worker`), an
//! input thread reads the terminal, and the UI thread runs one loop over
//! one event type. It waits for the first event (or, while a turn runs,
//! for the next frame), takes every event and engine update already queued,
//! and draws only when something visible changed and a frame interval has
//! passed: a burst of tokens costs one draw, and the UI never holds up
//! decoding.

mod app;
mod input;
mod keymap;
mod routing;
mod telemetry;
mod terminal;
mod transcript;
mod view;
mod worker;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use ratatui::crossterm::event::{self, Event as TermEvent};

pub use app::{App, Effect, HostInfo, Overlay, TurnStats};
pub use keymap::{Action, Binding, Context, KEYMAP};
pub use routing::{Density, Mark, Routed, Routing, View, density};
pub use telemetry::Telemetry;
pub use transcript::{Entry, Transcript};
pub use view::{draw, render_to_buffer};
pub use worker::{Request, Update, Worker};

use crate::host::Host;

/// The shortest time between two draws (about 30 frames a second).
const FRAME: Duration = Duration::from_millis(33);

/// One event type for the UI loop.
enum LoopEvent {
    /// A key, paste, mouse or resize event.
    Terminal(TermEvent),
    /// The engine thread queued an update the UI should see now.
    EngineWake,
    /// Reading the terminal failed.
    InputError(String),
}

/// What the chat did, printed after the terminal is restored.
#[derive(Debug, Default)]
struct Usage {
    turns: u64,
    /// UI thread CPU time and wall time while a turn was running.
    ui_cpu: Duration,
    generating: Duration,
    since: Option<(Instant, Duration)>,
}

impl Usage {
    fn turn_started(&mut self) {
        self.since = Some((Instant::now(), thread_cpu()));
    }

    fn turn_done(&mut self) {
        if let Some((wall, cpu)) = self.since.take() {
            self.turns += 1;
            self.generating += wall.elapsed();
            self.ui_cpu += thread_cpu().saturating_sub(cpu);
        }
    }
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Runs the chat screen on `host` until the user quits. `demo` says the
/// model has random weights.
pub fn run(host: Host, demo: bool) -> Result<()> {
    let colour = std::env::var_os("NO_COLOR").is_none();
    let mut app = App::new(HostInfo::of(&host), demo, colour);
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = Worker::start(host, tx.clone(), || LoopEvent::EngineWake).context("starting the engine thread")?;
    let mut guard = terminal::TerminalGuard::enter().context("setting up the terminal")?;
    let stop_input = Arc::new(AtomicBool::new(false));
    let input = spawn_input(tx, stop_input.clone())?;
    let mut usage = Usage::default();
    let result = event_loop(&mut guard, &mut app, &rx, &worker, &mut usage);
    drop(guard);
    stop_input.store(true, Ordering::Relaxed);
    let _ = input.join();

    let finished = worker.finish();
    usage.turn_done();
    let (mut host, totals) = finished.context("the engine thread stopped unexpectedly")?;
    let closed = host.finish();
    if usage.turns > 0 {
        let tps = totals.decode_tps().map_or_else(|| "n/a".into(), |t| format!("{t:.2}"));
        let share = 100.0 * usage.ui_cpu.as_secs_f64() / usage.generating.as_secs_f64().max(1e-9);
        let plural = if usage.turns == 1 { "" } else { "s" };
        eprintln!(
            "bmoe chat: {} turn{plural}, {} tokens, decode {tps} tok/s; the UI thread used {share:.1}% of one core \
             while generating ({:.1} s)",
            usage.turns,
            totals.generated,
            usage.generating.as_secs_f64()
        );
    }
    result?;
    closed?;
    Ok(())
}

/// Reads terminal events on its own thread until `stop` is raised or the
/// UI is gone.
fn spawn_input(tx: Sender<LoopEvent>, stop: Arc<AtomicBool>) -> Result<std::thread::JoinHandle<()>> {
    let read = move || {
        while !stop.load(Ordering::Relaxed) {
            let event = match event::poll(Duration::from_millis(100)) {
                Ok(false) => continue,
                Ok(true) => event::read().map(LoopEvent::Terminal),
                Err(e) => Err(e),
            };
            let event = event.unwrap_or_else(|e| LoopEvent::InputError(e.to_string()));
            let failed = matches!(event, LoopEvent::InputError(_));
            if tx.send(event).is_err() || failed {
                return;
            }
        }
    };
    std::thread::Builder::new().name("bmoe-input".into()).spawn(read).context("starting the input thread")
}

/// The UI loop: wait, take everything queued, draw when due.
fn event_loop(
    guard: &mut terminal::TerminalGuard,
    app: &mut App,
    rx: &Receiver<LoopEvent>,
    worker: &Worker,
    usage: &mut Usage,
) -> Result<()> {
    let mut dirty = true;
    let mut last_draw: Option<Instant> = None;
    let panic_for_test = std::env::var_os("BMOE_CHAT_TEST_PANIC").is_some();
    loop {
        if dirty && last_draw.is_none_or(|t| t.elapsed() >= FRAME) {
            guard.terminal.draw(|f| view::draw(f, app)).context("drawing")?;
            last_draw = Some(Instant::now());
            dirty = false;
            // A test hook: a panic after the first frame must leave the terminal usable.
            if panic_for_test {
                panic!("BMOE_CHAT_TEST_PANIC is set");
            }
        }
        // While a turn runs the UI collects the engine's updates once a frame.
        let first = if dirty || app.generating {
            let wait = FRAME.saturating_sub(last_draw.map_or(FRAME, |t| t.elapsed())).max(Duration::from_millis(1));
            match rx.recv_timeout(wait) {
                Ok(e) => Some(e),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
        } else {
            match rx.recv() {
                Ok(e) => Some(e),
                Err(_) => return Ok(()),
            }
        };
        let mut effects = Vec::new();
        for event in first.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match event {
                LoopEvent::Terminal(e) => effects.push(app.on_terminal(e)),
                LoopEvent::EngineWake => {}
                LoopEvent::InputError(e) => anyhow::bail!("reading the terminal: {e}"),
            }
        }
        for update in worker.take_updates() {
            match &update {
                Update::TurnStarted => usage.turn_started(),
                Update::TurnDone(_) => usage.turn_done(),
                _ => {}
            }
            effects.push(app.on_update(update));
        }
        for effect in effects {
            if effect.abort {
                worker.abort();
            }
            if let Some(request) = effect.request {
                worker.send(request);
            }
            dirty |= effect.redraw;
        }
        if app.should_quit {
            return Ok(());
        }
    }
}
