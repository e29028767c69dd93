//! The routing panel: a layers x experts matrix built from step reports as
//! they arrive (routed now, hit or read, dropped; what the cache holds;
//! recent routing frequency; per-layer hit rate), and its rendering in
//! three densities: one cell per expert, two experts per cell (half
//! blocks), or one mini bar per layer.

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

    fn routed(self) -> bool {
        matches!(self, Mark::Hit | Mark::Miss | Mark::Dropped)
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
            Density::Full => render_full(routing, view, row, colour, x0, y, buf),
            Density::Half => render_half(routing, view, row, colour, x0, y, buf),
            Density::Folded => render_folded(routing, row, colour, x0, y, buf),
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

fn render_full(routing: &Routing, view: View, row: usize, colour: bool, x0: u16, y: u16, buf: &mut Buffer) -> u16 {
    for e in 0..routing.n_expert {
        let mark = routing.mark(view, row, e);
        let cell = &mut buf[(x0 + e as u16, y)];
        cell.set_char(mark.glyph()).set_style(style_of(mark, colour));
    }
    routing.n_expert as u16
}

/// Two experts per cell. With colour each expert is one half-block pixel;
/// without, the glyph's shape says which of the two is routed now.
fn render_half(routing: &Routing, view: View, row: usize, colour: bool, x0: u16, y: u16, buf: &mut Buffer) -> u16 {
    let cols = routing.n_expert.div_ceil(2);
    for c in 0..cols {
        let upper = routing.mark(view, row, 2 * c);
        let lower = if 2 * c + 1 < routing.n_expert { routing.mark(view, row, 2 * c + 1) } else { Mark::Empty };
        let cell = &mut buf[(x0 + c as u16, y)];
        if colour {
            cell.set_char('▀').set_style(Style::default().fg(upper.colour()).bg(lower.colour()));
        } else {
            cell.set_char(half_glyph(upper, lower)).set_style(Style::default());
        }
    }
    cols as u16
}

/// The monochrome glyph of an expert pair: routed now by shape, then drops,
/// then what the cache holds, then the hotter one's heat.
pub fn half_glyph(upper: Mark, lower: Mark) -> char {
    if upper == Mark::Dropped || lower == Mark::Dropped {
        return '×';
    }
    match (upper.routed(), lower.routed()) {
        (true, true) => '█',
        (true, false) => '▀',
        (false, true) => '▄',
        (false, false) => match (upper, lower) {
            (Mark::Resident, Mark::Resident) => ':',
            (Mark::Resident, _) | (_, Mark::Resident) => '.',
            // The hotter of the two.
            (Mark::Heat(a), Mark::Heat(b)) => Mark::Heat(a.max(b)).glyph(),
            (heat @ Mark::Heat(_), _) | (_, heat @ Mark::Heat(_)) => heat.glyph(),
            _ => ' ',
        },
    }
}

/// One slot per routed expert of the current token: hits, then reads, then
/// drops.
fn render_folded(routing: &Routing, row: usize, colour: bool, x0: u16, y: u16, buf: &mut Buffer) -> u16 {
    let (hits, misses, drops) = routing.now_counts(row);
    let marks = std::iter::repeat_n(Mark::Hit, hits)
        .chain(std::iter::repeat_n(Mark::Miss, misses))
        .chain(std::iter::repeat_n(Mark::Dropped, drops));
    let mut x = x0;
    for mark in marks {
        buf[(x, y)].set_char(mark.glyph()).set_style(style_of(mark, colour));
        x += 1;
    }
    x - x0
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
        assert_eq!(half_glyph(Mark::Hit, Mark::Resident), '▀');
        assert_eq!(half_glyph(Mark::Empty, Mark::Miss), '▄');
        assert_eq!(half_glyph(Mark::Miss, Mark::Hit), '█');
        assert_eq!(half_glyph(Mark::Resident, Mark::Heat(2)), '.');
        assert_eq!(half_glyph(Mark::Dropped, Mark::Hit), '×');
        assert_eq!(half_glyph(Mark::Heat(1), Mark::Heat(3)), '▓');
        assert_eq!(half_glyph(Mark::Empty, Mark::Heat(2)), '▒');
    }
}
