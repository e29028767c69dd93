//! `bmoe template`: prints the prompt a model's chat template renders, so
//! anyone can see what the model will be fed.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use clap::Args;

use crate::chat::{ChatFormat, Conversation, Message, named_template, named_template_list};
use crate::gguf::{ModelFiles, Value};

/// `bmoe template`
#[derive(Args, Debug)]
pub struct TemplateArgs {
    /// A model (its `tokenizer.chat_template`): a GGUF file, or a hub model as `pull` takes it or
    /// `bmoe models` lists it (from the hub cache); a .jinja file; or a bundled family (qwen3,
    /// gpt-oss, gemma-4, ...).
    pub source: String,
    /// The conversation, as JSON: a list of {"role", "content"} messages or a file saved by the REPL's :save.
    /// Default: a system prompt and two user turns.
    #[arg(long, value_name = "FILE.json")]
    pub messages: Option<PathBuf>,
    /// Render with thinking turned off.
    #[arg(long)]
    pub no_think: bool,
    /// How much to think, where the template takes it (gpt-oss, Hunyuan, Kimi-K3).
    #[arg(long, value_name = "low|medium|high", value_parser = ["low", "medium", "high"])]
    pub reasoning_effort: Option<String>,
    /// A JSON file of functions the model may call (OpenAI-style tool list), rendered where the template shows tools.
    #[arg(long, value_name = "FILE.json")]
    pub tools: Option<PathBuf>,
    /// Print, instead of the prompt, the thinking switches bmoe passes the template for these
    /// settings (`enable_thinking`, `reasoning_effort`, ...), as a JSON object.
    #[arg(long, conflicts_with_all = ["messages", "tools"])]
    pub variables: bool,
}

/// A template's source, name and BOS/EOS texts, from a model, a file or a family name.
pub fn load_template(source: &str) -> Result<(String, Option<String>, String, String)> {
    if let Some(text) = named_template(source) {
        return Ok((format!("bundled {source}"), Some(text.to_string()), String::new(), String::new()));
    }
    let path = Path::new(source);
    let is_model = path.extension().is_some_and(|e| e == "gguf");
    let named = crate::hub::ModelRef::parse(source).map_err(anyhow::Error::msg)?;
    let hub_model = matches!(named, crate::hub::ModelRef::Hub(_)) && path.extension().is_none_or(|e| e != "jinja");
    if !is_model && !hub_model {
        let text = std::fs::read_to_string(path).map_err(|e| {
            anyhow!("{source}: {e}; nor is it a bundled template (those are: {})", named_template_list())
        })?;
        return Ok((source.to_string(), Some(text), String::new(), String::new()));
    }
    let files = ModelFiles::open(&super::local_model(source)?)?;
    let meta = files.meta();
    let token = |key: &str| -> String {
        let tokens = meta.get("tokenizer.ggml.tokens").and_then(Value::as_array);
        let id = meta.get_u64(key).map(|i| i as usize);
        id.and_then(|i| tokens?.get(i)?.as_str().map(str::to_string)).unwrap_or_default()
    };
    let template = meta.get_str("tokenizer.chat_template").map(str::to_string);
    Ok((source.to_string(), template, token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")))
}

/// The conversation `bmoe template` renders when given none.
fn sample() -> Vec<Message> {
    vec![
        Message::new("system", "You are a helpful assistant."),
        Message::new("user", "What is the capital of Japan?"),
        Message { reasoning: Some("A geography question.".into()), ..Message::new("assistant", "Tokyo.") },
        Message::new("user", "And of France?"),
    ]
}

/// Runs `bmoe template`.
pub fn template(args: TemplateArgs) -> Result<()> {
    let (name, source, bos, eos) = load_template(&args.source)?;
    let format = ChatFormat::new(&name, source.as_deref(), &bos, &eos)
        .map_err(|e| anyhow!(e))?
        .with_reasoning_effort(args.reasoning_effort);
    let chat = crate::config::ChatConfig { tools: args.tools.clone().unwrap_or_default(), ..Default::default() };
    let format = format.with_tools(chat.tool_list().map_err(|e| anyhow!(e))?);
    if args.variables {
        println!("{}", serde_json::Value::Object(format.variables(!args.no_think)));
        return Ok(());
    }
    let messages = match &args.messages {
        Some(path) => Conversation::load(path).map_err(|e| anyhow!(e))?.rendered_messages(),
        None => sample(),
    };
    let prompt = format.prompt(&messages, !args.no_think).map_err(|e| anyhow!(e))?.text;
    let switches = match format.think_switches() {
        [] => String::new(),
        names => format!(" ({})", names.join(", ")),
    };
    eprintln!(
        "bmoe: template {}{}: reasoning {}, thinking control: {}{switches}",
        name,
        if format.is_fallback() { " (none in the model: the plain fallback)" } else { "" },
        format.family().name(),
        format.think_control().name()
    );
    if args.no_think && format.think_control() == crate::chat::ThinkControl::None {
        eprintln!("bmoe: {}", format.no_switch_notice());
    }
    if let Some(notice) = format.effort_notice() {
        eprintln!("bmoe: {notice}");
    }
    // Exactly the prompt; a newline after it only for the eye on a terminal.
    print!("{prompt}");
    if !prompt.ends_with('\n') && std::io::stdout().is_terminal() {
        println!();
    }
    Ok(())
}
