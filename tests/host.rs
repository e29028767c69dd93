//! The session host on tiny models with real chat templates: turns extend
//! the KV cache exactly, a template that rewrites history costs only the
//! changed suffix, streaming equals resident over several turns, settings
//! change between turns, and bad templates or a full context leave the host
//! usable.

mod common;

use std::path::{Path, PathBuf};

use bmoe::config::{CacheMb, RunConfig};
use bmoe::host::{Apply, Host, HostError, HostEvent, Turn};
use bmoe::synth::Arch;
use common::*;

/// A tiny qwen3moe carrying `template` (a bundled family name or a source).
fn model(dir: &Path, name: &str, template: &str) -> PathBuf {
    let source = bmoe::chat::named_template(template).unwrap_or(template).to_string();
    write_tiny(dir, name, Arch::Qwen3Moe, |s| s.chat_template = Some(source))
}

fn config(edit: impl FnOnce(&mut RunConfig)) -> RunConfig {
    let mut c = RunConfig::default();
    c.generate.threads = 1;
    c.generate.n_predict = 12;
    edit(&mut c);
    c
}

fn chat(host: &mut Host, text: &str) -> Result<Turn, HostError> {
    host.chat(text, &mut |_: HostEvent<'_>| {})
}

#[test]
fn turns_extend_the_kv_cache_exactly() {
    let dir = tempdir();
    let m = model(dir.path(), "m.gguf", "lfm2");
    let _serial = llama_lock();
    let mut host = Host::open(config(|_| {}), &m).unwrap();
    let first = chat(&mut host, "Hello there").unwrap();
    assert_eq!(first.generation.reused_tokens, 0);
    for text in ["Second turn", "Third turn"] {
        let (held, _) = host.context_use();
        let turn = chat(&mut host, text).unwrap();
        // Everything held is reused; only the last generated token (never
        // decoded yet) and the new text are decoded.
        assert_eq!(turn.generation.reused_tokens, held - 1, "{text}");
        let (now, _) = host.context_use();
        assert_eq!(now, held + turn.prefilled as usize - 1 + turn.generation.tokens.len(), "{text}");
        assert!(!turn.answer.is_empty());
    }
    assert_eq!(host.conversation().messages.len(), 6);
}

#[test]
fn a_rewritten_history_is_decoded_again_from_the_first_difference() {
    let dir = tempdir();
    // Earlier replies are rendered with a marker in front: the prompt of
    // turn 2 differs from turn 1's tokens right where the reply began. The
    // model never writes a byte-fallback token like those of `§` first.
    let template = "{% for m in messages %}{% if m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>\n\
                    {% else %}<|im_start|>assistant\n§{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}\
                    {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let m = model(dir.path(), "m.gguf", template);
    let _serial = llama_lock();
    let mut host = Host::open(config(|_| {}), &m).unwrap();
    let first = chat(&mut host, "Hello there").unwrap();
    let second = chat(&mut host, "Again").unwrap();
    // Turn 1's prompt is kept; its reply and everything after are decoded.
    assert_eq!(second.generation.reused_tokens as u64, first.prefilled);
    let (now, _) = host.context_use();
    assert_eq!(now, second.generation.reused_tokens + second.prefilled as usize + second.generation.tokens.len());
    assert!(second.prefilled > first.generation.tokens.len() as u64);
}

/// Three turns on a fresh host; the answers.
fn three_turns(m: &Path, edit: impl FnOnce(&mut RunConfig)) -> Vec<Vec<i32>> {
    let _serial = llama_lock();
    let mut host = Host::open(config(edit), m).unwrap();
    ["Hello there", "Tell me more", "And then?"].iter().map(|t| chat(&mut host, t).unwrap().generation.tokens).collect()
}

#[test]
fn streamed_chat_equals_resident_over_three_turns() {
    let dir = tempdir();
    for family in ["qwen3", "gpt-oss", "gemma-4"] {
        let m = model(dir.path(), &format!("{family}.gguf"), family);
        let resident = three_turns(&m, |_| {});
        assert!(resident.iter().all(|t| t.len() == 12), "{family}: {resident:?}");
        let cache_off = three_turns(&m, |c| {
            c.moe.stream = bmoe::config::StreamMode::On;
            c.moe.cache_mb = CacheMb::Mib(0.0);
        });
        assert_eq!(cache_off, resident, "{family}: streamed, cache off");
        let evicting = three_turns(&m, |c| {
            c.moe.stream = bmoe::config::StreamMode::On;
            // A token routes 8 of the 32 entries (0.375 MiB); 0.4 MiB evicts every token.
            c.moe.cache_mb = CacheMb::Mib(0.4);
        });
        assert_eq!(evicting, resident, "{family}: streamed, evicting cache");
    }
}

#[test]
fn settings_apply_live_or_reopen_and_keep_the_conversation() {
    let dir = tempdir();
    let m = model(dir.path(), "m.gguf", "qwen3");
    let csv = dir.path().join("turns.csv");
    let _serial = llama_lock();
    // Positioned reads: io_uring's registered cache is sized at open, so
    // with it a budget change reopens (checked below).
    let mut host = Host::open(
        config(|c| {
            c.moe.stream = bmoe::config::StreamMode::On;
            c.moe.io_uring = false;
        }),
        &m,
    )
    .unwrap();
    host.set("telemetry.csv", csv.to_str().unwrap()).unwrap();
    chat(&mut host, "Hello").unwrap();
    let set = host.set("temp", "0.5").unwrap();
    assert_eq!((set.key.as_str(), set.applied), ("generate.temp", Apply::Live));
    // From auto to a fixed budget: a reopen; then a new fixed budget is live.
    assert_eq!(host.set("moe.cache_mb", "1").unwrap().applied, Apply::Reopen);
    assert_eq!(host.set("cache_mb", "0.4").unwrap().applied, Apply::Live);
    // Below one token's working set (0.375 MiB): refused with the reason, unless forced.
    let e = host.set("cache_mb", "0.1").unwrap_err().to_string();
    assert!(e.contains("below one token's working set"), "{e}");
    assert_eq!(host.config().moe.cache_mb, CacheMb::Mib(0.4));
    host.set("force_cache", "true").unwrap();
    assert_eq!(host.set("cache_mb", "0.1").unwrap().applied, Apply::Live);
    // Refused by validation: drafting needs greedy sampling.
    assert!(host.set("draft_plugin", "ngram").unwrap_err().to_string().starts_with("plugins.draft_plugin:"));
    host.set("temp", "0").unwrap();
    let set = host.set("draft_plugin", "ngram").unwrap();
    assert!(set.notices.iter().any(|n| n.contains("draft plugin ngram")), "{:?}", set.notices);
    let set = host.set("ctx_size", "1024").unwrap();
    assert_eq!(set.applied, Apply::Reopen);
    assert_eq!(host.context_use(), (0, 1024));
    assert_eq!(host.conversation().messages.len(), 2, "the conversation survives a reopen");
    let turn = chat(&mut host, "Still there?").unwrap();
    assert_eq!(turn.generation.reused_tokens, 0, "a reopened model prefills the whole conversation");
    // A bad value changes nothing.
    let before = host.config().clone();
    assert!(host.set("io_threads", "0").unwrap_err().to_string().contains("moe.io_threads"));
    assert!(host.set("nonsense", "1").unwrap_err().to_string().contains("unknown setting `nonsense`"));
    assert_eq!(host.config(), &before);
    // With io_uring the cache's memory is registered at its size: a new budget reopens.
    assert_eq!(host.set("io_uring", "true").unwrap().applied, Apply::Reopen);
    if host.info().io_uring {
        assert_eq!(host.set("cache_mb", "0.5").unwrap().applied, Apply::Reopen);
    }
    // The CSV went on through the reopens: both turns' rows, one trailer.
    host.finish().unwrap();
    let text = std::fs::read_to_string(&csv).unwrap();
    let turns: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("turn,"))
        .filter_map(|l| l.split(',').next())
        .collect();
    assert_eq!(turns.len(), 2, "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("# summary")).count(), 1);
}

#[test]
fn template_errors_name_the_template_and_line_and_leave_the_host_usable() {
    let dir = tempdir();
    let m = model(dir.path(), "m.gguf", "qwen3");
    // Renders the first turn, fails on the second at line 3 (an undefined attribute).
    let failing = dir.path().join("failing.jinja");
    std::fs::write(
        &failing,
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}\n{% if messages|length > 2 %}{{ nothing.here }}{% endif %}\n",
    )
    .unwrap();
    let broken = dir.path().join("broken.jinja");
    std::fs::write(&broken, "{% for m in messages %}\n{{ m.content }\n{% endfor %}").unwrap();
    let _serial = llama_lock();
    let mut host = Host::open(config(|_| {}), &m).unwrap();
    let e = host.set("chat.template", broken.to_str().unwrap()).unwrap_err().to_string();
    assert!(e.contains("broken.jinja, line 2: syntax error"), "{e}");
    host.set("chat.template", failing.to_str().unwrap()).unwrap();
    chat(&mut host, "one").unwrap();
    let e = chat(&mut host, "two").unwrap_err().to_string();
    assert!(e.contains("failing.jinja, line 3: undefined value"), "{e}");
    assert_eq!(host.conversation().messages.len(), 2, "a failed turn leaves the conversation as it was");
    host.reset();
    chat(&mut host, "again").unwrap();
}

