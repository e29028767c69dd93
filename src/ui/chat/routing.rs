//! The routing panel: a layers x experts matrix built from step reports as
//! they arrive (routed now, hit or read, dropped; what the cache holds;
//! recent routing frequency; per-layer hit rate), its rendering in three
//! densities (one cell per expert, two experts per cell, or one mini bar per
//! layer), and its legend. Every meaning has a glyph of its own at every
//! density; colour only repeats it.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};

use crate::engine::{Phase, StepReport};

/// How much of a cell's routing frequency survives each decoded token:
/// the heat is a moving count over roughly the last ten tokens.
const DECAY: f32 = 0.9;

/// What the panel shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum View {
    /// The current token's routing over what the cache holds.
    #[default]
    Now,
    /// Routing frequency over the last tokens.
    Heat,
    /// What the cache holds.
    Cache,
}

impl View {
    /// The next view (F3 cycles).
    pub fn next(self) -> View {
        match self {
            View::Now => View::Heat,
            View::Heat => View::Cache,
            View::Cache => View::Now,
        }
    }

    /// Its name in the panel title.
    pub fn name(self) -> &'static str {
        match self {
            View::Now => "now",
            View::Heat => "heat",
            View::Cache => "cache",
        }
    }
}

/// The current token's use of one expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Routed {
    /// Not routed.
    #[default]
    No,
    /// Routed and found in the cache.
    Hit,
    /// Routed and read from storage.
    Miss,
    /// Routed, then skipped by the drop policy.
    Dropped,
}

/// What one cell shows, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Routed now, cache hit.
    Hit,
    /// Routed now, read from storage.
    Miss,
    /// Routed now, dropped.
    Dropped,
    /// Held by the cache.
    Resident,
    /// Routed often lately (1 = a little .. 4 = every token).
    Heat(u8),
    /// Nothing to show.
    Empty,
}

impl Mark {
    /// The glyph of this mark in one-cell-per-expert mode.
    pub fn glyph(self) -> char {
        match self {
            Mark::Hit => '■',
            Mark::Miss => '□',
            Mark::Dropped => '×',
            Mark::Resident => '·',
            Mark::Heat(1) => '░',
            Mark::Heat(2) => '▒',
            Mark::Heat(3) => '▓',
            Mark::Heat(_) => '█',
            Mark::Empty => ' ',
        }
    }

    /// Its colour.
    pub fn colour(self) -> Color {
        match self {
            Mark::Hit => Color::LightCyan,
            Mark::Miss => Color::LightYellow,
            Mark::Dropped => Color::LightMagenta,
            Mark::Resident => Color::Blue,
            Mark::Heat(1) => Color::Indexed(238),
            Mark::Heat(2) => Color::Indexed(242),
            Mark::Heat(3) => Color::Indexed(247),
            Mark::Heat(_) => Color::Indexed(252),
            Mark::Empty => Color::Reset,
        }
    }

    /// Which of two marks sharing a cell shows (lower first): a read (what
    /// costs), a hit, a drop, what the cache holds, the hotter heat.
    fn rank(self) -> u8 {
        match self {
            Mark::Miss => 0,
            Mark::Hit => 1,
            Mark::Dropped => 2,
            Mark::Resident => 3,
            Mark::Heat(level) => 8 - level.clamp(1, 4),
            Mark::Empty => 8,
        }
    }

    /// What a cell shared by `a` and `b` shows: the stronger of the two.
    pub fn stronger(a: Mark, b: Mark) -> Mark {
        if b.rank() < a.rank() { b } else { a }
    }
}

/// The routing matrix, fed by step reports.
#[derive(Debug, Clone, Default)]
pub struct Routing {
    n_expert: usize,
    /// Layer ids with experts, one panel row each.
    layers: Vec<u32>,
    /// Panel row of each layer id.
    row_of: Vec<Option<usize>>,
    now: Vec<Routed>,
    heat: Vec<f32>,
    resident: Vec<bool>,
    hits: Vec<u64>,
    lookups: Vec<u64>,
    /// Decoded tokens seen.
    tokens: u64,
    /// Whether the cache is on (hits mean something).
    cached: bool,
}

