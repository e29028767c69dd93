//! The text a lossy setting is scored on: a file, or the bundled sample.

use std::path::Path;

/// The bundled sample text: plain English prose of about 700 tokens,
/// written for bmoe (`assets/eval/sample.txt`).
pub const SAMPLE: &str = include_str!("../../assets/eval/sample.txt");

/// The text in `path` (UTF-8), or the bundled sample without one.
pub fn load(path: Option<&Path>) -> Result<String, String> {
    let Some(path) = path else { return Ok(SAMPLE.to_string()) };
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8 text", path.display()))?;
    if text.trim().is_empty() {
        return Err(format!("{}: the text is empty", path.display()));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_is_bundled_and_a_bad_file_is_named() {
        assert!(load(None).unwrap().contains("The river rises"));
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, "  \n").unwrap();
        assert!(load(Some(&empty)).unwrap_err().contains("empty"));
        let binary = dir.path().join("b.bin");
        std::fs::write(&binary, [0xff, 0xfe, 0x00]).unwrap();
        assert!(load(Some(&binary)).unwrap_err().contains("not UTF-8"));
        assert!(load(Some(&dir.path().join("missing"))).is_err());
    }
}
