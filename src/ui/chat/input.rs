//! The message box: multi-line text with a cursor and a history of sent
//! messages (Up on the first line, Down on the last).

use unicode_width::UnicodeWidthChar;

/// Editable text with history.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InputBox {
    text: String,
    /// Byte offset of the cursor (always on a char boundary).
    cursor: usize,
    history: Vec<String>,
    /// Index into `history` while browsing it.
    browsing: Option<usize>,
    /// What was typed before browsing started.
    draft: String,
    /// The whole text is selected: typing replaces it, Backspace or Delete
    /// clears it, a move of the cursor keeps it.
    selected: bool,
}

impl InputBox {
    /// The text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether nothing is typed.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// Replaces the text, cursor at the end.
    pub fn set(&mut self, text: &str) {
        self.text = text.to_string();
        self.cursor = self.text.len();
        self.selected = false;
    }

    /// Replaces the text and selects it all, so what is typed next
    /// replaces it (a pre-filled value to edit).
    pub fn set_selected(&mut self, text: &str) {
        self.set(text);
        self.selected = !self.text.is_empty();
    }

    /// Whether the whole text is selected.
    pub fn is_selected(&self) -> bool {
        self.selected
    }

    /// Drops the selected text, if it is selected; true if it was.
    fn take_selection(&mut self) -> bool {
        let was = std::mem::take(&mut self.selected);
        if was {
            self.text.clear();
            self.cursor = 0;
        }
        was
    }

    /// Inserts text at the cursor (typing or a paste; `\r` becomes `\n`),
    /// in place of the selected text.
    pub fn insert(&mut self, text: &str) {
        self.take_selection();
        let text = text.replace("\r\n", "\n").replace('\r', "\n");
        self.text.insert_str(self.cursor, &text);
        self.cursor += text.len();
    }

    /// Deletes the character before the cursor (or the selected text).
    pub fn backspace(&mut self) {
        if self.take_selection() {
            return;
        }
        if let Some(c) = self.text[..self.cursor].chars().next_back() {
            self.cursor -= c.len_utf8();
            self.text.remove(self.cursor);
        }
    }

    /// Deletes the character under the cursor (or the selected text).
    pub fn delete(&mut self) {
        if self.take_selection() {
            return;
        }
        if self.cursor < self.text.len() {
            self.text.remove(self.cursor);
        }
    }

    /// Moves the cursor one character left.
    pub fn left(&mut self) {
        self.selected = false;
        if let Some(c) = self.text[..self.cursor].chars().next_back() {
            self.cursor -= c.len_utf8();
        }
    }

    /// Moves the cursor one character right.
    pub fn right(&mut self) {
        self.selected = false;
        if let Some(c) = self.text[self.cursor..].chars().next() {
            self.cursor += c.len_utf8();
        }
    }

    /// Moves to the start of the line.
    pub fn home(&mut self) {
        self.selected = false;
        self.cursor = self.text[..self.cursor].rfind('\n').map_or(0, |i| i + 1);
    }

    /// Moves to the end of the line.
    pub fn end(&mut self) {
        self.selected = false;
        self.cursor += self.text[self.cursor..].find('\n').unwrap_or(self.text.len() - self.cursor);
    }

    /// Up: the line above, or the previous history entry from the first line.
    pub fn up(&mut self) {
        match self.text[..self.cursor].rfind('\n') {
            Some(nl) => {
                let col = self.text[nl + 1..self.cursor].chars().count();
                let start = self.text[..nl].rfind('\n').map_or(0, |i| i + 1);
                self.cursor = advance(&self.text, start, col, nl);
            }
            None => self.history_prev(),
        }
    }

    /// Down: the line below, or the next history entry from the last line.
    pub fn down(&mut self) {
        match self.text[self.cursor..].find('\n') {
            Some(off) => {
                let line_start = self.text[..self.cursor].rfind('\n').map_or(0, |i| i + 1);
                let col = self.text[line_start..self.cursor].chars().count();
                let next = self.cursor + off + 1;
                let next_end = self.text[next..].find('\n').map_or(self.text.len(), |i| next + i);
                self.cursor = advance(&self.text, next, col, next_end);
            }
            None => self.history_next(),
        }
    }

