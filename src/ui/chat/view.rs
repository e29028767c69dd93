//! Drawing the chat screen from `&App`: status line, conversation, message
//! box, routing panel, telemetry, key hints, and the help and settings
//! overlays. Nothing here changes state.

use ratatui::Frame;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Position, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

use super::app::{App, Overlay};
use super::keymap::{self, Context, EDITING_KEYS, KEYMAP};
use super::routing::{self, Key};
use super::telemetry::Telemetry;
use crate::host::SETTINGS;

/// Width from which the routing panel and telemetry sit beside the chat.
const WIDE: u16 = 100;
/// Rows of the telemetry box (borders included).
const TELEMETRY_ROWS: u16 = 7;
/// Most rows the message box grows to (borders included).
const INPUT_MAX_ROWS: u16 = 8;

/// Draws the whole screen.
pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let [status, body, hints] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(3), Constraint::Length(1)]).areas(area);
    frame.render_widget(status_line(app, area.width), status);
    frame.render_widget(hint_line(app), hints);

    let right_w = right_width(app, body.width);
    let [left, right] = Layout::horizontal([Constraint::Min(20), Constraint::Length(right_w)]).areas(body);
    let input_rows = input_height(app, left.width);
    if body.width >= WIDE {
        let [chat, input] = Layout::vertical([Constraint::Min(3), Constraint::Length(input_rows)]).areas(left);
        draw_conversation(frame, app, chat);
        draw_input(frame, app, input);
        // The panel takes the rows its layers need (borders and legend
        // included); telemetry sits right under it.
        let panel_rows = panel_height(app, right.width);
        let [panel, tele, _] = Layout::vertical([
            Constraint::Max(panel_rows),
            Constraint::Length(telemetry_rows(app)),
            Constraint::Fill(1),
        ])
        .areas(right);
        draw_routing(frame, app, panel);
        draw_telemetry(frame, app, tele);
    } else {
        let [chat, tele, input] =
            Layout::vertical([Constraint::Min(3), Constraint::Length(1), Constraint::Length(input_rows)]).areas(left);
        draw_conversation(frame, app, chat);
        let line = compact_telemetry(&app.telemetry, app.info.streaming, tele.width);
        frame.render_widget(Paragraph::new(line), tele);
        draw_input(frame, app, input);
        if right.width > 0 {
            let panel_rows = panel_height(app, right.width);
            let [panel, _] = Layout::vertical([Constraint::Max(panel_rows), Constraint::Fill(1)]).areas(right);
            draw_routing(frame, app, panel);
        }
    }

    match &app.overlay {
        Overlay::None => {}
        Overlay::Help(scroll) => draw_help(frame, app, *scroll),
        Overlay::Settings { selected, editing } => draw_settings(frame, app, *selected, editing.as_ref()),
    }
}

/// Rows of a routing panel `width` columns wide: its layers, its legend and
/// its borders.
fn panel_height(app: &App, width: u16) -> u16 {
    app.routing.rows().max(1) as u16 + legend(app, width.saturating_sub(2)).len() as u16 + 2
}

/// Columns of the right column: the routing panel at the densest view that
/// fits in about 45% of the screen, at least the telemetry's width.
fn right_width(app: &App, width: u16) -> u16 {
    let n = app.routing.n_expert() as u16;
    // Row label, hit column and borders around the cells.
    let full = 4 + 6 + 2 + n;
    if width < 60 {
        return 0;
    }
    if width < WIDE {
        // A third of a narrow screen: one cell per expert if they fit, else
        // the panel folds to a mini bar per layer; room for the legend.
        return full.max(26).min(width / 3);
    }
    // Half the screen at most, at least the telemetry's width.
    let share = width / 2;
    let half = full - n + n.div_ceil(2);
    let want = if full <= share { full } else { half.min(share) };
    want.max(44)
}