impl Routing {
    /// An empty matrix for `layers` (ids of the layers with experts) of
    /// `n_expert` experts each.
    pub fn new(layers: Vec<u32>, n_expert: usize, cached: bool) -> Routing {
        let cells = layers.len() * n_expert;
        let mut row_of = vec![None; layers.iter().max().map_or(0, |&l| l as usize + 1)];
        for (row, &l) in layers.iter().enumerate() {
            row_of[l as usize] = Some(row);
        }
        Routing {
            n_expert,
            row_of,
            now: vec![Routed::No; cells],
            heat: vec![0.0; cells],
            resident: vec![false; cells],
            hits: vec![0; layers.len()],
            lookups: vec![0; layers.len()],
            layers,
            tokens: 0,
            cached,
        }
    }

    /// Panel rows (layers with experts).
    pub fn rows(&self) -> usize {
        self.layers.len()
    }

    /// Experts per layer.
    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    /// Decoded tokens seen.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Layer id of panel row `row`.
    pub fn layer(&self, row: usize) -> u32 {
        self.layers[row]
    }

    /// How the current token used expert `e` of panel row `row`.
    pub fn routed(&self, row: usize, e: usize) -> Routed {
        self.now[row * self.n_expert + e]
    }

    /// Whether the cache holds expert `e` of panel row `row`.
    pub fn is_resident(&self, row: usize, e: usize) -> bool {
        self.resident[row * self.n_expert + e]
    }

    /// Hit rate of panel row `row` over the decoded tokens, percent (None
    /// with the cache off or before any lookup).
    pub fn hit_pct(&self, row: usize) -> Option<f64> {
        (self.cached && self.lookups[row] > 0).then(|| 100.0 * self.hits[row] as f64 / self.lookups[row] as f64)
    }

    /// Takes in one decode call: a decode step moves the current token and
    /// the heat; every call updates what the cache holds.
    pub fn observe(&mut self, report: &StepReport) {
        self.update_residency(&report.residency);
        if report.phase != Phase::Decode || report.trace.rows.is_empty() {
            return;
        }
        self.tokens += u64::from(report.tokens);
        for _ in 0..report.tokens {
            self.heat.iter_mut().for_each(|h| *h *= DECAY);
        }
        self.now.fill(Routed::No);
        let last = report.trace.rows.iter().map(|r| r.token).max().unwrap_or(0);
        // Distinct (layer, expert) per call: the lookups the cache counts.
        let mut looked = std::collections::HashSet::new();
        for r in &report.trace.rows {
            let Some(cell) = self.cell(r.layer, r.expert) else { continue };
            let row = cell / self.n_expert;
            if r.token == last {
                self.now[cell] = match (r.dropped, r.hit) {
                    (true, _) => Routed::Dropped,
                    (false, true) => Routed::Hit,
                    (false, false) => Routed::Miss,
                };
            }
            if r.dropped {
                continue;
            }
            self.heat[cell] += 1.0;
            if looked.insert(cell) {
                self.lookups[row] += 1;
                self.hits[row] += u64::from(r.hit);
            }
        }
    }

    fn update_residency(&mut self, residency: &[bool]) {
        if residency.is_empty() {
            return;
        }
        for (row, &layer) in self.layers.iter().enumerate() {
            let base = layer as usize * self.n_expert;
            if let Some(src) = residency.get(base..base + self.n_expert) {
                self.resident[row * self.n_expert..(row + 1) * self.n_expert].copy_from_slice(src);
            }
        }
    }

    fn cell(&self, layer: u32, expert: u32) -> Option<usize> {
        let row = (*self.row_of.get(layer as usize)?)?;
        ((expert as usize) < self.n_expert).then(|| row * self.n_expert + expert as usize)
    }

    /// What cell (row, e) shows in `view`.
    pub fn mark(&self, view: View, row: usize, e: usize) -> Mark {
        let i = row * self.n_expert + e;
        let heat = || {
            // The heat of an expert routed every token tends to 1 / (1 - DECAY).
            let level = (self.heat[i] * (1.0 - DECAY) * 4.0).ceil() as u8;
            if self.heat[i] < 0.05 { Mark::Empty } else { Mark::Heat(level.clamp(1, 4)) }
        };
        match view {
            View::Now => match self.now[i] {
                Routed::Hit => Mark::Hit,
                Routed::Miss => Mark::Miss,
                Routed::Dropped => Mark::Dropped,
                Routed::No if self.resident[i] => Mark::Resident,
                Routed::No => heat(),
            },
            View::Heat => heat(),
            View::Cache if self.resident[i] => Mark::Resident,
            View::Cache if self.now[i] == Routed::Miss => Mark::Miss,
            View::Cache => Mark::Empty,
        }
    }

