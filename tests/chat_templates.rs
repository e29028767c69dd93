//! Every bundled real chat template renders a two-turn conversation with a
//! system prompt, thinking on and off, in the structure its family expects;
//! the reasoning splitter starts where the prompt leaves it.

use bmoe::chat::{
    ArgumentsForm, ChatFormat, ChatTemplate, Family, Kind, Message, NAMED_TEMPLATES, RenderOptions, ThinkControl,
    ToolCall,
};

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
            let rendered = format.prompt(&conversation(), thinking).unwrap_or_else(|err| panic!("{err}"));
            let prompt = rendered.text.as_str();
            let shown = format!("{} (thinking {thinking}):\n{prompt}", e.name);
            in_order(prompt, e.order).unwrap_or_else(|why| panic!("{shown}\n{why}"));
            assert!(prompt.ends_with(end), "{shown}\nshould end with {end:?}");
            assert!(!prompt.starts_with("<s><s>"), "{shown}: doubled BOS");
            let starts = format.splitter(&rendered).kind();
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
    let (on, off) = (granite.prompt(&user, true).unwrap().text, granite.prompt(&user, false).unwrap().text);
    assert!(on.contains("Write your thoughts between <think></think>"), "{on}");
    assert!(!off.contains("<think>") && off.ends_with("<|start_of_role|>assistant<|end_of_role|>"), "{off}");

    // Kimi-K3: `thinking_effort` takes the effort; the template's own default (max) otherwise.
    let kimi = format("kimi-k3", Some("low")).prompt(&user, true).unwrap().text;
    assert!(kimi.contains("invoked with `thinking_effort=low`"), "{kimi}");
    assert!(format("kimi-k3", None).prompt(&user, true).unwrap().text.contains("`thinking_effort=max`"));

    // Hunyuan: thinking on needs an effort (high unless asked), off is `no_think`; it refuses medium.
    let hunyuan = |effort, think| format("hunyuan", effort).prompt(&user, think).map(|p| p.text);
    assert!(hunyuan(None, true).unwrap().contains("reasoning_effort:high"));
    assert!(hunyuan(Some("low"), true).unwrap().contains("reasoning_effort:low"));
    assert!(hunyuan(Some("low"), false).unwrap().contains("reasoning_effort:no_think"));
    let refused = hunyuan(Some("medium"), true).unwrap_err().to_string();
    assert!(refused.contains("should be no_think/low/high") && refused.contains("line"), "{refused}");

    // Seed-OSS: off is a budget of 0; on leaves the template's unlimited default.
    let seed = format("seed-oss", None);
    assert!(seed.prompt(&user, false).unwrap().text.contains("your thinking budget is 0"));
    assert!(!seed.prompt(&user, true).unwrap().text.contains("thinking budget"));

    // gpt-oss: the effort as given, thinking off by the empty analysis message.
    assert!(format("gpt-oss", Some("high")).prompt(&user, true).unwrap().text.contains("Reasoning: high"));
}

/// A conversation with one tool call whose arguments are `arguments`, and
/// its result.
fn called(arguments: serde_json::Value) -> Vec<Message> {
    let call = ToolCall::new(Some("functions.get_weather:0".into()), "get_weather", arguments);
    vec![
        Message::new("user", "Weather in Paris?"),
        Message::reply("", None, vec![call.clone()]),
        Message::tool_result(&call, "sunny"),
    ]
}

/// The arguments as an OpenAI client sends them (JSON text, no spaces) and
/// as bmoe holds a call it parsed (an object).
const SENT: &str = r#"{"city":"Paris","days":3}"#;

