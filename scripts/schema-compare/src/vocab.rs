//! Qwen3's 151,936-token vocabulary, built from the BPE ranks Qwen publishes
//! in tiktoken form (151,643 byte strings), its 26 added tokens and the
//! padding rows of the release's GGUF files. Both engines get the same
//! token table: llguidance as byte strings (specials behind its 0xFF
//! marker), llama.cpp as a vocabulary-only GGUF file written here in the
//! form llama.cpp's converter writes Qwen3 (`gpt2` model, `qwen2`
//! pre-tokenizer, GPT-2's byte-to-unicode token text).

use std::fs;
use std::io::Write as _;
use std::path::Path;

/// The vocabulary size of Qwen3 releases (the output head's rows).
pub const SIZE: usize = 151_936;
/// BPE tokens in the tiktoken file.
const BPE: usize = 151_643;
/// `<|im_end|>`: Qwen3's end of a turn, its GGUF's eos.
pub const EOS: u32 = 151_645;

/// Added tokens from 151,643 on, and whether each is a control (special)
/// token; the others are text that tokenizes as itself.
const ADDED: [(&str, bool); 26] = [
    ("<|endoftext|>", true),
    ("<|im_start|>", true),
    ("<|im_end|>", true),
    ("<|object_ref_start|>", true),
    ("<|object_ref_end|>", true),
    ("<|box_start|>", true),
    ("<|box_end|>", true),
    ("<|quad_start|>", true),
    ("<|quad_end|>", true),
    ("<|vision_start|>", true),
    ("<|vision_end|>", true),
    ("<|vision_pad|>", true),
    ("<|image_pad|>", true),
    ("<|video_pad|>", true),
    ("<tool_call>", false),
    ("</tool_call>", false),
    ("<|fim_prefix|>", false),
    ("<|fim_middle|>", false),
    ("<|fim_suffix|>", false),
    ("<|fim_pad|>", false),
    ("<|repo_name|>", false),
    ("<|file_sep|>", false),
    ("<tool_response>", false),
    ("</tool_response>", false),
    ("<think>", false),
    ("</think>", false),
];

/// What a token is.
#[derive(Clone, Copy, PartialEq)]
pub enum Kind {
    Normal,
    Control,
    UserDefined,
    Unused,
}

pub struct Vocab {
    /// The token's bytes (for a control token its text).
    pub bytes: Vec<Vec<u8>>,
    pub kinds: Vec<Kind>,
}

impl Vocab {
    /// Reads `qwen.tiktoken` (`BASE64 RANK` lines).
    pub fn load(tiktoken: &Path) -> Result<Vocab, String> {
        let text = fs::read_to_string(tiktoken).map_err(|e| format!("{}: {e}", tiktoken.display()))?;
        let mut bytes = vec![Vec::new(); SIZE];
        let mut kinds = vec![Kind::Unused; SIZE];
        let mut seen = 0;
        for line in text.lines().filter(|l| !l.is_empty()) {
            let (b64, rank) = line.split_once(' ').ok_or_else(|| format!("bad line {line:?}"))?;
            let rank: usize = rank.parse().map_err(|_| format!("bad rank in {line:?}"))?;
            if rank >= BPE {
                return Err(format!("rank {rank} past {BPE}"));
            }
            bytes[rank] = base64(b64)?;
            kinds[rank] = Kind::Normal;
            seen += 1;
        }
        if seen != BPE {
            return Err(format!("{seen} BPE tokens in {}, expected {BPE}", tiktoken.display()));
        }
        for (i, (text, control)) in ADDED.iter().enumerate() {
            bytes[BPE + i] = text.as_bytes().to_vec();
            kinds[BPE + i] = if *control { Kind::Control } else { Kind::UserDefined };
        }
        Ok(Vocab { bytes, kinds })
    }

    /// The token table llguidance takes: control tokens behind the 0xFF
    /// marker (never text), padding rows empty (never allowed).
    pub fn llg_words(&self) -> Vec<Vec<u8>> {
        self.bytes
            .iter()
            .zip(&self.kinds)
            .map(|(b, k)| match k {
                Kind::Control => [&[0xFF][..], b].concat(),
                Kind::Unused => Vec::new(),
                _ => b.clone(),
            })
            .collect()
    }