    /// Counts of the current token's routed slots in row `row`: hits,
    /// reads, drops.
    pub fn now_counts(&self, row: usize) -> (usize, usize, usize) {
        let cells = &self.now[row * self.n_expert..(row + 1) * self.n_expert];
        let count = |want| cells.iter().filter(|&&r| r == want).count();
        (count(Routed::Hit), count(Routed::Miss), count(Routed::Dropped))
    }

    /// Heat levels (0 = none) of the `n` hottest experts of row `row`,
    /// hottest first.
    pub fn hottest(&self, row: usize, n: usize) -> Vec<u8> {
        let mut levels: Vec<u8> = (0..self.n_expert)
            .map(|e| match self.mark(View::Heat, row, e) {
                Mark::Heat(level) => level,
                _ => 0,
            })
            .collect();
        levels.sort_unstable_by(|a, b| b.cmp(a));
        levels.truncate(n);
        levels
    }

    /// Experts of row `row` the cache holds.
    pub fn resident_count(&self, row: usize) -> usize {
        self.resident[row * self.n_expert..(row + 1) * self.n_expert].iter().filter(|&&r| r).count()
    }
}

/// How many experts one terminal cell holds at this panel width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Density {
    /// One cell per expert.
    Full,
    /// Two experts per cell (upper and lower half block).
    Half,
    /// One mini bar of the routed slots per layer.
    Folded,
}

/// Columns taken by the row label ("L00 ") and the hit column (" 100%").
const LABEL: u16 = 4;
const HIT_COL: u16 = 5;

/// The density that fits `n_expert` experts in `width` columns.
pub fn density(n_expert: usize, width: u16) -> Density {
    let room = width.saturating_sub(LABEL + HIT_COL) as usize;
    if n_expert <= room {
        Density::Full
    } else if n_expert.div_ceil(2) <= room {
        Density::Half
    } else {
        Density::Folded
    }
}

/// Draws the matrix rows into `area` from panel row `first`; layers from
/// `trunk` on (the MTP draft layers after the model's own) are labelled `MTP`.
pub fn render_rows(
    routing: &Routing,
    view: View,
    first: usize,
    colour: bool,
    trunk: u32,
    area: Rect,
    buf: &mut Buffer,
) {
    let density = density(routing.n_expert, area.width);
    for (y, row) in (first..routing.rows()).take(area.height as usize).enumerate() {
        let y = area.y + y as u16;
        let layer = routing.layer(row);
        let label = if trunk > 0 && layer >= trunk { "MTP".to_string() } else { format!("L{layer:02}") };
        buf.set_stringn(area.x, y, &label, LABEL as usize, Style::default().add_modifier(Modifier::DIM));
        let x0 = area.x + LABEL;
        let width = match density {
            Density::Full => render_cells(routing, view, row, 1, colour, (x0, y), buf),
            Density::Half => render_cells(routing, view, row, 2, colour, (x0, y), buf),
            Density::Folded => render_folded(routing, view, row, colour, x0, y, buf),
        };
        let hit = routing.hit_pct(row).map_or_else(|| "   -".to_string(), |p| format!("{p:>4.0}%"));
        let hit_x = (x0 + width + 1).min(area.right().saturating_sub(HIT_COL));
        buf.set_stringn(hit_x, y, &hit, HIT_COL as usize, Style::default());
    }
}

fn style_of(mark: Mark, colour: bool) -> Style {
    let style = Style::default();
    match (colour, mark) {
        (true, _) => style.fg(mark.colour()),
        (false, Mark::Hit | Mark::Miss) => style.add_modifier(Modifier::BOLD),
        (false, _) => style,
    }
}