/// Tool-call arguments reach each bundled template in the form it writes:
/// as sent where it writes text, parsed where it needs a mapping, so both
/// forms render, and a template that writes the text writes it unchanged.
#[test]
fn tool_call_arguments_in_both_forms_render_as_each_template_needs() {
    let expected = [
        ("qwen3", ArgumentsForm::Either),
        ("qwen3.5", ArgumentsForm::Object),
        ("qwen2.5", ArgumentsForm::Object),
        ("gpt-oss", ArgumentsForm::Object),
        ("gemma-4", ArgumentsForm::Either),
        ("glm-4.7", ArgumentsForm::Object),
        ("lfm2", ArgumentsForm::Either),
        ("lfm2.5", ArgumentsForm::Object),
        ("nemotron-3", ArgumentsForm::Object),
        ("deepseek-v4", ArgumentsForm::Either),
        ("granite-4.0", ArgumentsForm::Either),
        ("granite-3.3", ArgumentsForm::Either),
        ("kimi-k3", ArgumentsForm::Either),
        ("kimi-k2-thinking", ArgumentsForm::Either),
        ("hunyuan", ArgumentsForm::Object),
        ("seed-oss", ArgumentsForm::Object),
    ];
    assert_eq!(expected.len(), NAMED_TEMPLATES.len(), "every bundled template is listed");
    let object: serde_json::Value = serde_json::from_str(SENT).unwrap();
    let forms: Vec<_> = expected
        .iter()
        .map(|(name, _)| {
            (*name, ChatTemplate::new(name, bmoe::chat::named_template(name).unwrap()).unwrap().arguments_form())
        })
        .collect();
    assert_eq!(forms, expected);
    // The templates that write arguments given as text as they are.
    let writes_text = ["qwen3", "gemma-4", "granite-4.0", "kimi-k3", "kimi-k2-thinking"];
    for (name, form) in expected {
        let template = ChatTemplate::new(name, bmoe::chat::named_template(name).unwrap()).unwrap();
        let opts = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
        let as_text = template.render(&called(SENT.into()), &opts).unwrap_or_else(|e| panic!("{e}"));
        let as_object = template.render(&called(object.clone()), &opts).unwrap_or_else(|e| panic!("{e}"));
        if !as_object.contains("city") {
            // lfm2 and granite-3.3 write no calls in their history.
            assert_eq!(form, ArgumentsForm::Either, "{name}");
            continue;
        }
        assert!(as_text.contains("city"), "{name}: the call is missing:\n{as_text}");
        match form {
            ArgumentsForm::Object => assert_eq!(as_text, as_object, "{name}: text parsed into the same object"),
            // Written as the client sent it, not parsed and re-spaced
            // (unless the template parses it itself, as deepseek-v4 does).
            _ if writes_text.contains(&name) => {
                assert!(as_text.contains(SENT), "{name}: the arguments' text changed:\n{as_text}")
            }
            _ => assert_eq!(as_text, as_object, "{name}"),
        }
    }
}

/// A template that joins the arguments to strings (DeepSeek-V3.1's
/// `'<｜tool▁sep｜>' + tool['function']['arguments']`) gets text in both
/// forms: the client's text as sent, bmoe's object as compact JSON; one
/// that tests `is string` gets the text unchanged.
#[test]
fn templates_that_write_argument_text_get_text() {
    let joined = "{% for m in messages %}{% if m.tool_calls %}{% if m.content is none %}[none]{% endif %}\
        {% for t in m.tool_calls %}{{ '<call>' + t['function']['name'] + '<sep>' + t['function']['arguments'] + '</call>' }}\
        {% endfor %}{% else %}{{ m.content }}{% endif %}{% endfor %}";
    let template = ChatTemplate::new("joined", joined).unwrap();
    assert_eq!(template.arguments_form(), ArgumentsForm::Text);
    let opts = RenderOptions::default();
    let object: serde_json::Value = serde_json::from_str(SENT).unwrap();
    for arguments in [SENT.into(), object] {
        let text = template.render(&called(arguments), &opts).unwrap_or_else(|e| panic!("{e}"));
        // A reply that only calls tools has `content: null`, as clients send it.
        assert_eq!(text, format!("Weather in Paris?[none]<call>get_weather<sep>{SENT}</call>sunny"));
    }
    let tested = "{% for m in messages %}{% for t in m.tool_calls or [] %}{% if t.function.arguments is string %}\
        {{ t.function.arguments }}{% else %}{{ t.function.arguments | tojson }}{% endif %}{% endfor %}{% endfor %}";
    let template = ChatTemplate::new("tested", tested).unwrap();
    assert_eq!(template.arguments_form(), ArgumentsForm::Either);
    assert_eq!(template.render(&called(SENT.into()), &opts).unwrap(), SENT);
}