fn input_height(app: &App, width: u16) -> u16 {
    let rows = app.input.layout(width.saturating_sub(4)).0.len() as u16;
    (rows + 2).clamp(3, INPUT_MAX_ROWS)
}

fn colour(app: &App, c: Color) -> Style {
    if app.colour { Style::default().fg(c) } else { Style::default() }
}

/// The status line: the model, then what is set, as much as fits in
/// `width` (a long model name is shortened, then the least telling parts
/// give way), never cut mid-word at the edge.
fn status_line(app: &App, width: u16) -> Line<'static> {
    let i = &app.info;
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let dim = Style::default().add_modifier(Modifier::DIM);
    let cache = if !i.streaming {
        "cache -".to_string()
    } else if i.cache_mib > 0.0 {
        format!("cache {} / {} MiB", mib(i.cache_mib), mib(i.bank_mib))
    } else {
        "cache off".to_string()
    };
    // (how long it stays as the width shrinks: lower stays longer, text)
    let mut parts = vec![
        (4, format!("{} {}L {}E top-{}", i.arch, i.n_layer, i.n_expert, i.k)),
        (1, format!("stream {}", if i.streaming { "on" } else { "off" })),
        (2, cache),
    ];
    // Layers on RPC servers route there: the panel shows none for them.
    if i.remote_layers > 0 {
        parts.push((3, format!("rpc {} of {}L", i.remote_layers, i.n_layer)));
    }
    parts.push((7, format!("lanes {}", i.lanes)));
    // Plugins in use stay longer than the names of those not in use.
    for (what, name) in [("draft", &i.draft), ("drop", &i.drop)] {
        let rank = if name.is_empty() { 6 } else { 3 };
        parts.push((rank, format!("{what} {}", if name.is_empty() { "-" } else { name })));
    }
    let demo = if app.demo { " (RANDOM weights)" } else { "" };
    let generating = if app.generating { " │ generating" } else { "" };
    let used = |parts: &[(u8, String)], model: &str| {
        " bmoe ".len()
            + model.width()
            + demo.width()
            + generating.width()
            + parts.iter().map(|(_, p)| 3 + p.width()).sum::<usize>()
    };
    // The model's name may be shortened to this many columns before a part gives way.
    let short_model = shortened(&i.model, 24);
    while used(&parts, &short_model) > width as usize {
        let Some(at) = parts.iter().enumerate().max_by_key(|(_, (rank, _))| *rank).map(|(at, _)| at) else { break };
        parts.remove(at);
    }
    let room = (width as usize).saturating_sub(used(&parts, ""));
    let model = shortened(&i.model, room);
    let sep = Span::styled(" │ ", dim);
    let mut spans = vec![Span::styled(" bmoe ", bold.patch(colour(app, Color::LightCyan))), Span::raw(model)];
    if app.demo {
        spans.push(Span::styled(demo, bold.patch(colour(app, Color::LightYellow))));
    }
    for (_, part) in parts {
        spans.push(sep.clone());
        spans.push(Span::raw(part));
    }
    if app.generating {
        spans.push(sep.clone());
        spans.push(Span::styled("generating", colour(app, Color::LightGreen)));
    }
    Line::from(spans)
}

/// `text` in at most `room` columns: whole, or its start and an ellipsis.
fn shortened(text: &str, room: usize) -> String {
    if text.width() <= room {
        return text.to_string();
    }
    let mut out = String::new();
    for c in text.chars() {
        if out.width() + c.width().unwrap_or(0) + 1 > room {
            break;
        }
        out.push(c);
    }
    out + "…"
}

/// A MiB figure with sensible precision.
fn mib(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn hint_line(app: &App) -> Line<'static> {
    let key = Style::default().add_modifier(Modifier::BOLD).patch(colour(app, Color::LightCyan));
    if app.quit_armed {
        return Line::from(vec![Span::styled(" Ctrl-C", key), Span::raw(" again quits; any other key cancels")]);
    }
    let mut spans = vec![Span::raw(" ")];
    for b in keymap::hints(app.context()) {
        spans.push(Span::styled(b.label, key));
        spans.push(Span::raw(format!(" {}  ", b.hint)));
    }
    Line::from(spans)
}