/// `per` experts a cell from `(x0, y)` on, each cell the stronger of its
/// experts' marks.
fn render_cells(
    routing: &Routing,
    view: View,
    row: usize,
    per: usize,
    colour: bool,
    at: (u16, u16),
    buf: &mut Buffer,
) -> u16 {
    let (x0, y) = at;
    let cols = routing.n_expert.div_ceil(per);
    for c in 0..cols {
        let experts = c * per..((c + 1) * per).min(routing.n_expert);
        let mark = experts.map(|e| routing.mark(view, row, e)).fold(Mark::Empty, Mark::stronger);
        buf[(x0 + c as u16, y)].set_char(mark.glyph()).set_style(style_of(mark, colour));
    }
    cols as u16
}

/// One mini bar per layer: the current token's routed slots (hits, then
/// reads, then drops), the heat of as many of the layer's hottest experts,
/// or how many experts the cache holds and how many were read now.
fn render_folded(routing: &Routing, view: View, row: usize, colour: bool, x0: u16, y: u16, buf: &mut Buffer) -> u16 {
    let (hits, misses, drops) = routing.now_counts(row);
    let marks: Vec<Mark> = match view {
        View::Now => std::iter::repeat_n(Mark::Hit, hits)
            .chain(std::iter::repeat_n(Mark::Miss, misses))
            .chain(std::iter::repeat_n(Mark::Dropped, drops))
            .collect(),
        View::Heat => routing
            .hottest(row, hits + misses + drops)
            .into_iter()
            .map(|level| if level == 0 { Mark::Empty } else { Mark::Heat(level) })
            .collect(),
        View::Cache => {
            let digits = routing.n_expert.to_string().len();
            let cached = format!("·{:<digits$}", routing.resident_count(row));
            buf.set_string(x0, y, &cached, style_of(Mark::Resident, colour));
            let read = format!("□{:<digits$}", misses);
            let x = x0 + cached.chars().count() as u16 + 1;
            buf.set_string(x, y, &read, style_of(Mark::Miss, colour));
            return x + read.chars().count() as u16 - x0;
        }
    };
    for (x, mark) in marks.iter().enumerate() {
        buf[(x0 + x as u16, y)].set_char(mark.glyph()).set_style(style_of(*mark, colour));
    }
    marks.len() as u16
}

/// One legend entry: the glyphs (one per mark, then `N` for a count) and
/// what they mean, in a word and in a few.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// The marks whose glyphs and colours the entry shows.
    pub marks: &'static [Mark],
    /// The glyphs stand before a number.
    pub count: bool,
    /// Its meaning in one word, for narrow panels.
    pub word: &'static str,
    /// Its meaning.
    pub text: &'static str,
}

impl Key {
    /// The glyphs as drawn in the panel.
    pub fn glyphs(&self) -> String {
        let glyphs: String = self.marks.iter().map(|m| m.glyph()).collect();
        if self.count { glyphs + "N" } else { glyphs }
    }
}

const HEAT: &[Mark] = &[Mark::Heat(1), Mark::Heat(2), Mark::Heat(3), Mark::Heat(4)];