/// Where a reply starts (reasoning or answer) is decided by what the
/// template appends after the last message, never by a marker the user
/// typed: a message quoting every family's opening marker starts where a
/// plain one does, thinking on and off, with every bundled template.
#[test]
fn markers_in_the_users_text_do_not_decide_where_the_reply_starts() {
    let markers = "<think> <seed:think> <think:opensource> <|open|>think<|sep|> <|channel|>analysis<|message|> \
                   <|channel>thought <mm:think> <|START_THINKING|>";
    for e in EXPECT {
        let format = ChatFormat::new(e.name, Some(bmoe::chat::named_template(e.name).unwrap()), "<s>", "</s>").unwrap();
        for thinking in [true, false] {
            let starts = |text: &str| {
                let prompt = format.prompt(&[Message::new("user", text)], thinking).unwrap();
                assert!(prompt.reply_opening().len() < prompt.text.len(), "{}: {}", e.name, prompt.text);
                assert!(!prompt.reply_opening().contains(text), "{}: {}", e.name, prompt.reply_opening());
                format.splitter(&prompt).kind()
            };
            let quoted = format!("Explain these literal tags: {markers}");
            assert_eq!(starts(&quoted), starts("Explain the tags"), "{} (thinking {thinking})", e.name);
        }
    }
}

/// A template written in the style of the ones bmoe does not bundle: the
/// user turns, then `tail` after `<assistant>` when the reply is opened.
fn styled(tail: &str) -> ChatFormat {
    let source = format!(
        "{{% for m in messages %}}<{{{{ m.role }}}}>{{{{ m.content }}}}{{% if m.reasoning_content %}}{{{{ m.reasoning_content }}}}{{% endif %}}\
         {{% endfor %}}{{% if add_generation_prompt %}}<assistant>{tail}{{% endif %}}"
    );
    ChatFormat::new("styled", Some(&source), "", "").unwrap_or_else(|e| panic!("{e}"))
}

/// Thinking switches found by what a template reads, with their off values
/// from its own literals: MiniMax-M3's `thinking_mode`, Cohere's
/// `reasoning`, Solar-Open's `reasoning_effort` `minimal`; their markers
/// split the reply; a template with no switch bmoe knows says so.
#[test]
fn thinking_switches_found_in_what_the_template_reads() {
    let user = [Message::new("user", "Hi")];
    let cases = [
        (
            "{% if thinking_mode | default('adaptive') == 'disabled' %}<mm:think></mm:think>{% else %}<mm:think>{% endif %}",
            "thinking_mode",
            Family::MiniMax,
        ),
        ("{% if reasoning %}<|START_THINKING|>{% else %}<|START_RESPONSE|>{% endif %}", "reasoning", Family::Cohere),
        (
            "{% if reasoning_effort in ['minimal'] %}<think></think>{% elif reasoning_effort in ['low', 'high'] or \
             reasoning_effort is not defined %}<think>{% endif %}",
            "reasoning_effort",
            Family::Think,
        ),
    ];
    for (tail, switch, family) in cases {
        let format = styled(tail);
        assert_eq!(format.think_switches(), [switch], "{tail}");
        assert_eq!(format.think_control(), ThinkControl::Template, "{tail}");
        assert_eq!(format.family(), family, "{tail}");
        let on = format.prompt(&user, true).unwrap();
        let off = format.prompt(&user, false).unwrap();
        assert_ne!(on.text, off.text, "{tail}");
        assert_eq!(format.splitter(&on).kind(), Kind::Reasoning, "{tail}: {}", on.text);
        assert_eq!(format.splitter(&off).kind(), Kind::Answer, "{tail}: {}", off.text);
    }
    // A switch bmoe does not know: thinking off changes nothing, and says why.
    let unknown = styled("{% if deep_reasoning_mode %}<think>{% endif %}");
    assert_eq!(unknown.think_control(), ThinkControl::None);
    let notice = unknown.no_switch_notice();
    assert!(notice.contains("changes nothing") && notice.contains("`deep_reasoning_mode`"), "{notice}");
}