fn draw_conversation(frame: &mut Frame, app: &App, area: Rect) {
    let title = if app.transcript.scroll_back > 0 { " Conversation (scrolled: PgDn) " } else { " Conversation " };
    let block = Block::default().borders(Borders::ALL).title(title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if app.transcript.entries().next().is_none() {
        let mut lines = vec![Line::from("Type a message and press Enter. ? shows every key.")];
        if app.demo {
            lines.push(Line::default());
            lines.push(Line::from(Span::styled(
                "This is the built-in demo model: its weights are RANDOM, so its replies are gibberish by design. \
                 What it shows is real: which experts each layer routes to, what the cache holds, where each \
                 token's time goes. Run `bmoe chat -m MODEL.gguf` for a real model.",
                colour(app, Color::LightYellow),
            )));
        }
        frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: true }), inner);
        return;
    }
    app.transcript.render(inner, frame.buffer_mut());
}

fn draw_input(frame: &mut Frame, app: &App, area: Rect) {
    let title = " Message (Enter sends, Alt-Enter new line) ";
    let block = Block::default().borders(Borders::ALL).title(title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let prompt = Rect { width: 2, ..inner };
    frame.render_widget(Paragraph::new("> "), prompt);
    let text_area = Rect { x: inner.x + 2, width: inner.width.saturating_sub(2), ..inner };
    let (rows, (cx, cy)) = app.input.layout(text_area.width.saturating_sub(1));
    let skip = (cy + 1).saturating_sub(text_area.height) as usize;
    let lines: Vec<Line> = rows.into_iter().skip(skip).map(Line::from).collect();
    frame.render_widget(Paragraph::new(lines), text_area);
    if app.overlay == Overlay::None {
        frame.set_cursor_position(Position { x: text_area.x + cx, y: text_area.y + cy - skip as u16 });
    }
}

fn draw_routing(frame: &mut Frame, app: &App, area: Rect) {
    let r = &app.routing;
    let titles = [
        format!(" Routing · {} · token {} ", app.routing_view.name(), r.tokens()),
        format!(" {} · token {} ", app.routing_view.name(), r.tokens()),
        format!(" token {} ", r.tokens()),
        format!(" t{} ", r.tokens()),
    ];
    let title = fit(&titles, area.width.saturating_sub(2)).to_string();
    let block = Block::default().borders(Borders::ALL).title(title).title_bottom(" F3 view ");
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if !app.info.streaming || r.rows() == 0 {
        let why = if r.rows() == 0 {
            "this model has no expert layers"
        } else {
            "routing is observed while streaming: set moe.stream = true (F2)"
        };
        frame.render_widget(Paragraph::new(why).wrap(Wrap { trim: true }), inner);
        return;
    }
    let legend = legend(app, inner.width);
    let legend_rows = legend.len() as u16;
    let rows_area = Rect { height: inner.height.saturating_sub(legend_rows), ..inner };
    let first = app.routing_scroll.min(r.rows().saturating_sub(rows_area.height as usize));
    routing::render_rows(r, app.routing_view, first, app.colour, app.info.n_layer, rows_area, frame.buffer_mut());
    if first + (rows_area.height as usize) < r.rows() || first > 0 {
        let more = format!(
            "L{:02}-L{:02} of {} (Shift-↑↓)",
            r.layer(first),
            r.layer((first + rows_area.height as usize).min(r.rows()) - 1),
            r.rows()
        );
        let y = area.bottom().saturating_sub(1);
        let x = area.right().saturating_sub(more.chars().count() as u16 + 2);
        frame.buffer_mut().set_string(x, y, more, Style::default().add_modifier(Modifier::DIM));
    }
    let legend_area = Rect { y: rows_area.bottom(), height: legend_rows.min(inner.height), ..inner };
    frame.render_widget(Paragraph::new(legend), legend_area);
}

/// The panel's legend in `width` columns: an entry per glyph it draws (in
/// full when that takes no more lines than a word each), how its cells map
/// to experts, and what the percentage is.
fn legend(app: &App, width: u16) -> Vec<Line<'static>> {
    let density = routing::density(app.routing.n_expert(), width);
    let (keys, layout, _) = routing::legend(app.routing_view, density);
    let words = pack(app, &keys, width, |k| k.word);
    let full = pack(app, &keys, width, |k| k.text);
    let fits = full.len() <= words.len() && full.iter().all(|l| l.width() <= width as usize);
    let mut lines = if fits { full } else { words };
    let hit = ["% = the layer's hit rate", "% = hit rate"];
    let tail: Vec<String> = if layout.is_empty() {
        hit.map(String::from).to_vec()
    } else {
        hit.iter().map(|h| format!("{layout} · {h}")).collect()
    };
    let one = fit(&tail, width);
    if one.chars().count() <= width as usize {
        lines.push(Line::from(one.to_string()));
    } else {
        lines.push(Line::from(layout));
        lines.push(Line::from(hit[1]));
    }
    lines
}

