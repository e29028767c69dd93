//! Every bundled real chat template renders a two-turn conversation with a
//! system prompt, thinking on and off, in the structure its family expects;
//! the reasoning splitter starts where the prompt leaves it.

use bmoe::chat::{ChatFormat, Kind, Message, NAMED_TEMPLATES, ThinkControl};

/// What a family's render must look like.
struct Expect {
    name: &'static str,
    /// Pieces that must appear in this order: system, user 1, assistant 1, user 2.
    order: &'static [&'static str],
    /// The end of the prompt with thinking on, and with it off.
    end_on: &'static str,
    end_off: &'static str,
    think: ThinkControl,
}

const IM: &[&str] = &[
    "<|im_start|>system\nSYS<|im_end|>",
    "<|im_start|>user\nU1<|im_end|>",
    "A1<|im_end|>",
    "<|im_start|>user\nU2<|im_end|>",
];

const EXPECT: &[Expect] = &[
    Expect {
        name: "qwen3",
        order: IM,
        end_on: "<|im_start|>assistant\n",
        end_off: "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        think: ThinkControl::Template,
    },
    Expect {
        name: "qwen3.5",
        order: IM,
        end_on: "<|im_start|>assistant\n<think>\n",
        end_off: "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        think: ThinkControl::Template,
    },
    Expect {
        name: "qwen2.5",
        order: IM,
        end_on: "<|im_start|>assistant\n",
        end_off: "<|im_start|>assistant\n",
        think: ThinkControl::None,
    },
    Expect {
        name: "lfm2",
        order: IM,
        end_on: "<|im_start|>assistant\n",
        end_off: "<|im_start|>assistant\n",
        think: ThinkControl::None,
    },
    // No switch in the template: bmoe appends an empty think block.
    Expect {
        name: "lfm2.5",
        order: IM,
        end_on: "<|im_start|>assistant\n",
        end_off: "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        think: ThinkControl::Prefill,
    },
    Expect {
        name: "nemotron-3",
        order: IM,
        end_on: "<|im_start|>assistant\n<think>\n",
        end_off: "<|im_start|>assistant\n<think></think>",
        think: ThinkControl::Template,
    },
    Expect {
        name: "gpt-oss",
        order: &[
            "<|start|>developer<|message|># Instructions\n\nSYS",
            "<|start|>user<|message|>U1<|end|>",
            "<|channel|>final<|message|>A1",
            "<|start|>user<|message|>U2<|end|>",
        ],
        end_on: "<|start|>user<|message|>U2<|end|><|start|>assistant",
        // No switch: the reference engine's continuation trick, an empty analysis message.
        end_off: "<|start|>assistant<|channel|>analysis<|message|>\n\n<|end|><|start|>assistant<|channel|>final<|message|>",
        think: ThinkControl::Prefill,
    },
    Expect {
        name: "gemma-4",
        order: &[
            "<|turn>system\n",
            "SYS<turn|>",
            "<|turn>user\nU1<turn|>",
            "<|turn>model\nA1<turn|>",
            "<|turn>user\nU2<turn|>",
        ],
        end_on: "<|turn>user\nU2<turn|>\n<|turn>model\n",
        end_off: "<|turn>model\n<|channel>thought\n<channel|>",
        think: ThinkControl::Template,
    },
    Expect {
        name: "glm-4.7",
        order: &["<|system|>SYS", "<|user|>U1", "<|assistant|>", "A1", "<|user|>U2"],
        end_on: "<|user|>U2<|assistant|><think>",
        end_off: "<|user|>U2<|assistant|></think>",
        think: ThinkControl::Template,
    },
    Expect {
        name: "deepseek-v4",
        order: &["SYS", "<｜User｜>U1", "<｜Assistant｜>", "A1", "<｜User｜>U2"],
        end_on: "<｜User｜>U2<｜Assistant｜><think>",
        end_off: "<｜User｜>U2<｜Assistant｜></think>",
        think: ThinkControl::Template,
    },
    Expect {
        name: "granite-4.0",
        order: &[
            "<|start_of_role|>system<|end_of_role|>SYS",
            "<|start_of_role|>user<|end_of_role|>U1",
            "<|start_of_role|>assistant<|end_of_role|>A1",
            "<|start_of_role|>user<|end_of_role|>U2",
        ],
        end_on: "U2<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
        end_off: "U2<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
        think: ThinkControl::None,
    },
];

fn conversation() -> Vec<Message> {
    vec![
        Message::new("system", "SYS"),
        Message::new("user", "U1"),
        Message { reasoning: Some("R1".into()), ..Message::new("assistant", "A1") },
        Message::new("user", "U2"),
    ]
}

fn in_order(text: &str, pieces: &[&str]) -> Result<(), String> {
    let mut from = 0;
    for p in pieces {
        match text[from..].find(p) {
            Some(at) => from += at + p.len(),
            None => return Err(format!("{p:?} missing or out of order")),
        }
    }
    Ok(())
}

#[test]
fn every_bundled_template_is_covered() {
    let names: Vec<&str> = NAMED_TEMPLATES.iter().map(|(n, _)| *n).collect();
    let expected: Vec<&str> = EXPECT.iter().map(|e| e.name).collect();
    assert_eq!(names.len(), expected.len());
    assert!(names.iter().all(|n| expected.contains(n)), "{names:?} vs {expected:?}");
}

#[test]
fn two_turns_with_a_system_prompt_thinking_on_and_off() {
    for e in EXPECT {
        let source = bmoe::chat::named_template(e.name).unwrap();
        let format = ChatFormat::new(e.name, Some(source), "<s>", "</s>").unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(format.think_control(), e.think, "{}: thinking control", e.name);
        for (thinking, end) in [(true, e.end_on), (false, e.end_off)] {
            let prompt = format.prompt(&conversation(), thinking).unwrap_or_else(|err| panic!("{err}"));
            let shown = format!("{} (thinking {thinking}):\n{prompt}", e.name);
            in_order(&prompt, e.order).unwrap_or_else(|why| panic!("{shown}\n{why}"));
            assert!(prompt.ends_with(end), "{shown}\nshould end with {end:?}");
            assert!(!prompt.starts_with("<s><s>"), "{shown}: doubled BOS");
            let starts = format.splitter(&prompt).kind();
            if !thinking {
                // Thinking off: whatever the model writes is the answer.
                assert_eq!(starts, Kind::Answer, "{shown}");
            } else if prompt.ends_with("<think>\n") || prompt.ends_with("<think>") {
                // The prompt opened the block: the output starts as reasoning.
                assert_eq!(starts, Kind::Reasoning, "{shown}");
            }
        }
    }
}
