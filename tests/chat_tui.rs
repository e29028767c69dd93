//! `bmoe chat`'s screen fed by real engine events from a tiny model:
//! snapshots of the main screen, the help overlay and the settings popup at
//! 80x24 and 160x48, and the routing panel checked cell by cell against the
//! route trace of the same run.
//!
//! Timings and memory figures vary from run to run, so the reports' clocks
//! and memory readings are pinned before they reach the screen; routing,
//! hits, bytes and text are the engine's own.

mod common;

use std::path::Path;

use bmoe::config::{CacheMb, RunConfig};
use bmoe::host::{Host, HostEvent};
use bmoe::synth::Arch;
use bmoe::telemetry::mem::MemSnapshot;
use bmoe::ui::chat::{
    App, Density, HostInfo, Mark, Overlay, Routed, TurnStats, Update, View, density, render_to_buffer,
};
use common::*;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};

fn config(edit: impl FnOnce(&mut RunConfig)) -> RunConfig {
    let mut c = RunConfig::default();
    c.generate.threads = 1;
    c.generate.n_predict = 10;
    c.moe.stream = bmoe::config::StreamMode::On;
    // Less than the tiny bank, more than one token's working set: hits and reads
    // (router read-ahead would turn nearly every read into a hit).
    c.moe.cache_mb = CacheMb::Mib(0.5);
    c.moe.predict = false;
    edit(&mut c);
    c
}

fn tiny(dir: &Path) -> std::path::PathBuf {
    let template = bmoe::chat::named_template("qwen3").map(str::to_string);
    write_tiny(dir, "tiny.gguf", Arch::Qwen3Moe, |s| s.chat_template = template)
}

/// The same report with its clocks and memory readings fixed.
fn pinned(mut r: bmoe::engine::StepReport) -> bmoe::engine::StepReport {
    r.wall_ns = 10_000_000;
    r.trace.read_ns = 4_000_000;
    r.trace.mgmt_ns = 500_000;
    r.mem = MemSnapshot {
        rss_mib: Some(512.0),
        rss_anon_mib: Some(256.0),
        rss_file_mib: Some(256.0),
        available_mib: Some(8192.0),
    };
    r
}

/// Runs one chat turn on `host` and feeds its events to `app`, as the
/// engine thread would.
fn turn(host: &mut Host, app: &mut App, message: &str) {
    app.on_terminal(Event::Paste(message.to_string()));
    let effect = app.on_terminal(Event::Key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE)));
    assert_eq!(effect.request, Some(bmoe::ui::chat::Request::Chat(message.to_string())));
    app.on_update(Update::TurnStarted);
    let mut updates = Vec::new();
    let t = host.chat(message, &mut |e: HostEvent<'_>| updates.push(Update::from_host(&e))).unwrap();
    for u in updates {
        let u = match u {
            Update::Step(r) => Update::Step(Box::new(pinned(*r))),
            Update::Prefill(r) => Update::Prefill(Box::new(pinned(*r))),
            other => other,
        };
        app.on_update(u);
    }
    let stats = TurnStats { decode_tps: Some(100.0), ..TurnStats::of(&t) };
    app.on_update(Update::TurnDone(Ok(stats)));
}

/// A host and a screen after two turns.
fn chatted(dir: &Path) -> (Host, App) {
    let model = tiny(dir);
    let mut host = Host::open(config(|_| {}), &model).unwrap();
    let mut app = App::new(HostInfo::of(&host), false, true);
    turn(&mut host, &mut app, "How do experts get chosen?");
    turn(&mut host, &mut app, "And then?");
    (host, app)
}