    /// Writes a vocabulary-only GGUF file llama.cpp loads with
    /// `vocab_only`: Qwen3's tokenizer metadata and no tensors.
    pub fn write_gguf(&self, path: &Path) -> std::io::Result<()> {
        let map = byte_to_unicode();
        let tokens: Vec<String> = (0..SIZE)
            .map(|i| match self.kinds[i] {
                Kind::Normal => self.bytes[i].iter().map(|&b| map[b as usize]).collect(),
                Kind::Unused => format!("[PAD{i}]"),
                _ => String::from_utf8(self.bytes[i].clone()).expect("added tokens are text"),
            })
            .collect();
        let types: Vec<i32> = self
            .kinds
            .iter()
            .map(|k| match k {
                Kind::Normal => 1,
                Kind::Control => 3,
                Kind::UserDefined => 4,
                Kind::Unused => 5,
            })
            .collect();
        let mut kv = Vec::new();
        let mut n = 0u64;
        put_str_kv(&mut kv, &mut n, "general.architecture", "qwen3moe");
        put_str_kv(&mut kv, &mut n, "general.name", "Qwen3 vocabulary (schema-compare)");
        put_str_kv(&mut kv, &mut n, "tokenizer.ggml.model", "gpt2");
        put_str_kv(&mut kv, &mut n, "tokenizer.ggml.pre", "qwen2");
        // Tokens.
        put_key(&mut kv, "tokenizer.ggml.tokens");
        kv.extend(9u32.to_le_bytes());
        kv.extend(8u32.to_le_bytes());
        kv.extend((tokens.len() as u64).to_le_bytes());
        for t in &tokens {
            put_string(&mut kv, t);
        }
        n += 1;
        put_key(&mut kv, "tokenizer.ggml.token_type");
        kv.extend(9u32.to_le_bytes());
        kv.extend(5u32.to_le_bytes());
        kv.extend((types.len() as u64).to_le_bytes());
        for t in &types {
            kv.extend(t.to_le_bytes());
        }
        n += 1;
        // No merges: nothing is tokenized by llama.cpp here (both engines
        // are fed the same token ids); the key must exist.
        put_key(&mut kv, "tokenizer.ggml.merges");
        kv.extend(9u32.to_le_bytes());
        kv.extend(8u32.to_le_bytes());
        kv.extend(0u64.to_le_bytes());
        n += 1;
        for (key, value) in [
            ("tokenizer.ggml.eos_token_id", EOS),
            ("tokenizer.ggml.bos_token_id", 151_643),
            ("tokenizer.ggml.padding_token_id", 151_643),
        ] {
            put_key(&mut kv, key);
            kv.extend(4u32.to_le_bytes());
            kv.extend(value.to_le_bytes());
            n += 1;
        }
        put_key(&mut kv, "tokenizer.ggml.add_bos_token");
        kv.extend(7u32.to_le_bytes());
        kv.push(0);
        n += 1;

        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(3u32.to_le_bytes());
        out.extend(0u64.to_le_bytes());
        out.extend(n.to_le_bytes());
        out.extend(kv);
        while out.len() % 32 != 0 {
            out.push(0);
        }
        let mut f = fs::File::create(path)?;
        f.write_all(&out)
    }
}

fn put_key(out: &mut Vec<u8>, key: &str) {
    put_string(out, key);
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_str_kv(out: &mut Vec<u8>, n: &mut u64, key: &str, value: &str) {
    put_key(out, key);
    out.extend(8u32.to_le_bytes());
    put_string(out, value);
    *n += 1;
}

/// GPT-2's byte-level BPE alphabet: printable Latin-1 bytes stand for
/// themselves, the rest for the code points from 256 on, in byte order.
fn byte_to_unicode() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        map[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap()
        };
    }
    map
}

/// Standard base64 with padding.
fn base64(s: &str) -> Result<Vec<u8>, String> {
    let value = |c: u8| -> Result<u32, String> {
        Ok(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return Err(format!("bad base64 {s:?}")),
        } as u32)
    };
    let raw = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(raw.len() * 3 / 4);
    for chunk in raw.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= value(c)? << (18 - 6 * i);
        }
        let n = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return Err(format!("bad base64 {s:?}")),
        };
        for i in 0..n {
            out.push((acc >> (16 - 8 * i)) as u8);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_decodes() {
        assert_eq!(super::base64("IQ==").unwrap(), b"!");
        assert_eq!(super::base64("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(super::base64("aGk=").unwrap(), b"hi");
    }
}