/// A legend entry's glyphs, each in its mark's colour.
fn key_spans(app: &App, key: &Key) -> Vec<Span<'static>> {
    let mut spans: Vec<Span> = key
        .marks
        .iter()
        .map(|m| {
            let style = if app.colour { Style::default().fg(m.colour()) } else { Style::default() };
            Span::styled(m.glyph().to_string(), style)
        })
        .collect();
    if key.count {
        spans.push(Span::raw("N"));
    }
    spans
}

/// Legend entries (glyphs, a space, `text`) two spaces apart, in lines of at
/// most `width` columns.
fn pack(app: &App, keys: &[Key], width: u16, text: fn(&Key) -> &'static str) -> Vec<Line<'static>> {
    let mut lines: Vec<Vec<Span>> = Vec::new();
    let mut used = 0;
    for key in keys {
        let len = key.glyphs().chars().count() + 1 + text(key).chars().count();
        match lines.last_mut() {
            Some(line) if used + 2 + len <= width as usize => {
                line.push(Span::raw("  "));
                used += 2 + len;
            }
            _ => {
                lines.push(Vec::new());
                used = len;
            }
        }
        let line = lines.last_mut().expect("a line was pushed");
        line.extend(key_spans(app, key));
        line.push(Span::raw(format!(" {}", text(key))));
    }
    lines.into_iter().map(Line::from).collect()
}

fn draw_telemetry(frame: &mut Frame, app: &App, area: Rect) {
    let block = Block::default().borders(Borders::ALL).title(" This token ");
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let t = &app.telemetry;
    let dim = Style::default().add_modifier(Modifier::DIM);
    let label = |s: &str| Span::styled(format!("{s:<6}"), dim);
    let mut lines = Vec::new();
    let last = t.last.unwrap_or_default();
    let spark_w = inner.width.saturating_sub(16) as usize;
    lines.push(Line::from(vec![
        label("tok/s"),
        Span::styled(sparkline(&t.history, spark_w), colour(app, Color::LightGreen)),
        Span::raw(format!(" {:>6.1}", last.tok_s)),
    ]));
    lines.push(Line::from(split_bar(
        app,
        inner.width.saturating_sub(6) as usize,
        last.read_ms,
        last.mgmt_ms,
        last.compute_ms,
    )));
    let hit = last.hit_pct.map_or_else(|| "-".into(), |h| format!("{h:.0}%"));
    lines.push(Line::from(vec![
        label("read"),
        Span::raw(format!("{:.1} MiB/token   hit {hit}   evict {}", last.mib_read, last.evictions)),
    ]));
    let (fill, budget) = t.cache_mib();
    let cache = if budget > 0.0 {
        let w = inner.width.saturating_sub(26).max(4) as usize;
        let full = ((fill / budget).clamp(0.0, 1.0) * w as f64).round() as usize;
        vec![
            label("cache"),
            Span::styled("█".repeat(full), colour(app, Color::Blue)),
            Span::styled("░".repeat(w - full), dim),
            Span::raw(format!(" {} / {} MiB", mib(fill), mib(budget))),
        ]
    } else {
        vec![
            label("cache"),
            Span::raw(if app.info.streaming { "off: routed experts read every token" } else { "- (not streaming)" }),
        ]
    };
    lines.push(Line::from(cache));
    lines.push(Line::from(vec![label("mem"), Span::raw(memory(t))]));
    if drafting(app) {
        let draft = match t.acceptance_pct() {
            Some(p) => format!("{}: {} drafted, {} accepted ({p:.0}%)", app.info.draft, t.drafted, t.accepted),
            None => format!("{}: nothing drafted yet this turn", app.info.draft),
        };
        lines.push(Line::from(vec![label("draft"), Span::raw(draft)]));
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

/// Whether a draft policy (MTP or a plugin) runs, so the panel shows its
/// acceptance on a row of its own.
fn drafting(app: &App) -> bool {
    !app.info.draft.is_empty() || app.telemetry.drafted > 0
}

/// The telemetry panel's height: one row more with a draft policy.
fn telemetry_rows(app: &App) -> u16 {
    TELEMETRY_ROWS + u16::from(drafting(app))
}

fn memory(t: &Telemetry) -> String {
    let gib = |m: Option<f64>| match m {
        None => "?".to_string(),
        Some(m) if m < 1024.0 => format!("{m:.0} MiB"),
        Some(m) => format!("{:.1} GiB", m / 1024.0),
    };
    format!("RSS {}   avail {}", gib(t.rss_mib), gib(t.available_mib))
}

/// The read / cache management / compute split of the last token as one bar.
fn split_bar(app: &App, width: usize, read: f64, mgmt: f64, compute: f64) -> Vec<Span<'static>> {
    let dim = Style::default().add_modifier(Modifier::DIM);
    let total = read + mgmt + compute;
    let mut spans = vec![Span::styled(format!("{:<6}", "time"), dim)];
    let legend = format!(" r{} m{} c{} ms", ms(read), ms(mgmt), ms(compute));
    let bar_w = width.saturating_sub(legend.chars().count());
    if total <= 0.0 || bar_w == 0 {
        spans.push(Span::styled("no token yet", dim));
        return spans;
    }
    let cells = |ms: f64| ((ms / total) * bar_w as f64).round() as usize;
    let (r, m) = (cells(read), cells(mgmt));
    let c = bar_w.saturating_sub(r + m);
    spans.push(Span::styled("▒".repeat(r), colour(app, Color::LightYellow)));
    spans.push(Span::styled("▓".repeat(m), colour(app, Color::LightMagenta)));
    spans.push(Span::styled("█".repeat(c), colour(app, Color::LightGreen)));
    spans.push(Span::raw(legend));
    spans
}

/// Milliseconds with one decimal below ten.
fn ms(v: f64) -> String {
    if v < 10.0 { format!("{v:.1}") } else { format!("{v:.0}") }
}

/// The last `width` values as eighth-height blocks, scaled to their maximum.
fn sparkline(values: &std::collections::VecDeque<f64>, width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let shown: Vec<f64> = values.iter().rev().take(width).rev().copied().collect();
    let max = shown.iter().copied().fold(0.0, f64::max);
    let mut s: String =
        shown.iter().map(|&v| if max > 0.0 { BARS[((v / max) * 7.0).round() as usize] } else { BARS[0] }).collect();
    s.extend(std::iter::repeat_n(' ', width - shown.len()));
    s
}

/// One line of telemetry for narrow screens.
/// The first of `candidates` (longest first) that fits in `width` columns,
/// else the last.
fn fit(candidates: &[String], width: u16) -> &str {
    let fits = |c: &&String| c.chars().count() <= width as usize;
    candidates.iter().find(fits).or(candidates.last()).map_or("", String::as_str)
}

/// Joins `parts` with ` · ` after a space, leaving out whole parts from the
/// end until the line fits in `width` columns (the first always stays).
fn fit_parts(parts: &[String], width: u16) -> String {
    let mut line = String::new();
    for (i, part) in parts.iter().enumerate() {
        let next = if i == 0 { format!(" {part}") } else { format!("{line} · {part}") };
        if i > 0 && next.chars().count() > width as usize {
            break;
        }
        line = next;
    }
    line
}

fn compact_telemetry(t: &Telemetry, streaming: bool, width: u16) -> Line<'static> {
    let dim = Style::default().add_modifier(Modifier::DIM);
    let Some(last) = t.last else { return Line::from(Span::styled(format!(" no token yet · {}", memory(t)), dim)) };
    let total = last.read_ms + last.mgmt_ms + last.compute_ms;
    let read_pct = if total > 0.0 { 100.0 * last.read_ms / total } else { 0.0 };
    let mut parts = vec![format!("{:.1} tok/s", last.tok_s)];
    if streaming {
        parts.push(format!("read {read_pct:.0}% of time"));
        parts.push(format!("{:.1} MiB/tok", last.mib_read));
        if let Some(h) = last.hit_pct {
            parts.push(format!("hit {h:.0}%"));
        }
        let (fill, budget) = t.cache_mib();
        if budget > 0.0 {
            parts.push(format!("cache {}/{} MiB", mib(fill), mib(budget)));
        }
    }
    if let Some(p) = t.acceptance_pct() {
        parts.push(format!("draft {p:.0}%"));
    }
    Line::from(Span::styled(fit_parts(&parts, width), dim))
}

/// A centred rectangle of at most `w` x `h` inside `area`.
fn centred(area: Rect, w: u16, h: u16) -> Rect {
    let (w, h) = (w.min(area.width), h.min(area.height));
    Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h }
}