/// Where `a` and `b` first differ, with some text of each around it.
fn first_difference(a: &str, b: &str) -> String {
    let at = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    let around = |s: &str| {
        let start = s.floor_char_boundary(at.saturating_sub(60));
        let end = s.ceil_char_boundary((at + 60).min(s.len()));
        format!("{:?}", &s[start..end])
    };
    format!("at byte {at}: bmoe {} / transformers {}", around(a), around(b))
}

/// Where Jinja2 fails and minijinja renders, and bmoe does not copy the
/// failure: a for loop over none (minijinja loops no times), and `tojson` of
/// a `map` (a list in minijinja, a generator in Jinja2).
const JINJA2_ONLY_FAILURES: [&str; 2] =
    ["'NoneType' object is not iterable", "Object of type generator is not JSON serializable"];

/// Renders every template in `templates` for each case transformers
/// rendered into `renders` (scripts/template-renders.py's files) and
/// compares: the number of cases compared and a line for each that differs.
/// Reasoning reaches the template under both names, as transformers 5
/// passes it (bmoe does so for its own history). The failures of
/// [`JINJA2_ONLY_FAILURES`] are the differences allowed.
fn compare_with_transformers(templates: &std::path::Path, renders: &std::path::Path) -> (usize, Vec<String>) {
    let read = |path: std::path::PathBuf| -> serde_json::Value {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap()
    };
    let setup = read(renders.join("conversations.json"));
    let now = chrono::NaiveDateTime::parse_from_str(setup["now"].as_str().unwrap(), "%Y-%m-%dT%H:%M:%S").unwrap();
    let mut paths: Vec<_> = std::fs::read_dir(templates)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .collect();
    paths.sort();
    let (mut compared, mut failures) = (0, Vec::new());
    for path in paths {
        let stem = path.file_stem().unwrap().to_str().unwrap().to_string();
        let expected = read(renders.join(format!("{stem}.json")));
        let cases = expected["cases"].as_array().unwrap();
        let template = match ChatTemplate::new(&stem, &std::fs::read_to_string(&path).unwrap()) {
            Ok(t) => t,
            // A template Jinja2 cannot run either (a nesting mistake).
            Err(_) if cases.iter().all(|c| c["error"].is_string()) => {
                compared += cases.len();
                continue;
            }
            Err(e) => {
                failures.push(format!("{stem}: bmoe cannot compile it; transformers renders it: {e}"));
                continue;
            }
        };
        for case in cases {
            let (conversation, setting) = (case["conversation"].as_str().unwrap(), case["setting"].as_str().unwrap());
            let conv = &setup["conversations"][conversation];
            let messages: Vec<Message> = serde_json::from_value(conv["messages"].clone()).unwrap();
            let (think, effort) = (&setup["settings"][setting][0], &setup["settings"][setting][1]);
            let opts = RenderOptions {
                add_generation_prompt: conv["add_generation_prompt"].as_bool().unwrap_or(true),
                enable_thinking: think.as_bool().unwrap(),
                reasoning_effort: effort.as_str().map(String::from),
                bos_token: setup["bos"].as_str().unwrap().into(),
                eos_token: setup["eos"].as_str().unwrap().into(),
                tools: conv["tools"].as_bool().unwrap_or(false).then(|| setup["tools"].clone()),
                now: Some(now),
            };
            let got = template.render(&messages, &opts);
            let label = format!("{stem} / {conversation} / {setting}");
            compared += 1;
            let error = case["error"].as_str().unwrap_or_default();
            match (got, case["render"].as_str()) {
                (Ok(got), Some(want)) if got != want => {
                    failures.push(format!("{label}: {}", first_difference(&got, want)))
                }
                (Err(e), Some(_)) => failures.push(format!("{label}: bmoe failed: {e}")),
                (Ok(_), None) if JINJA2_ONLY_FAILURES.iter().any(|f| error.contains(f)) => {}
                (Ok(_), None) => failures.push(format!("{label}: bmoe rendered; transformers failed: {error}")),
                _ => {}
            }
        }
    }
    (compared, failures)
}