    fn history_prev(&mut self) {
        let i = match self.browsing {
            None if self.history.is_empty() => return,
            None => {
                self.draft = self.text.clone();
                self.history.len() - 1
            }
            Some(0) => return,
            Some(i) => i - 1,
        };
        self.browsing = Some(i);
        let entry = self.history[i].clone();
        self.set(&entry);
    }

    fn history_next(&mut self) {
        let Some(i) = self.browsing else { return };
        if i + 1 < self.history.len() {
            self.browsing = Some(i + 1);
            let entry = self.history[i + 1].clone();
            self.set(&entry);
        } else {
            self.browsing = None;
            let draft = std::mem::take(&mut self.draft);
            self.set(&draft);
        }
    }

    /// Takes the text to send: it joins the history and the box empties.
    pub fn take(&mut self) -> String {
        let text = std::mem::take(&mut self.text);
        self.cursor = 0;
        self.selected = false;
        self.browsing = None;
        if !text.trim().is_empty() && self.history.last() != Some(&text) {
            self.history.push(text.clone());
        }
        text
    }

    /// The text wrapped at `width` columns, and the cursor's (column, row).
    pub fn layout(&self, width: u16) -> (Vec<String>, (u16, u16)) {
        let width = width.max(1) as usize;
        let mut rows = vec![String::new()];
        let (mut col, mut cursor) = (0usize, (0u16, 0u16));
        for (i, c) in self.text.char_indices() {
            if i == self.cursor {
                cursor = (col as u16, rows.len() as u16 - 1);
            }
            if c == '\n' {
                rows.push(String::new());
                col = 0;
                continue;
            }
            let w = c.width().unwrap_or(0);
            if col + w > width {
                rows.push(String::new());
                col = 0;
                if i == self.cursor {
                    cursor = (0, rows.len() as u16 - 1);
                }
            }
            rows.last_mut().expect("one row at least").push(c);
            col += w;
        }
        if self.cursor == self.text.len() {
            if col >= width {
                rows.push(String::new());
                col = 0;
            }
            cursor = (col as u16, rows.len() as u16 - 1);
        }
        (rows, cursor)
    }
}

/// The byte offset `col` characters after `start`, at most `limit`.
fn advance(text: &str, start: usize, col: usize, limit: usize) -> usize {
    text[start..limit].char_indices().nth(col).map_or(limit, |(i, _)| start + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selected_value_is_replaced_by_typing() {
        let mut b = InputBox::default();
        b.set_selected("128");
        assert!(b.is_selected());
        b.insert("600");
        assert_eq!(b.text(), "600");
        b.set_selected("128");
        b.backspace();
        assert_eq!(b.text(), "");
        // A cursor move keeps the value to edit it.
        b.set_selected("128");
        b.end();
        b.insert("0");
        assert_eq!(b.text(), "1280");
    }

    #[test]
    fn edits_moves_and_browses_history() {
        let mut b = InputBox::default();
        b.insert("héllo");
        b.left();
        b.backspace();
        assert_eq!(b.text(), "hélo");
        b.home();
        b.insert("> ");
        b.end();
        b.insert("\nworld");
        assert_eq!(b.text(), "> hélo\nworld");
        // Up keeps the column: the cursor was after "world", column 5.
        b.up();
        b.insert("!");
        assert_eq!(b.text(), "> hél!o\nworld");
        assert_eq!(b.take(), "> hél!o\nworld");
        b.insert("second");
        b.take();
        b.insert("draft");
        b.up();
        assert_eq!(b.text(), "second");
        b.up();
        b.up();
        assert_eq!(b.text(), "> hél!o\nworld");
        b.down();
        b.down();
        assert_eq!(b.text(), "second");
        b.down();
        assert_eq!(b.text(), "draft");
    }

    #[test]
    fn lays_out_wrapped_rows_with_the_cursor() {
        let mut b = InputBox::default();
        b.insert("abcdef\ngh");
        assert_eq!(b.layout(4), (vec!["abcd".into(), "ef".into(), "gh".into()], (2, 2)));
        b.home();
        assert_eq!(b.layout(4).1, (0, 2));
        b.set("abcd");
        assert_eq!(b.layout(4), (vec!["abcd".into(), String::new()], (0, 1)));
    }
}