fn text(buf: &Buffer) -> String {
    let mut out = String::new();
    for y in 0..buf.area.height {
        let line: String = (0..buf.area.width).map(|x| buf[(x, y)].symbol()).collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn key(app: &mut App, code: KeyCode) {
    app.on_terminal(Event::Key(KeyEvent::new(code, KeyModifiers::NONE)));
}

#[test]
fn screens_at_two_sizes() {
    let dir = tempdir();
    let _serial = llama_lock();
    let (_host, mut app) = chatted(dir.path());
    for (w, h) in [(80, 24), (160, 48)] {
        insta::assert_snapshot!(format!("main_{w}x{h}"), text(&render_to_buffer(&app, w, h)));
    }
    key(&mut app, KeyCode::Char('?'));
    assert_eq!(app.overlay, Overlay::Help(0));
    for (w, h) in [(80, 24), (160, 48)] {
        insta::assert_snapshot!(format!("help_{w}x{h}"), text(&render_to_buffer(&app, w, h)));
    }
    // The keys that edit the message box are listed too (they are typing, not bindings).
    let help = text(&render_to_buffer(&app, 160, 48));
    for item in ["Ctrl-U", "clear the line", "Home / Ctrl-A", "End / Ctrl-E"] {
        assert!(help.contains(item), "help does not list {item}:\n{help}");
    }
    key(&mut app, KeyCode::Esc);
    assert_eq!(app.overlay, Overlay::None);
    key(&mut app, KeyCode::F(2));
    key(&mut app, KeyCode::Down);
    for (w, h) in [(80, 24), (160, 48)] {
        insta::assert_snapshot!(format!("settings_{w}x{h}"), text(&render_to_buffer(&app, w, h)));
    }
    // Reasoning shown, the heat view, and a monochrome terminal.
    key(&mut app, KeyCode::Esc);
    key(&mut app, KeyCode::F(3));
    assert_eq!(app.routing_view, View::Heat);
    app.colour = false;
    insta::assert_snapshot!("heat_mono_160x48", text(&render_to_buffer(&app, 160, 48)));
}

/// A host and a screen after two turns on a tiny model with `experts`
/// experts a layer, 8 routed a token, and a cache of a few tokens' experts.
fn chatted_wide(dir: &Path, experts: u32) -> (Host, App) {
    let template = bmoe::chat::named_template("qwen3").map(str::to_string);
    let model = write_tiny(dir, "wide.gguf", Arch::Qwen3Moe, |s| {
        s.chat_template = template;
        s.experts = experts;
        s.experts_used = 8;
    });
    let mut host = Host::open(config(|c| c.moe.cache_mb = CacheMb::Mib(4.0)), &model).unwrap();
    let mut app = App::new(HostInfo::of(&host), false, true);
    turn(&mut host, &mut app, "How do experts get chosen?");
    turn(&mut host, &mut app, "And then?");
    (host, app)
}

/// The routing panel's rows on screen: for each, its line, where its cells
/// start, and the cells up to the hit column.
fn panel_rows(app: &App, screen: &str) -> Vec<(usize, usize, String)> {
    let r = &app.routing;
    (0..r.rows())
        .map(|row| {
            let label = format!("│L{:02} ", r.layer(row));
            let (y, line) = screen.lines().enumerate().find(|(_, l)| l.contains(&label)).expect("layer row");
            let x0 = line[..line.find(&label).unwrap()].chars().count() + label.chars().count();
            let cells: String = line.chars().skip(x0).take_while(|&c| c != '%' && c != '│').collect();
            let cells = cells.trim_end().trim_end_matches(|c: char| c.is_ascii_digit()).trim_end().to_string();
            (y, x0, cells)
        })
        .collect()
}

#[test]
fn two_experts_a_cell_still_tell_hit_from_read_without_colour() {
    let dir = tempdir();
    let _serial = llama_lock();
    let (_host, mut app) = chatted_wide(dir.path(), 128);
    for colour in [false, true] {
        app.colour = colour;
        let buf = render_to_buffer(&app, 160, 48);
        let screen = text(&buf);
        if !colour {
            insta::assert_snapshot!("wide_mono_160x48", screen);
        }
        let r = &app.routing;
        let (mut hits, mut reads) = (0, 0);
        for (row, (y, x0, _)) in panel_rows(&app, &screen).into_iter().enumerate() {
            for c in 0..r.n_expert() / 2 {
                let want = Mark::stronger(r.mark(View::Now, row, 2 * c), r.mark(View::Now, row, 2 * c + 1));
                let glyph = buf[((x0 + c) as u16, y as u16)].symbol().chars().next().unwrap();
                assert_eq!(glyph, want.glyph(), "colour {colour}, layer {} cell {c}\n{screen}", r.layer(row));
                hits += usize::from(want == Mark::Hit);
                reads += usize::from(want == Mark::Miss);
            }
        }
        assert!(hits > 0 && reads > 0, "want hits and reads\n{screen}");
        // The legend names each glyph, in both modes.
        assert!(screen.contains("│■ routed, hit  □ routed, read  × dropped"), "{screen}");
        assert!(screen.contains("2 experts/cell: the stronger"), "{screen}");
    }
    let panel = screen_panel_width(&render_to_buffer(&app, 160, 48), &app);
    assert_eq!(density(app.routing.n_expert(), panel), Density::Half);
}

/// The routing panel's inner width on a rendered screen.
fn screen_panel_width(buf: &Buffer, app: &App) -> u16 {
    let screen = text(buf);
    let (_, x0, _) = panel_rows(app, &screen)[0];
    let line = screen.lines().find(|l| l.contains("│L00 ")).unwrap();
    (line.chars().count() - 1 - (x0 - 4)) as u16
}

#[test]
fn f3_views_differ_at_80x24_and_help_shows_their_glyphs() {
    let dir = tempdir();
    let _serial = llama_lock();
    let (_host, mut app) = chatted_wide(dir.path(), 64);
    let mut seen = Vec::new();
    for view in [View::Now, View::Heat, View::Cache] {
        assert_eq!(app.routing_view, view);
        let buf = render_to_buffer(&app, 80, 24);
        assert_eq!(density(app.routing.n_expert(), screen_panel_width(&buf, &app)), Density::Folded);
        let screen = text(&buf);
        insta::assert_snapshot!(format!("wide_{}_80x24", view.name()), screen);
        let rows: Vec<String> = panel_rows(&app, &screen).into_iter().map(|(_, _, cells)| cells).collect();
        assert!(!seen.contains(&rows), "{view:?} looks like another view:\n{screen}");
        seen.push(rows.clone());
        // Help lists every glyph the panel draws.
        app.overlay = Overlay::Help(u16::MAX);
        let help = text(&render_to_buffer(&app, 80, 24));
        if view == View::Heat {
            insta::assert_snapshot!("wide_heat_help_80x24", help);
        }
        let legend = &help[help.find("F3 cycles its views").unwrap_or_else(|| panic!("{help}"))..];
        assert!(legend.contains(&format!("At this width, the {} view:", view.name())), "{help}");
        for glyph in rows.concat().chars().filter(|c| !c.is_whitespace() && !c.is_ascii_digit()) {
            assert!(legend.contains(&format!("{glyph}")), "{glyph} of {view:?} not in help:\n{screen}\n{help}");
        }
        app.overlay = Overlay::None;
        key(&mut app, KeyCode::F(3));
    }
}

#[test]
fn a_setting_changed_in_the_popup_reaches_the_host() {
    let dir = tempdir();
    let _serial = llama_lock();
    let (mut host, mut app) = chatted(dir.path());
    key(&mut app, KeyCode::F(2));
    let row = bmoe::host::SETTINGS.iter().position(|s| s.0 == "generate.n_predict").unwrap();
    for _ in 0..row {
        key(&mut app, KeyCode::Down);
    }
    key(&mut app, KeyCode::Enter);
    app.on_terminal(Event::Key(KeyEvent::new(KeyCode::Char('u'), KeyModifiers::CONTROL)));
    app.on_terminal(Event::Paste("3".into()));
    let effect = app.on_terminal(Event::Key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE)));
    let Some(bmoe::ui::chat::Request::Set(k, v)) = effect.request else { panic!("no request: {effect:?}") };
    assert_eq!((k.as_str(), v.as_str()), ("generate.n_predict", "3"));
    let outcome = host.set(&k, &v).unwrap();
    app.on_update(Update::SetDone(Ok(format!("{} = {v}", outcome.key))));
    app.on_update(Update::Info(Box::new(HostInfo::of(&host))));
    assert_eq!(app.info.setting("generate.n_predict"), "3");
    let screen = text(&render_to_buffer(&app, 160, 48));
    assert!(screen.contains("generate.n_predict = 3"), "{screen}");
    key(&mut app, KeyCode::Esc);
    key(&mut app, KeyCode::Esc);
    turn(&mut host, &mut app, "short");
    assert!(text(&render_to_buffer(&app, 160, 48)).contains("3 tokens ·"));
}