/// The renders transformers makes of each template in tests/data/chat-templates/
/// (scripts/template-renders.sh wrote them): bmoe's render of the same
/// conversation and setting is the same, byte for byte, functionary's
/// HTML-escaped tool list (plain text joined with `+` to `|safe` text) and
/// gpt-oss's reply with text, reasoning and calls included. One difference is
/// Jinja2's own and bmoe does not copy it: Jinja2 fails on a for loop over
/// none where minijinja loops no times (command-r's tool-use template without
/// tools). Where transformers fails otherwise, bmoe fails too.
#[test]
fn every_template_renders_as_transformers_does() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    assert_eq!(std::fs::read_dir(data.join("chat-templates")).unwrap().count(), 25);
    let (compared, failures) = compare_with_transformers(&data.join("chat-templates"), &data.join("template-renders"));
    assert!(compared > 400, "{compared} cases");
    assert!(failures.is_empty(), "{} of {compared} cases differ:\n{}", failures.len(), failures.join("\n"));
}

/// The wide check, run by `scripts/template-check.sh DIR`: the same
/// comparison over any folder of templates, `$BMOE_TEMPLATE_CHECK/templates`,
/// against the renders the script made in `$BMOE_TEMPLATE_CHECK/renders`.
#[test]
#[ignore = "needs the renders scripts/template-check.sh makes"]
fn wide_template_check() {
    let Some(dir) = std::env::var_os("BMOE_TEMPLATE_CHECK") else {
        panic!("set BMOE_TEMPLATE_CHECK (scripts/template-check.sh does)");
    };
    let dir = std::path::PathBuf::from(dir);
    let (compared, failures) = compare_with_transformers(&dir.join("templates"), &dir.join("renders"));
    println!("{compared} cases compared, {} differ", failures.len());
    assert!(failures.is_empty(), "{} of {compared} cases differ:\n{}", failures.len(), failures.join("\n"));
}

/// `--reasoning-effort` on a template that renders the same for every
/// level says so; on one that reads it (under any name), nothing is said.
#[test]
fn an_effort_the_template_ignores_is_named() {
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat-templates");
    let notice = |file: &str| {
        let source = std::fs::read_to_string(data.join(file)).unwrap();
        let format = ChatFormat::new(file, Some(&source), "<s>", "</s>").unwrap();
        assert_eq!(format.effort_notice(), None, "{file}: no effort asked");
        format.with_reasoning_effort(Some("low".into())).effort_notice()
    };
    // Cohere2MoE reads `reasoning_effort` only to turn thinking off.
    for file in ["Cohere2MoE.jinja", "Qwen-Qwen3-0.6B.jinja", "LFM2-8B-A1B.jinja"] {
        let said = notice(file).unwrap_or_else(|| panic!("{file}: nothing said"));
        assert!(said.contains("`low` changes nothing") && said.contains(file), "{said}");
    }
    for file in ["muse-glimmer.jinja", "openai-gpt-oss-120b.jinja", "Kimi-K3.jinja", "upstage-Solar-Open-100B.jinja"] {
        assert_eq!(notice(file), None, "{file}");
    }
}

/// A conversation that ends in an assistant message is continued (what
/// transformers renders with `continue_final_message`): the prompt ends
/// with that message's text, no end of turn, no new header, and the reply
/// goes on in the answer, with every bundled template, thinking on and off.
#[test]
fn a_final_assistant_message_is_continued_by_every_bundled_template() {
    for e in EXPECT {
        let format = ChatFormat::new(e.name, Some(bmoe::chat::named_template(e.name).unwrap()), "<s>", "</s>").unwrap();
        for thinking in [true, false] {
            let messages = [Message::new("user", "Write a poem"), Message::new("assistant", "Sure, here")];
            let prompt = format.prompt(&messages, thinking).unwrap_or_else(|err| panic!("{}: {err}", e.name));
            let shown = format!("{} (thinking {thinking}):\n{}", e.name, prompt.text);
            assert!(prompt.text.ends_with("Sure, here") && prompt.continues, "{shown}");
            assert_eq!(format.splitter(&prompt).kind(), Kind::Answer, "{shown}");
            // Without the final message, the same template opens a new turn.
            let opened = format.prompt(&messages[..1], thinking).unwrap();
            assert!(!opened.continues && !opened.text.ends_with("Write a poem"), "{}", opened.text);
        }
    }
}

