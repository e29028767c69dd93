//! Text from untrusted places (a model file's header, llama.cpp's log of
//! it, a hub's listing) made safe to print on one terminal line: control
//! characters escaped, long text cut.

/// `text` with control characters (escape codes, newlines, NUL) escaped as
/// Rust writes them (`\u{1b}`, `\n`), cut after `max` characters with the
/// full length said.
pub fn excerpt(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == max {
            out.push_str(&format!("... ({} bytes)", text.len()));
            return out;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_long_text_cut() {
        assert_eq!(excerpt("a\u{1b}[31mred\n\0", 100), "a\\u{1b}[31mred\\n\\u{0}");
        assert_eq!(excerpt("plain", 100), "plain");
        assert_eq!(excerpt(&"x".repeat(1 << 20), 200), format!("{}... (1048576 bytes)", "x".repeat(200)));
    }
}