fn draw_help(frame: &mut Frame, app: &App, scroll: u16) {
    let key = Style::default().add_modifier(Modifier::BOLD).patch(colour(app, Color::LightCyan));
    let mut lines = Vec::new();
    let title =
        |text: &str| Line::from(Span::styled(text.to_string(), Style::default().add_modifier(Modifier::UNDERLINED)));
    for ctx in [Context::Global, Context::Chat, Context::Help, Context::Settings, Context::SettingEdit] {
        lines.push(title(ctx.title()));
        for b in KEYMAP.iter().filter(|b| b.context == ctx) {
            lines.push(Line::from(vec![Span::styled(format!("  {:<14}", b.label), key), Span::raw(b.help)]));
        }
    }
    lines.push(title("Editing the message or a setting"));
    for (label, help) in EDITING_KEYS {
        lines.push(Line::from(vec![Span::styled(format!("  {label:<14}"), key), Span::raw(*help)]));
    }
    lines.push(Line::default());
    lines.extend(help_legend(app, frame.area().width));
    let area = centred(frame.area(), 96, lines.len() as u16 + 2);
    frame.render_widget(Clear, area);
    let total = lines.len() as u16;
    let visible = area.height.saturating_sub(2);
    let scroll = scroll.min(total.saturating_sub(visible));
    let mut block = Block::default().borders(Borders::ALL).title(" Help (Esc closes) ");
    if total > visible {
        let shown = format!(" lines {}-{} of {total}: Up/Down scroll ", scroll + 1, scroll + visible);
        block = block.title_bottom(Line::from(shown).right_aligned());
    }
    frame.render_widget(Paragraph::new(lines).block(block).scroll((scroll, 0)), area);
}

