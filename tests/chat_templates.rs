//! Every bundled real chat template renders a two-turn conversation with a
//! system prompt, thinking on and off, in the structure its family expects;
//! the reasoning splitter starts where the prompt leaves it.

use bmoe::chat::{ChatFormat, Family, Kind, Message, NAMED_TEMPLATES, ThinkControl};

/// What a family's render must look like.
struct Expect {
    name: &'static str,
    /// Pieces that must appear in this order: system, user 1, assistant 1, user 2.
    order: &'static [&'static str],
    /// The end of the prompt with thinking on, and with it off.
    end_on: &'static str,
    end_off: &'static str,
    think: ThinkControl,
    /// The reasoning markers, as the template writes them.
    family: Family,
}

const IM: &[&str] = &[
    "<|im_start|>system\nSYS<|im_end|>",
    "<|im_start|>user\nU1<|im_end|>",
    "A1<|im_end|>",
    "<|im_start|>user\nU2<|im_end|>",
];

const GRANITE: &[&str] = &[
    "<|start_of_role|>system<|end_of_role|>SYS",
    "<|start_of_role|>user<|end_of_role|>U1",
    "<|start_of_role|>assistant<|end_of_role|>A1",
    "<|start_of_role|>user<|end_of_role|>U2",
];

const EXPECT: &[Expect] = &[
    Expect {
        name: "qwen3",
        order: IM,
        end_on: "<|im_start|>assistant\n",
        end_off: "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        family: Family::Think,
        think: ThinkControl::Template,
    },
    Expect {
        name: "qwen3.5",
        order: IM,
        end_on: "<|im_start|>assistant\n<think>\n",
        end_off: "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        family: Family::Think,
        think: ThinkControl::Template,
    },
    Expect {
        name: "qwen2.5",
        order: IM,
        end_on: "<|im_start|>assistant\n",
        end_off: "<|im_start|>assistant\n",
        family: Family::Plain,
        think: ThinkControl::None,
    },
    Expect {
        name: "lfm2",
        order: IM,
        end_on: "<|im_start|>assistant\n",
        end_off: "<|im_start|>assistant\n",
        family: Family::Plain,
        think: ThinkControl::None,
    },
    // No switch in the template: bmoe appends an empty think block.
    Expect {
        name: "lfm2.5",
        order: IM,
        end_on: "<|im_start|>assistant\n",
        end_off: "<|im_start|>assistant\n<think>\n\n</think>\n\n",
        family: Family::Think,
        think: ThinkControl::Prefill,
    },
    Expect {
        name: "nemotron-3",
        order: IM,
        end_on: "<|im_start|>assistant\n<think>\n",
        end_off: "<|im_start|>assistant\n<think></think>",
        family: Family::Think,
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
        family: Family::Harmony,
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
        family: Family::Gemma,
        think: ThinkControl::Template,
    },
    Expect {
        name: "glm-4.7",
        order: &["<|system|>SYS", "<|user|>U1", "<|assistant|>", "A1", "<|user|>U2"],
        end_on: "<|user|>U2<|assistant|><think>",
        end_off: "<|user|>U2<|assistant|></think>",
        family: Family::Think,
        think: ThinkControl::Template,
    },
    Expect {
        name: "deepseek-v4",
        order: &["SYS", "<｜User｜>U1", "<｜Assistant｜>", "A1", "<｜User｜>U2"],
        end_on: "<｜User｜>U2<｜Assistant｜><think>",
        end_off: "<｜User｜>U2<｜Assistant｜></think>",
        family: Family::Think,
        think: ThinkControl::Template,
    },
    Expect {
        name: "granite-4.0",
        order: GRANITE,
        end_on: "U2<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
        end_off: "U2<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
        family: Family::Plain,
        think: ThinkControl::None,
    },
    // Thinking switches other than `enable_thinking`.
    Expect {
        name: "granite-3.3",
        order: GRANITE,
        // `thinking` changes only the default system prompt: with one of its own, on is off.
        end_on: "U2<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
        end_off: "U2<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
        // Its system prompt mentions `<think>` in words; it never writes the tags.
        family: Family::Plain,
        think: ThinkControl::Template,
    },
    Expect {
        name: "kimi-k3",
        order: &[
            "<|open|>message role=\"system\"<|sep|>SYS<|close|>message<|sep|>",
            "<|open|>message role=\"user\"<|sep|>U1<|close|>message<|sep|>",
            "<|open|>response<|sep|>A1<|close|>response<|sep|>",
            "<|open|>message role=\"user\"<|sep|>U2<|close|>message<|sep|>",
        ],
        end_on: "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>",
        end_off: "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>",
        family: Family::Kimi,
        think: ThinkControl::Template,
    },
    Expect {
        name: "kimi-k2-thinking",
        order: &[
            "<|im_system|>system<|im_middle|>SYS<|im_end|>",
            "<|im_user|>user<|im_middle|>U1<|im_end|>",
            "<|im_assistant|>assistant<|im_middle|><think></think>A1<|im_end|>",
            "<|im_user|>user<|im_middle|>U2<|im_end|>",
        ],
        end_on: "<|im_assistant|>assistant<|im_middle|>",
        // No switch: the empty block as its own history writes it.
        end_off: "<|im_assistant|>assistant<|im_middle|><think></think>",
        family: Family::Think,
        think: ThinkControl::Prefill,
    },
    Expect {
        name: "hunyuan",
        order: &[
            "SYS<｜reasoning_mode:opensource｜>reasoning_effort:",
            "<｜hy_User:opensource｜>U1",
            "<｜hy_Assistant:opensource｜><think:opensource></think:opensource>A1<｜hy_eos:opensource｜>",
            "<｜hy_User:opensource｜>U2",
        ],
        end_on: "<｜hy_Assistant:opensource｜><think:opensource>",
        end_off: "<｜hy_Assistant:opensource｜><think:opensource></think:opensource>",
        family: Family::HunyuanThink,
        think: ThinkControl::Template,
    },
    Expect {
        name: "seed-oss",
        order: &[
            "<seed:bos>system\nSYS<seed:eos>",
            "<seed:bos>user\nU1<seed:eos>",
            "<seed:bos>assistant\n<seed:think>R1</seed:think>\nA1<seed:eos>",
            "<seed:bos>user\nU2<seed:eos>",
        ],
        end_on: "U2<seed:eos><seed:bos>assistant\n",
        // A budget of 0: the model writes a short budget note and closes the block itself.
        end_off: "<seed:bos>assistant\n<seed:think><seed:cot_budget_reflect>",
        family: Family::SeedThink,
        think: ThinkControl::Template,
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
        assert_eq!(format.family(), e.family, "{}: reasoning markers", e.name);
        for (thinking, end) in [(true, e.end_on), (false, e.end_off)] {
            let prompt = format.prompt(&conversation(), thinking).unwrap_or_else(|err| panic!("{err}"));
            let shown = format!("{} (thinking {thinking}):\n{prompt}", e.name);
            in_order(&prompt, e.order).unwrap_or_else(|why| panic!("{shown}\n{why}"));
            assert!(prompt.ends_with(end), "{shown}\nshould end with {end:?}");
            assert!(!prompt.starts_with("<s><s>"), "{shown}: doubled BOS");
            let starts = format.splitter(&prompt).kind();
            let opened = ["<think>", "<|open|>think<|sep|>", "<think:opensource>", "<seed:think>"]
                .iter()
                .any(|open| prompt.trim_end().ends_with(open));
            if !thinking && e.name == "seed-oss" {
                // Seed-OSS at a budget of 0 opens the block for the model's budget note.
                assert_eq!(starts, Kind::Reasoning, "{shown}");
            } else if !thinking {
                // Thinking off: whatever the model writes is the answer.
                assert_eq!(starts, Kind::Answer, "{shown}");
            } else if opened {
                // The prompt opened the block: the output starts as reasoning.
                assert_eq!(starts, Kind::Reasoning, "{shown}");
            }
        }
    }
}