#[test]
fn a_full_context_is_a_clear_error_and_reset_starts_over() {
    let dir = tempdir();
    let m = model(dir.path(), "m.gguf", "qwen3");
    let _serial = llama_lock();
    // llama.cpp's smallest context is 256 tokens; a turn takes about 30.
    let mut host = Host::open(config(|c| c.generate.ctx_size = 256), &m).unwrap();
    let mut full = None;
    for i in 0..20 {
        if let Err(e) = chat(&mut host, &format!("message number {i}")) {
            full = Some(e);
            break;
        }
    }
    let e = full.expect("256 tokens fill up within twenty turns");
    assert!(matches!(e, HostError::ContextFull { n_ctx: 256, .. }), "{e}");
    assert!(e.to_string().contains("start over"), "{e}");
    host.reset();
    chat(&mut host, "fresh start").unwrap();
}

#[test]
fn a_turn_stopped_during_its_prompt_leaves_the_next_turn_exact() {
    let dir = tempdir();
    let m = model(dir.path(), "m.gguf", "qwen3");
    // Small batches: the prompt is decoded in several chunks; stop after the first.
    let small = |c: &mut RunConfig| {
        c.generate.batch = 8;
        c.generate.ubatch = 8;
    };
    let _serial = llama_lock();
    let mut host = Host::open(config(small), &m).unwrap();
    chat(&mut host, "Hello there").unwrap();
    let abort = host.abort_handle();
    let stopped = host
        .chat("A longer message that takes several prompt chunks to decode", &mut |e| {
            if let HostEvent::Prefill(_) = e {
                abort.abort();
            }
        })
        .unwrap();
    assert!(stopped.generation.aborted && stopped.generation.tokens.is_empty());
    let next = chat(&mut host, "Go on").unwrap();
    // A fresh host given the same conversation answers the same.
    let mut fresh = Host::open(config(small), &m).unwrap();
    let mut conversation = host.conversation().clone();
    conversation.messages.truncate(conversation.messages.len() - 2);
    fresh.set_conversation(conversation);
    let again = chat(&mut fresh, "Go on").unwrap();
    // Both hold the whole conversation: the same prompt, the same reply.
    assert_eq!(host.context_use(), fresh.context_use());
    assert_eq!(next.generation.reused_tokens + next.prefilled as usize, again.prefilled as usize);
    assert_eq!(next.generation.tokens, again.generation.tokens);
}