/// The routing panel's legend for help, in lines that fit an 80-column
/// screen: the glyphs the panel draws at this screen's width and view.
fn help_legend(app: &App, screen_width: u16) -> Vec<Line<'static>> {
    let mut lines = vec![
        Line::from("Routing panel: one row per expert layer (MTP: the draft layer);"),
        Line::from("F3 cycles its views: now, heat, cache."),
    ];
    let panel = right_width(app, screen_width);
    if panel == 0 {
        lines.push(Line::from("It is hidden on screens under 60 columns."));
        return lines;
    }
    let view = app.routing_view;
    let (keys, _, layout) = routing::legend(view, routing::density(app.routing.n_expert(), panel - 2));
    let one = format!("At this width, the {} view: {layout}.", view.name());
    if one.chars().count() <= 76 {
        lines.push(Line::from(one));
    } else {
        lines.push(Line::from(format!("At this width, the {} view:", view.name())));
        lines.push(Line::from(format!("{layout}.")));
    }
    lines.extend(pack(app, &keys, 76, |k| k.text));
    lines.push(Line::from("% = the layer's hit rate this chat"));
    lines
}

fn draw_settings(frame: &mut Frame, app: &App, selected: usize, editing: Option<&super::input::InputBox>) {
    let area = centred(frame.area(), 100, frame.area().height.saturating_sub(4).max(10));
    frame.render_widget(Clear, area);
    let block = Block::default().borders(Borders::ALL).title(" Settings (Enter edits, Esc closes) ");
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let footer_rows = 4u16;
    let list = Rect { height: inner.height.saturating_sub(footer_rows), ..inner };
    let visible = list.height as usize;
    let first = (selected + 1).saturating_sub(visible);
    let key_w = SETTINGS.iter().map(|(k, _, _)| k.len()).max().unwrap_or(10);
    let mut lines = Vec::new();
    for (i, (key, apply, _)) in SETTINGS.iter().enumerate().skip(first).take(visible) {
        let value = app.info.setting(key);
        let value = if value.is_empty() { "(none)" } else { value };
        let text = format!(" {key:<key_w$}  {value:<28.28}  {}", apply.name());
        let style = if i == selected { Style::default().add_modifier(Modifier::REVERSED) } else { Style::default() };
        lines.push(Line::from(Span::styled(text, style)));
    }
    frame.render_widget(Paragraph::new(lines), list);
    let (key, apply, description) = SETTINGS[selected];
    let how = match apply {
        crate::host::Apply::Live => "applies from the next turn",
        crate::host::Apply::Reopen => "reopens the model (the conversation is kept)",
        crate::host::Apply::ServeStart => "read by `bmoe serve` when it starts; nothing changes here",
    };
    let mut footer = vec![match editing {
        Some(edit) if edit.is_selected() => Line::from(vec![
            Span::raw(" new value: "),
            Span::styled(edit.text().to_string(), Style::default().add_modifier(Modifier::REVERSED)),
            Span::raw("  (type to replace, ← → to edit)"),
        ]),
        Some(edit) => Line::from(format!(" new value: {}", edit.text())),
        None => Line::default(),
    }];
    footer.push(Line::from(vec![
        Span::styled(format!(" {key}: "), Style::default().add_modifier(Modifier::BOLD)),
        Span::raw(format!("{description}; {how}")),
    ]));
    match &app.settings_message {
        Some(Ok(m)) => footer.push(Line::from(Span::styled(format!(" {m}"), colour(app, Color::LightGreen)))),
        Some(Err(e)) => footer.push(Line::from(Span::styled(format!(" {e}"), colour(app, Color::LightRed)))),
        None => {}
    }
    let footer_area = Rect { y: list.bottom(), height: footer_rows.min(inner.height), ..inner };
    frame.render_widget(Paragraph::new(footer).wrap(Wrap { trim: false }), footer_area);
    if let Some(edit) = editing {
        let x = footer_area.x + 12 + edit.layout(u16::MAX).1.0;
        frame.set_cursor_position(Position { x: x.min(footer_area.right().saturating_sub(1)), y: footer_area.y });
    }
}

