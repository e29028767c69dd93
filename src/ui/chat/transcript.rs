//! The conversation as cells: finished cells cache their wrapped lines per
//! width; the live reply is the last cell and is the only one wrapped again
//! as tokens arrive. Drawing walks back from the bottom and stops once the
//! view is full, so a long chat costs no more than a short one.

use std::cell::RefCell;

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use unicode_width::UnicodeWidthChar;

/// One entry of the transcript.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// A message the user sent.
    User(String),
    /// A reply: its reasoning, its answer, and a line of figures once done.
    Reply {
        /// The reasoning (empty when none).
        reasoning: String,
        /// The answer.
        answer: String,
        /// Set when the turn ended: tokens, speed, or why it stopped.
        footer: Option<String>,
    },
    /// A function the reply called, as `name(arguments)`.
    ToolCall(String),
    /// A note from bmoe (a plugin disabled, a setting applied).
    Notice(String),
    /// Something failed; the chat goes on.
    Error(String),
}

/// An entry with its wrapped lines for one (width, reasoning shown).
#[derive(Debug)]
struct Cell {
    entry: Entry,
    wrapped: RefCell<Option<(u16, bool, Vec<Line<'static>>)>>,
}

/// The transcript and its scroll position.
#[derive(Debug, Default)]
pub struct Transcript {
    cells: Vec<Cell>,
    /// Lines scrolled up from the bottom (0 = following new text).
    pub scroll_back: usize,
    /// Whether reasoning is shown in full.
    pub show_reasoning: bool,
    /// Colours on.
    pub colour: bool,
    /// The last entry is a notice of work in progress, replaced as it
    /// goes on ([`Transcript::progress`]).
    progress_open: bool,
}

impl Transcript {
    /// An empty transcript.
    pub fn new(colour: bool) -> Transcript {
        Transcript { colour, ..Transcript::default() }
    }

    /// Appends an entry.
    pub fn push(&mut self, entry: Entry) {
        self.progress_open = false;
        self.cells.push(Cell { entry, wrapped: RefCell::new(None) });
    }

    /// Shows `text` as a notice of work in progress: the first call appends
    /// it, later ones replace it until another entry is pushed.
    pub fn progress(&mut self, text: String) {
        match self.cells.last_mut() {
            Some(cell) if self.progress_open => {
                *cell = Cell { entry: Entry::Notice(text), wrapped: RefCell::new(None) }
            }
            _ => {
                self.push(Entry::Notice(text));
                self.progress_open = true;
            }
        }
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.cells.iter().map(|c| &c.entry)
    }

    /// The reply being written: the last reply without a footer (notices
    /// may have arrived after it).
    pub fn live_reply(&mut self) -> Option<(&mut String, &mut String, &mut Option<String>)> {
        let cell = self.cells.iter_mut().rev().find(|c| matches!(c.entry, Entry::Reply { footer: None, .. }))?;
        cell.wrapped.replace(None);
        match &mut cell.entry {
            Entry::Reply { reasoning, answer, footer } => Some((reasoning, answer, footer)),
            _ => None,
        }
    }

    /// Ends the reply being written as failed; one that never got any text
    /// (a turn refused before it began) is removed.
    pub fn fail_live_reply(&mut self) {
        let Some(i) = self.cells.iter().rposition(|c| matches!(c.entry, Entry::Reply { footer: None, .. })) else {
            return;
        };
        let cell = &mut self.cells[i];
        match &mut cell.entry {
            Entry::Reply { reasoning, answer, .. } if reasoning.is_empty() && answer.is_empty() => {
                self.cells.remove(i);
            }
            Entry::Reply { footer, .. } => {
                *footer = Some("failed".into());
                cell.wrapped.replace(None);
            }
            _ => {}
        }
    }

    /// Empties the transcript.
    pub fn clear(&mut self) {
        self.cells.clear();
        self.scroll_back = 0;
    }

    /// Scrolls up (positive) or down by `lines`; down to 0 follows new text.
    pub fn scroll(&mut self, lines: isize) {
        self.scroll_back = self.scroll_back.saturating_add_signed(lines);
    }

    /// Draws the bottom of the transcript (minus the scroll) into `area`.
    pub fn render(&self, area: Rect, buf: &mut Buffer) {
        if area.width == 0 || area.height == 0 {
            return;
        }
        let want = area.height as usize + self.scroll_back;
        let mut lines: Vec<Line<'static>> = Vec::new();
        for cell in self.cells.iter().rev() {
            let mut cached = cell.wrapped.borrow_mut();
            let fresh = !matches!(&*cached, Some((w, r, _)) if *w == area.width && *r == self.show_reasoning);
            if fresh {
                *cached = Some((area.width, self.show_reasoning, self.wrap(&cell.entry, area.width)));
            }
            let cell_lines = &cached.as_ref().expect("just filled").2;
            lines.splice(0..0, cell_lines.iter().cloned());
            if lines.len() >= want {
                break;
            }
        }
        // Scrolling stops at the top of the transcript.
        let scroll = self.scroll_back.min(lines.len().saturating_sub(area.height as usize));
        let end = lines.len() - scroll;
        let start = end.saturating_sub(area.height as usize);
        for (y, line) in lines[start..end].iter().enumerate() {
            buf.set_line(area.x, area.y + y as u16, line, area.width);
        }
    }