/// Route-trace rows of the last decode token: (layer, expert, hit, dropped).
fn last_token_rows(trace: &str) -> Vec<(u32, u32, bool, bool)> {
    let rows: Vec<Vec<&str>> = trace
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("turn"))
        .map(|l| l.split(',').collect())
        .filter(|f: &Vec<&str>| f[1] == "1")
        .collect();
    let key = |f: &Vec<&str>| (f[0].parse::<u32>().unwrap(), f[2].parse::<u32>().unwrap());
    let last = rows.iter().map(key).max().unwrap();
    rows.iter()
        .filter(|f| key(f) == last)
        .map(|f| (f[3].parse().unwrap(), f[5].parse().unwrap(), f[7] == "1", f[9] == "1"))
        .collect()
}

#[test]
fn routing_panel_cells_match_the_route_trace() {
    let dir = tempdir();
    let model = tiny(dir.path());
    let trace_path = dir.path().join("route.csv");
    let _serial = llama_lock();
    let mut host = Host::open(config(|c| c.telemetry.route_trace = trace_path.clone()), &model).unwrap();
    let mut app = App::new(HostInfo::of(&host), false, true);
    turn(&mut host, &mut app, "Tell me about routing");
    turn(&mut host, &mut app, "More");
    host.finish().unwrap();
    let rows = last_token_rows(&std::fs::read_to_string(&trace_path).unwrap());
    let r = &app.routing;
    assert_eq!(rows.len(), r.rows() * app.info.k as usize);
    assert!(rows.iter().any(|x| x.2) && rows.iter().any(|x| !x.2), "want hits and reads: {rows:?}");

    let buf = render_to_buffer(&app, 160, 48);
    let screen = text(&buf);
    for row in 0..r.rows() {
        let layer = r.layer(row);
        // The panel's row for this layer: "L0n" then one cell per expert.
        let label = format!("L{layer:02} ");
        let (y, line) = screen.lines().enumerate().find(|(_, l)| l.contains(&label)).expect("layer row");
        let x0 = line[..line.find(&label).unwrap()].chars().count() + label.len();
        for e in 0..r.n_expert() {
            let want = rows.iter().find(|x| x.0 == layer && x.1 == e as u32);
            let expect = match want {
                Some((_, _, _, true)) => Routed::Dropped,
                Some((_, _, true, _)) => Routed::Hit,
                Some(_) => Routed::Miss,
                None => Routed::No,
            };
            assert_eq!(r.routed(row, e), expect, "layer {layer} expert {e}");
            let glyph = buf[((x0 + e) as u16, y as u16)].symbol().chars().next().unwrap();
            let mark = r.mark(View::Now, row, e);
            assert_eq!(glyph, mark.glyph(), "layer {layer} expert {e}");
            match expect {
                Routed::Hit => assert_eq!(mark, Mark::Hit),
                Routed::Miss => assert_eq!(mark, Mark::Miss),
                Routed::Dropped => assert_eq!(mark, Mark::Dropped),
                Routed::No => assert!(!matches!(mark, Mark::Hit | Mark::Miss | Mark::Dropped)),
            }
        }
    }
}