/// Renders the screen into a buffer of `width` x `height` (tests and text
/// captures for the docs).
pub fn render_to_buffer(app: &App, width: u16, height: u16) -> Buffer {
    let backend = ratatui::backend::TestBackend::new(width, height);
    let mut terminal = ratatui::Terminal::new(backend).expect("a test backend never fails");
    terminal.draw(|f| draw(f, app)).expect("a test backend never fails");
    terminal.backend().buffer().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first row of a rendered screen, as text.
    fn first_row(buf: &Buffer) -> String {
        (0..buf.area.width).map(|x| buf[(x, 0)].symbol().to_string()).collect::<String>().trim_end().to_string()
    }

    #[test]
    fn the_help_legend_is_whole_at_80_columns() {
        let mut app = App::new(super::super::app::HostInfo::default(), false, false);
        app.overlay = Overlay::Help(u16::MAX);
        let buf = render_to_buffer(&app, 80, 24);
        let screen: String = (0..buf.area.height)
            .map(|y| (0..buf.area.width).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>() + "\n")
            .collect();
        for line in [
            "■ routed, hit  □ routed, read  × dropped  · in cache  ░▒▓█ routed lately",
            "% = the layer's hit rate this chat",
        ] {
            assert!(screen.contains(line), "{screen}");
        }
    }

    #[test]
    fn the_status_line_fits_by_dropping_whole_parts() {
        use super::super::app::HostInfo;
        let info = HostInfo {
            model: "Qwen3-30B-A3B-Instruct-2507-UD-Q4_K_XL.gguf".into(),
            arch: "qwen3moe".into(),
            n_layer: 48,
            n_expert: 128,
            k: 8,
            streaming: true,
            cache_mib: 1200.0,
            bank_mib: 16000.0,
            draft: "mtp".into(),
            lanes: 4,
            ..HostInfo::default()
        };
        let mut app = App::new(info, true, false);
        app.generating = true;
        let wide = first_row(&render_to_buffer(&app, 200, 30));
        assert!(
            wide.contains("lanes 4") && wide.contains("drop -") && wide.contains("Qwen3-30B-A3B-Instruct"),
            "{wide}"
        );
        for width in [80u16, 60] {
            let row = first_row(&render_to_buffer(&app, width, 30));
            // What matters most is whole: the run's state and the plugin in use.
            assert!(row.ends_with("generating") && row.contains("(RANDOM weights)"), "{width}: {row}");
            assert!(row.width() <= width as usize, "{width}: {row}");
        }
        // At 80 columns the name is shortened and the least telling parts give way.
        let row = first_row(&render_to_buffer(&app, 80, 30));
        assert!(row.contains("Qwen3-30B-A3B-Instruct-") && row.contains('…'), "{row}");
        assert!(row.contains("stream on") && !row.contains("lanes"), "{row}");
    }

    #[test]
    fn lines_and_titles_fit_in_whole_parts() {
        let parts: Vec<String> = ["12.3 tok/s", "read 40% of time", "hit 96%"].map(String::from).to_vec();
        assert_eq!(fit_parts(&parts, 80), " 12.3 tok/s · read 40% of time · hit 96%");
        assert_eq!(fit_parts(&parts, 38), " 12.3 tok/s · read 40% of time");
        // The first part stays even when nothing fits.
        assert_eq!(fit_parts(&parts, 4), " 12.3 tok/s");
        let titles: Vec<String> = [" Routing · now · token 127 ", " token 127 ", " t127 "].map(String::from).to_vec();
        assert_eq!(fit(&titles, 27), " Routing · now · token 127 ");
        assert_eq!(fit(&titles, 24), " token 127 ");
        assert_eq!(fit(&titles, 3), " t127 ");
    }
}