fn format(name: &str, effort: Option<&str>) -> ChatFormat {
    let source = bmoe::chat::named_template(name).unwrap();
    ChatFormat::new(name, Some(source), "<s>", "</s>").unwrap().with_reasoning_effort(effort.map(str::to_string))
}

/// Each template is switched by the variables it reads, and an effort level
/// reaches the one that takes it.
#[test]
fn thinking_switches_and_effort_reach_what_each_template_reads() {
    let user = [Message::new("user", "Hi")];
    let switches = |name| format(name, None).think_switches().to_vec();
    assert_eq!(switches("qwen3"), ["enable_thinking"]);
    assert_eq!(switches("kimi-k3"), ["thinking", "thinking_effort"]);
    assert_eq!(switches("granite-3.3"), ["thinking"]);
    assert_eq!(switches("hunyuan"), ["reasoning_effort"]);
    assert_eq!(switches("seed-oss"), ["thinking_budget"]);
    assert_eq!(switches("gpt-oss"), ["reasoning_effort"]);

    // granite-3.3 without a system prompt: `thinking` asks for tags in its default one.
    let granite = format("granite-3.3", None);
    let (on, off) = (granite.prompt(&user, true).unwrap(), granite.prompt(&user, false).unwrap());
    assert!(on.contains("Write your thoughts between <think></think>"), "{on}");
    assert!(!off.contains("<think>") && off.ends_with("<|start_of_role|>assistant<|end_of_role|>"), "{off}");

    // Kimi-K3: `thinking_effort` takes the effort; the template's own default (max) otherwise.
    let kimi = format("kimi-k3", Some("low")).prompt(&user, true).unwrap();
    assert!(kimi.contains("invoked with `thinking_effort=low`"), "{kimi}");
    assert!(format("kimi-k3", None).prompt(&user, true).unwrap().contains("`thinking_effort=max`"));

    // Hunyuan: thinking on needs an effort (high unless asked), off is `no_think`; it refuses medium.
    let hunyuan = |effort, think| format("hunyuan", effort).prompt(&user, think);
    assert!(hunyuan(None, true).unwrap().contains("reasoning_effort:high"));
    assert!(hunyuan(Some("low"), true).unwrap().contains("reasoning_effort:low"));
    assert!(hunyuan(Some("low"), false).unwrap().contains("reasoning_effort:no_think"));
    let refused = hunyuan(Some("medium"), true).unwrap_err().to_string();
    assert!(refused.contains("should be no_think/low/high") && refused.contains("line"), "{refused}");

    // Seed-OSS: off is a budget of 0; on leaves the template's unlimited default.
    let seed = format("seed-oss", None);
    assert!(seed.prompt(&user, false).unwrap().contains("your thinking budget is 0"));
    assert!(!seed.prompt(&user, true).unwrap().contains("thinking budget"));

    // gpt-oss: the effort as given, thinking off by the empty analysis message.
    assert!(format("gpt-oss", Some("high")).prompt(&user, true).unwrap().contains("Reasoning: high"));
}