/// Only the key a client sent the reasoning under reaches the template, as
/// transformers passes a message: gpt-oss renders an assistant message with
/// content, `reasoning_content` and tool calls (it refuses content beside
/// `thinking`), and LFM2.5, which reads `thinking`, does not show
/// `reasoning_content`.
#[test]
fn only_the_reasoning_key_the_client_sent_reaches_the_template() {
    use bmoe::chat::{ReasoningKey, ToolCall};
    let history = |key: Option<ReasoningKey>| {
        let call = ToolCall::new(Some("c1".into()), "weather", serde_json::json!({"city": "Oslo"}));
        let assistant = Message {
            reasoning: Some("REASONING-TEXT".into()),
            reasoning_key: key,
            ..Message::reply("Let me check.", None, vec![call])
        };
        let result =
            Message { tool_call_id: Some("c1".into()), name: Some("weather".into()), ..Message::new("tool", "sunny") };
        vec![Message::new("user", "Weather?"), assistant, result]
    };
    let render = |name: &str, key| format(name, None).prompt(&history(key), true);
    render("gpt-oss", Some(ReasoningKey::ReasoningContent)).unwrap_or_else(|e| panic!("{e}"));
    let both = render("gpt-oss", Some(ReasoningKey::Thinking)).unwrap_err().to_string();
    assert!(both.contains("Cannot pass both content and thinking"), "{both}");
    let lfm = |key| render("lfm2.5", key).unwrap().text;
    assert!(!lfm(Some(ReasoningKey::ReasoningContent)).contains("REASONING-TEXT"));
    assert!(lfm(Some(ReasoningKey::Thinking)).contains("REASONING-TEXT"));
}

/// With thinking off, bmoe's empty reasoning block goes where the template
/// opened an assistant turn, not after the tool outputs R1-Distill answers
/// with no assistant header.
#[test]
fn the_no_think_prefill_follows_an_open_assistant_turn_only() {
    use bmoe::chat::ToolCall;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/chat-templates/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja");
    let source = std::fs::read_to_string(path).unwrap();
    let format = ChatFormat::new("r1-distill", Some(&source), "<s>", "</s>").unwrap();
    let asked = format.prompt(&[Message::new("user", "Weather?")], false).unwrap().text;
    assert!(asked.ends_with("<｜Assistant｜><think>\n\n</think>\n\n"), "{asked}");
    let call = ToolCall::new(Some("c1".into()), "weather", serde_json::json!({"city": "Oslo"}));
    let answered = [
        Message::new("user", "Weather?"),
        Message::reply("", None, vec![call]),
        Message { tool_call_id: Some("c1".into()), ..Message::new("tool", "sunny") },
    ];
    let after_tools = format.prompt(&answered, false).unwrap().text;
    assert!(after_tools.ends_with("<｜tool▁outputs▁end｜>"), "{after_tools}");
}

/// Jinja2's markup arithmetic: text added to a value a `set` marked (in one
/// message, not the other) or to `|e`'s result is HTML-escaped, the marked
/// value itself is not. The expected text is what Jinja2 3.1.6 renders
/// through transformers 5.25.0 for the same template and messages.
#[test]
fn text_added_to_marked_text_is_escaped_as_jinja2_does() {
    let source = "{% for m in messages %}{% set args = m.content %}{% if m.role == 'system' %}\
                  {% set args = args|tojson|safe %}{% endif %}{{ m.role + '<' + args }}|{% endfor %}{{ 'x\"'|e + '<' }}";
    let template = ChatTemplate::new("markup", source).unwrap();
    let messages = [Message::new("system", "q\"<"), Message::new("user", "r<")];
    let got = template.render(&messages, &RenderOptions::default()).unwrap();
    assert_eq!(got, "system&lt;\"q\\\"<\"|user<r<|x&#34;&lt;");
}