    fn wrap(&self, entry: &Entry, width: u16) -> Vec<Line<'static>> {
        let style = |c: Color| if self.colour { Style::default().fg(c) } else { Style::default() };
        let bold = Style::default().add_modifier(Modifier::BOLD);
        let dim = Style::default().add_modifier(Modifier::DIM);
        let mut out = Vec::new();
        match entry {
            Entry::User(text) => {
                push_wrapped(&mut out, "you  ", bold.patch(style(Color::LightGreen)), text, Style::default(), width);
            }
            Entry::Reply { reasoning, answer, footer } => {
                let who = bold.patch(style(Color::LightCyan));
                if !reasoning.trim().is_empty() {
                    let words = reasoning.split_whitespace().count();
                    if self.show_reasoning {
                        out.push(Line::from(vec![
                            Span::styled("bmoe ", who),
                            Span::styled(format!("▾ thinking ({words} words, Tab hides)"), dim),
                        ]));
                        push_wrapped(
                            &mut out,
                            "     ",
                            dim,
                            reasoning.trim(),
                            dim.add_modifier(Modifier::ITALIC),
                            width,
                        );
                    } else {
                        let state = if answer.is_empty() && footer.is_none() { "thinking…" } else { "thought" };
                        out.push(Line::from(vec![
                            Span::styled("bmoe ", who),
                            Span::styled(format!("▸ {state} ({words} words, Tab shows)"), dim),
                        ]));
                    }
                    push_wrapped(&mut out, "     ", who, answer.trim_start(), Style::default(), width);
                } else {
                    push_wrapped(&mut out, "bmoe ", who, answer.trim_start(), Style::default(), width);
                }
                match footer {
                    Some(f) => push_wrapped(&mut out, "     ", dim, f, dim, width),
                    None => out.push(Line::from(Span::styled("     ▌", style(Color::LightCyan)))),
                }
            }
            Entry::ToolCall(call) => {
                push_wrapped(
                    &mut out,
                    "call ",
                    bold.patch(style(Color::LightYellow)),
                    call,
                    style(Color::LightYellow),
                    width,
                );
            }
            Entry::Notice(text) => push_wrapped(&mut out, "note ", dim, text, dim, width),
            Entry::Error(text) => {
                let red = bold.patch(style(Color::LightRed));
                push_wrapped(&mut out, "error ", red, text, style(Color::LightRed), width);
            }
        }
        out.push(Line::default());
        out
    }
}

/// Wraps `text` at `width` (words where possible), the first line after
/// `prefix` and the rest indented to match.
fn push_wrapped(out: &mut Vec<Line<'static>>, prefix: &str, prefix_style: Style, text: &str, style: Style, width: u16) {
    let indent = prefix.chars().count();
    let room = (width as usize).saturating_sub(indent).max(1);
    let mut first = true;
    for piece in wrap_text(text, room) {
        let lead = if first { Span::styled(prefix.to_string(), prefix_style) } else { Span::raw(" ".repeat(indent)) };
        first = false;
        out.push(Line::from(vec![lead, Span::styled(piece, style)]));
    }
}

/// Splits `text` into lines of at most `width` columns: at newlines, then
/// at spaces, breaking words longer than a line.
pub fn wrap_text(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    for para in text.split('\n') {
        let mut line = String::new();
        let mut line_w = 0;
        for word in para.split_inclusive(' ') {
            let word_w: usize = word.chars().map(|c| c.width().unwrap_or(0)).sum();
            if line_w + word_w.min(width) > width && line_w > 0 {
                lines.push(std::mem::take(&mut line).trim_end().to_string());
                line_w = 0;
            }
            for c in word.chars() {
                let w = c.width().unwrap_or(0);
                if line_w + w > width && c != ' ' {
                    lines.push(std::mem::take(&mut line));
                    line_w = 0;
                }
                if c == '\t' {
                    line.push(' ');
                    line_w += 1;
                } else if !c.is_control() {
                    line.push(c);
                    line_w += w;
                }
            }
        }
        lines.push(line.trim_end().to_string());
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_spaces_and_breaks_long_words() {
        assert_eq!(wrap_text("the quick brown fox", 10), ["the quick", "brown fox"]);
        assert_eq!(wrap_text("abcdefghijkl", 5), ["abcde", "fghij", "kl"]);
        assert_eq!(wrap_text("a\n\nb", 5), ["a", "", "b"]);
        assert_eq!(wrap_text("", 5), [""]);
        for line in wrap_text("日本語のテキストを折り返す", 7) {
            assert!(line.chars().map(|c| c.width().unwrap_or(0)).sum::<usize>() <= 7, "{line}");
        }
    }
}