#[test]
fn a_tool_call_shows_in_the_transcript() {
    let dir = tempdir();
    let tools = dir.path().join("tools.json");
    std::fs::write(
        &tools,
        r#"[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}}}]"#,
    )
    .unwrap();
    let _serial = llama_lock();
    let model = tiny(dir.path());
    let config = config(|c| {
        c.generate.n_predict = 200;
        c.chat.think = false;
        c.chat.template = "glm-4.7".into();
        c.chat.tools = tools.clone();
        c.chat.tool_choice = "required".into();
    });
    let mut host = Host::open(config, &model).unwrap();
    let mut app = App::new(HostInfo::of(&host), false, true);
    turn(&mut host, &mut app, "Weather?");
    let screen = text(&render_to_buffer(&app, 160, 48));
    // The call streams as text, then shows parsed on a line of its own.
    assert!(screen.contains("<tool_call>get_weather<arg_key>city</arg_key>"), "{screen}");
    let call = screen.lines().find(|l| l.starts_with("│call ")).unwrap_or_else(|| panic!("{screen}"));
    assert!(call.starts_with("│call get_weather({\"city\": \""), "{call}");
}

#[test]
fn mtp_acceptance_shows_live() {
    let dir = tempdir();
    let template = bmoe::chat::named_template("qwen3").map(str::to_string);
    let model = write_tiny(dir.path(), "glm.gguf", Arch::Glm4Moe, |s| s.chat_template = template);
    let _serial = llama_lock();
    bmoe::mtp_head::write_agreeing_head(&model, 0.7, 7, 1).unwrap();
    let config = config(|c| {
        c.generate.n_predict = 40;
        c.chat.think = false;
        c.plugins.mtp = true;
    });
    let mut host = Host::open(config, &model).unwrap();
    let mut app = App::new(HostInfo::of(&host), false, true);
    turn(&mut host, &mut app, "Tell me a story");
    // On a row of its own, whole at 120 columns too; the reply's summary line has it.
    for width in [160, 120] {
        let screen = text(&render_to_buffer(&app, width, 48));
        assert!(screen.contains("draft mtp"), "{screen}");
        // The draft layer after the model's four is labelled as such.
        assert!(screen.contains("│MTP ") && !screen.contains("│L04 "), "{screen}");
        let line = screen.lines().find(|l| l.contains("│draft mtp: ")).unwrap_or_else(|| panic!("{screen}"));
        assert!(line.contains("drafted,") && line.contains("accepted (") && line.contains("%)"), "{line}");
        assert!(!screen.lines().any(|l| l.contains("mem") && l.contains("drafted")), "{screen}");
    }
    let screen = text(&render_to_buffer(&app, 160, 48));
    assert!(screen.contains("% accepted ·"), "the reply's summary: {screen}");
}

#[test]
fn layers_on_an_rpc_server_show_in_the_header() {
    let dir = tempdir();
    let model = tiny(dir.path());
    let server = Server::start(dir.path());
    let config = config(|c| {
        c.generate.n_predict = 8;
        c.model.rpc = server.endpoint.clone();
        c.model.rpc_layers = "1".into();
    });
    let _serial = llama_lock();
    let mut host = Host::open(config, &model).unwrap();
    let mut app = App::new(HostInfo::of(&host), false, true);
    turn(&mut host, &mut app, "Hello");
    let screen = text(&render_to_buffer(&app, 160, 48));
    let n_layer = HostInfo::of(&host).n_layer;
    assert!(screen.contains(&format!("rpc 1 of {n_layer}L")), "{screen}");
}