/// The legend of `view` at `density`: an entry for every glyph the panel
/// can draw there, and how cells map to experts (short, for the panel, and
/// in full, for help).
pub fn legend(view: View, density: Density) -> (Vec<Key>, &'static str, &'static str) {
    let key = |marks, word, text| Key { marks, count: false, word, text };
    let hit = key(&[Mark::Hit], "hit", "routed, hit");
    let read = key(&[Mark::Miss], "read", "routed, read");
    let dropped = key(&[Mark::Dropped], "dropped", "dropped");
    let cached = key(&[Mark::Resident], "cached", "in cache");
    let keys = match (density, view) {
        (Density::Folded, View::Now) => vec![hit, read, dropped],
        (Density::Folded, View::Heat) => vec![key(HEAT, "hottest", "the layer's hottest experts")],
        (Density::Folded, View::Cache) => vec![
            Key { count: true, ..key(&[Mark::Resident], "cached", "experts in cache") },
            Key { count: true, ..key(&[Mark::Miss], "read", "read now") },
        ],
        (_, View::Now) => vec![hit, read, dropped, cached, key(HEAT, "lately", "routed lately")],
        (_, View::Heat) => vec![key(HEAT, "often", "routed often lately (last ~10 tokens)")],
        (_, View::Cache) => vec![cached, key(&[Mark::Miss], "read", "read now")],
    };
    let (short, long) = match (density, view) {
        (Density::Full, _) => ("", "one cell per expert"),
        (Density::Half, _) => (
            "2 experts/cell: the stronger",
            "two experts per cell, showing the stronger (read, hit, dropped, cached, heat)",
        ),
        (Density::Folded, View::Now) => ("slots routed now", "one bar per layer: a slot per expert routed now"),
        (Density::Folded, View::Heat) => {
            ("as many as routed now", "one bar per layer: as many of its hottest experts as it routes a token")
        }
        (Density::Folded, View::Cache) => ("counts per layer", "one line per layer: how many experts"),
    };
    (keys, short, long)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::StepReport;
    use crate::moe::{RouteRow, StepTrace};
    use crate::telemetry::mem::MemSnapshot;

    fn report(phase: Phase, rows: &[(u32, u32, u32, bool, bool)], residency: Vec<bool>) -> StepReport {
        let rows = rows
            .iter()
            .enumerate()
            .map(|(slot, &(token, layer, expert, hit, dropped))| RouteRow {
                token,
                layer,
                slot: slot as u32 % 2,
                expert,
                weight: 0.5,
                hit,
                bytes: 0,
                dropped,
            })
            .collect();
        StepReport {
            turn: 0,
            phase,
            step: 1,
            first_pos: 0,
            tokens: 1,
            wall_ns: 1,
            trace: StepTrace { rows, ..StepTrace::default() },
            mem: MemSnapshot::default(),
            cache_budget: 0,
            cache_resident: 0,
            residency,
            drafted: 0,
            accepted: 0,
            threads: 1,
            read_ahead: false,
            remote_ns: 0,
        }
    }

    #[test]
    fn a_decode_step_lights_the_last_tokens_experts() {
        // Layers 1 and 3 have experts (a dense layer 0, as gemma-4 has), 4 experts each.
        let mut r = Routing::new(vec![1, 3], 4, true);
        let mut residency = vec![false; 16];
        residency[4 + 2] = true; // layer 1, expert 2
        let rows = [(0, 1, 0, true, false), (0, 1, 3, false, false), (0, 3, 1, false, true), (0, 3, 2, true, false)];
        r.observe(&report(Phase::Decode, &rows, residency));
        assert_eq!(r.tokens(), 1);
        assert_eq!(r.routed(0, 0), Routed::Hit);
        assert_eq!(r.routed(0, 3), Routed::Miss);
        assert_eq!(r.routed(1, 1), Routed::Dropped);
        assert_eq!(r.routed(1, 2), Routed::Hit);
        assert_eq!(r.mark(View::Now, 0, 2), Mark::Resident);
        assert_eq!(r.mark(View::Cache, 0, 3), Mark::Miss);
        assert_eq!(r.now_counts(1), (1, 0, 1));
        // Dropped slots are not lookups: layer 3 had one, a hit.
        assert_eq!(r.hit_pct(0), Some(50.0));
        assert_eq!(r.hit_pct(1), Some(100.0));
        // A prefill step changes residency only.
        r.observe(&report(Phase::Prefill, &[(0, 1, 1, false, false)], vec![true; 16]));
        assert_eq!(r.routed(0, 1), Routed::No);
        assert!(r.is_resident(1, 0));
        // The heat of an expert routed once fades.
        assert_eq!(r.mark(View::Heat, 0, 0), Mark::Heat(1));
        for _ in 0..60 {
            r.observe(&report(Phase::Decode, &[(0, 1, 3, true, false)], Vec::new()));
        }
        assert_eq!(r.mark(View::Heat, 0, 0), Mark::Empty);
        assert_eq!(r.mark(View::Heat, 0, 3), Mark::Heat(4));
    }

    #[test]
    fn rows_of_unknown_layers_or_experts_are_ignored() {
        let mut r = Routing::new(vec![0], 2, false);
        r.observe(&report(Phase::Decode, &[(0, 5, 0, false, false), (0, 0, 9, false, false)], Vec::new()));
        assert_eq!((r.routed(0, 0), r.routed(0, 1)), (Routed::No, Routed::No));
        assert_eq!(r.hit_pct(0), None, "no cache, no hit rate");
    }

    #[test]
    fn density_follows_the_width() {
        assert_eq!(density(8, 40), Density::Full);
        assert_eq!(density(128, 140), Density::Full);
        assert_eq!(density(128, 80), Density::Half);
        assert_eq!(density(128, 40), Density::Folded);
    }

    /// A layer of 16 experts with every mark: hit, read, dropped, cached,
    /// and the four heat levels.
    fn every_mark() -> Routing {
        let mut r = Routing::new(vec![0], 16, true);
        // Experts 8 to 11 from hottest to barely warm; 12 cached.
        for n in 0..30 {
            let mut rows = vec![(0, 0, 8, true, false)];
            if n >= 22 {
                rows.push((0, 0, 9, true, false));
            }
            if n % 2 == 0 {
                rows.push((0, 0, 10, true, false));
            }
            if n == 29 {
                rows.push((0, 0, 11, true, false));
            }
            r.observe(&report(Phase::Decode, &rows, Vec::new()));
        }
        let mut residency = vec![false; 16];
        residency[12] = true;
        let rows = [(0, 0, 0, true, false), (0, 0, 3, false, false), (0, 0, 5, false, true)];
        r.observe(&report(Phase::Decode, &rows, residency));
        r
    }

    /// The panel's cells of row 0 as text, and the legend's glyphs.
    fn drawn(r: &Routing, view: View, width: u16, colour: bool) -> (String, String) {
        let area = Rect::new(0, 0, width, 1);
        let mut buf = Buffer::empty(area);
        render_rows(r, view, 0, colour, 0, area, &mut buf);
        let cells: String = (LABEL..width).map(|x| buf[(x, 0)].symbol().to_string()).collect();
        let cells = cells.trim_end().trim_end_matches(|c: char| c == '%' || c.is_ascii_digit()).trim_end().to_string();
        let keys: String = legend(view, density(r.n_expert, width)).0.iter().map(Key::glyphs).collect();
        (cells, keys)
    }

    #[test]
    fn every_meaning_has_its_own_glyph_at_every_density() {
        let marks = [
            Mark::Hit,
            Mark::Miss,
            Mark::Dropped,
            Mark::Resident,
            Mark::Heat(1),
            Mark::Heat(2),
            Mark::Heat(3),
            Mark::Heat(4),
        ];
        let glyphs: std::collections::HashSet<char> = marks.iter().map(|m| m.glyph()).collect();
        assert_eq!(glyphs.len(), marks.len());
        // A shared cell shows the stronger: a read before a hit, a hit before what is cached.
        assert_eq!(Mark::stronger(Mark::Hit, Mark::Miss), Mark::Miss);
        assert_eq!(Mark::stronger(Mark::Resident, Mark::Hit), Mark::Hit);
        assert_eq!(Mark::stronger(Mark::Dropped, Mark::Resident), Mark::Dropped);
        assert_eq!(Mark::stronger(Mark::Heat(1), Mark::Heat(3)), Mark::Heat(3));
        assert_eq!(Mark::stronger(Mark::Empty, Mark::Heat(2)), Mark::Heat(2));
        let r = every_mark();
        for colour in [false, true] {
            // 16 experts one a cell, two a cell, folded.
            let (full, _) = drawn(&r, View::Now, 30, colour);
            assert_eq!(full, "■  □ ×  █▓▒░·", "colour {colour}");
            let (half, _) = drawn(&r, View::Now, 18, colour);
            assert_eq!(half, "■□× █▒·", "colour {colour}");
            let (folded, _) = drawn(&r, View::Now, 16, colour);
            assert_eq!(folded, "■□×", "colour {colour}");
        }
        // Every glyph drawn is in the legend of its view and density.
        for view in [View::Now, View::Heat, View::Cache] {
            for width in [30, 18, 16] {
                let (cells, keys) = drawn(&r, view, width, false);
                for c in cells.chars().filter(|c| !c.is_whitespace() && !c.is_ascii_digit()) {
                    assert!(keys.contains(c), "{view:?} at {width}: {c} of {cells:?} not in {keys:?}");
                }
            }
        }
    }

    #[test]
    fn each_view_folds_its_own_way() {
        let r = every_mark();
        let folded: Vec<String> = [View::Now, View::Heat, View::Cache].map(|v| drawn(&r, v, 16, false).0).to_vec();
        assert_eq!(folded, ["■□×", "█▓▒", "·1  □1"]);
    }
}
