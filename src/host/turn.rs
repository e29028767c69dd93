//! What one turn runs with, and the stop strings that end it: the settings
//! come from the configuration for the terminal front ends, and from each
//! request for the server.

use crate::config::RunConfig;
use crate::llama::Sampling;

/// The settings of one turn.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnSettings {
    /// Tokens to generate at most (the room left in the context caps it).
    pub n_predict: u32,
    /// Token selection.
    pub sampling: Sampling,
    /// What the reply must follow (a grammar or a JSON schema), if anything.
    pub constraint: Option<crate::llama::Constraint>,
    /// Let the model think (where the template has a switch).
    pub think: bool,
    /// A reply to the user must be a call of a shown tool.
    pub require_call: bool,
    /// Texts that end the reply where they first appear (not included).
    pub stop: Vec<String>,
}

impl TurnSettings {
    /// The settings `config` gives (its grammar or schema file read now, so an edited
    /// file counts from the next turn).
    pub fn from_config(config: &RunConfig) -> Result<TurnSettings, String> {
        Ok(TurnSettings {
            // 0: no budget; the reply ends where the model ends it or the context does.
            n_predict: match config.generate.n_predict {
                0 => u32::MAX,
                n => n,
            },
            sampling: config.sampling(),
            constraint: config.generate.constraint().map_err(|e| e.to_string())?,
            think: config.chat.think,
            require_call: config.chat.tool_choice == "required",
            stop: Vec::new(),
        })
    }
}

/// Finds the first stop string in generated text that arrives in pieces,
/// passing on only text that cannot be the start of one.
#[derive(Debug, Default)]
pub struct StopScan {
    stops: Vec<String>,
    /// Text held back: it may be the start of a stop string.
    held: String,
    /// Bytes passed on so far.
    passed: usize,
    hit: bool,
    /// The stop string found, once one is.
    matched: Option<String>,
}

impl StopScan {
    /// A scanner for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> StopScan {
        StopScan { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), ..StopScan::default() }
    }

    /// Takes the next piece; returns the text that can be passed on now.
    /// After a stop string, nothing more is passed on.
    pub fn push(&mut self, text: &str) -> String {
        if self.hit {
            return String::new();
        }
        self.held.push_str(text);
        let first = self.stops.iter().filter_map(|s| Some((self.held.find(s.as_str())?, s))).min_by_key(|(at, _)| *at);
        let pass = match first {
            Some((at, stop)) => {
                self.hit = true;
                self.matched = Some(stop.clone());
                let before = self.held[..at].to_string();
                self.held.clear();
                before
            }
            None => {
                let keep = self.partial_suffix();
                let cut = self.held.len() - keep;
                let rest = self.held.split_off(cut);
                std::mem::replace(&mut self.held, rest)
            }
        };
        self.passed += pass.len();
        pass
    }

    /// The text held back at the end (no stop string came).
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.held);
        self.passed += rest.len();
        rest
    }

    /// Whether a stop string was found.
    pub fn hit(&self) -> bool {
        self.hit
    }

    /// The stop string found, if one was.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Bytes of the generated text before the stop string (all passed on).
    pub fn passed(&self) -> usize {
        self.passed
    }

    /// The length of the longest end of the held text that begins some
    /// stop string (always on a character boundary).
    fn partial_suffix(&self) -> usize {
        let held = self.held.as_str();
        held.char_indices()
            .map(|(at, _)| at)
            .find(|&at| self.stops.iter().any(|s| s.starts_with(&held[at..])))
            .map_or(0, |at| held.len() - at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(stops: &[&str], pieces: &[&str]) -> (String, bool, usize) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut scan = StopScan::new(&stops);
        let mut out: String = pieces.iter().map(|p| scan.push(p)).collect();
        if !scan.hit() {
            out.push_str(&scan.finish());
        }
        (out, scan.hit(), scan.passed())
    }

    #[test]
    fn a_stop_string_split_across_pieces_ends_the_text_before_it() {
        assert_eq!(scan(&["END"], &["one E", "N", "D two"]), ("one ".into(), true, 4));
        assert_eq!(scan(&["\n\n", "###"], &["a", "b#", "## c"]), ("ab".into(), true, 2));
    }

    #[test]
    fn the_stop_string_found_first_is_the_one_named() {
        let stops = vec!["later".to_string(), "B".to_string()];
        let mut s = StopScan::new(&stops);
        assert_eq!(s.matched(), None);
        assert_eq!(s.push("a B and later"), "a ");
        assert_eq!(s.matched(), Some("B"));
    }

    #[test]
    fn text_that_only_starts_like_a_stop_string_is_passed_on() {
        let stops = vec!["END".to_string()];
        let mut s = StopScan::new(&stops);
        assert_eq!(s.push("the E"), "the ");
        assert_eq!(s.push("ND"), "");
        assert!(s.hit());
        let mut s = StopScan::new(&stops);
        assert_eq!(s.push("the E"), "the ");
        assert_eq!(s.push("nd"), "End");
        assert_eq!(s.finish(), "");
        assert!(!s.hit());
        assert_eq!(scan(&["END"], &["EN"]), ("EN".into(), false, 2));
    }

    #[test]
    fn no_stop_strings_pass_everything_at_once() {
        let mut scan = StopScan::new(&[String::new()]);
        assert_eq!(scan.push("héllo"), "héllo");
        assert_eq!(scan.passed(), "héllo".len());
    }

    #[test]
    fn multibyte_text_is_held_on_character_boundaries() {
        assert_eq!(scan(&["é!"], &["café", "!", "x"]), ("caf".into(), true, 3));
        assert_eq!(scan(&["éa"], &["ééb"]), ("ééb".into(), false, "ééb".len()));
    }
}
