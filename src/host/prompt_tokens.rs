//! A rendered chat prompt's tokens with the messages' own text kept as
//! text. The template's markers (`<|im_start|>`, ...) become their control
//! tokens; the same marker written inside a message's content stays plain
//! text, so a user cannot open a turn of their own (`chat.markers_in_content`
//! reads them as llama-server does). A prompt whose messages hold no
//! marker is tokenized exactly as before, in one call.

use std::ops::Range;

use crate::llama::Model;

/// The tokens of `text`, a prompt rendered from messages whose own texts
/// are `contents` (in the order the template writes them): special-token
/// markers are read outside those texts only. A BOS is added where the
/// model asks for one. Errors name a message whose text holds a marker and
/// cannot be found as written in the rendered prompt.
pub fn tokenize_prompt(model: &Model, text: &str, contents: &[&str]) -> Result<Vec<i32>, String> {
    let specials = model.control_texts();
    let holds_marker = |s: &str| specials.iter().any(|(m, _)| contains(s.as_bytes(), m));
    let spans = if contents.iter().any(|c| holds_marker(c)) {
        content_spans(text, contents, &holds_marker)?
    } else {
        Vec::new()
    };
    if spans.is_empty() {
        return Ok(model.tokenize_rendered(text));
    }
    let mut tokens = partition(model, text, &spans);
    model.add_bos_once(&mut tokens);
    Ok(tokens)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Where each of `contents` that holds a marker lies in `text`, searched in
/// order (as written, else trimmed as templates often write it).
fn content_spans(
    text: &str,
    contents: &[&str],
    holds_marker: &dyn Fn(&str) -> bool,
) -> Result<Vec<Range<usize>>, String> {
    let mut spans = Vec::new();
    let mut from = 0;
    for (i, content) in contents.iter().enumerate().filter(|(_, c)| holds_marker(c)) {
        let found = [*content, content.trim()]
            .into_iter()
            .find_map(|c| text[from..].find(c).map(|at| (from + at)..(from + at + c.len())));
        let Some(span) = found else {
            return Err(format!(
                "message {i}'s text holds a special-token marker, and the chat template changes that text so it \
                 cannot be kept as plain text; remove the marker, or read markers as tokens (chat.markers_in_content)"
            ));
        };
        from = span.end;
        spans.push(span);
    }
    Ok(spans)
}

/// The tokens of `text` with markers read outside `spans` (sorted, not
/// overlapping) and everything else tokenized as plain text.
fn partition(model: &Model, text: &str, spans: &[Range<usize>]) -> Vec<i32> {
    let specials = model.control_texts();
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut plain = 0;
    let mut at = 0;
    let mut next_span = spans.iter().peekable();
    while at < bytes.len() {
        if let Some(span) = next_span.peek()
            && span.start <= at
        {
            at = at.max(span.end);
            next_span.next();
            continue;
        }
        // A marker may not reach into the next message's text.
        let limit = next_span.peek().map_or(bytes.len(), |s| s.start);
        let marker = specials
            .iter()
            .find(|(m, _)| at + m.len() <= limit && bytes[at..].starts_with(m) && text.is_char_boundary(at + m.len()));
        match marker {
            Some((m, id)) if text.is_char_boundary(at) => {
                tokens.extend(model.tokenize_plain(&text[plain..at]));
                tokens.push(*id);
                at += m.len();
                plain = at;
            }
            _ => at += 1,
        }
    }
    tokens.extend(model.tokenize_plain(&text[plain..]));
    tokens
}
