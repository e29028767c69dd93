//! `s.chat(message, #{tools, answer, ...})`: a chat turn whose tool calls
//! a script function answers, the model continuing after each answer.

use rhai::{Array, Dynamic, FnPtr, Map, NativeCallContext};

use super::{Fallible, Session, check_interrupt, dynamic_to_json, fail, json_to_dynamic, run_guarded};
use crate::chat::ToolCall;
use crate::host::Turn;

/// Replies one `chat` call may run when the script sets no `max_steps`.
const DEFAULT_MAX_STEPS: i64 = 8;

/// What a script's chat options ask for.
struct ToolOptions {
    tools: Option<serde_json::Value>,
    call: Option<FnPtr>,
    tool_choice: Option<String>,
    max_steps: usize,
}

impl ToolOptions {
    fn read(options: &Map) -> Fallible<ToolOptions> {
        for key in options.keys() {
            if !["tools", "answer", "call", "tool_choice", "max_steps"].contains(&key.as_str()) {
                return Err(fail("chat", format!("unknown option `{key}` (tools, answer, tool_choice, max_steps)")));
            }
        }
        let tools = match options.get("tools") {
            None => None,
            Some(v) => {
                // A list of maps, or the list as JSON text.
                let text = v.clone().into_string().unwrap_or_else(|_| dynamic_to_json(v).to_string());
                Some(crate::chat::parse_tools(&text).map_err(|e| fail("chat", format!("tools: {e}")))?)
            }
        };
        // `call` is a Rhai keyword, so the key is `answer` (or `"call"`, quoted).
        let call = match options.get("answer").or_else(|| options.get("call")) {
            None => None,
            Some(v) => Some(
                v.clone()
                    .try_cast::<FnPtr>()
                    .ok_or_else(|| fail("chat", "answer: a function, e.g. |name, args| ... or Fn(\"weather\")"))?,
            ),
        };
        let tool_choice = match options.get("tool_choice") {
            None => None,
            Some(v) => {
                Some(v.clone().into_string().map_err(|_| fail("chat", "tool_choice: \"auto\" or \"required\""))?)
            }
        };
        let max_steps = match options.get("max_steps") {
            None => DEFAULT_MAX_STEPS,
            Some(v) => {
                v.as_int().ok().filter(|&n| n >= 1).ok_or_else(|| fail("chat", "max_steps: 1 or more replies"))?
            }
        };
        Ok(ToolOptions { tools, call, tool_choice, max_steps: max_steps as usize })
    }
}

impl Session {
    /// `s.chat(message, options)`: a chat turn with tools shown (`tools`),
    /// a reply to the user forced to call one (`tool_choice: "required"`),
    /// and calls answered by the script function `answer(name, args)`, whose
    /// result goes back to the model as a `tool` message, up to `max_steps`
    /// replies.
    pub fn chat_with(&mut self, ctx: &NativeCallContext, message: &str, options: &Map) -> Fallible<Map> {
        let options = ToolOptions::read(options)?;
        let old_choice = self.host.borrow().config().chat.tool_choice.clone();
        {
            let mut host = self.host.borrow_mut();
            if let Some(tools) = &options.tools {
                host.set_tools(Some(tools.clone())).map_err(|e| fail("chat", e))?;
            }
            if let Some(choice) = &options.tool_choice {
                host.set("chat.tool_choice", choice).map_err(|e| fail("chat", e))?;
            }
        }
        let result = self.tool_loop(ctx, message, &options);
        // Back to the session's own settings, whatever happened.
        let mut host = self.host.borrow_mut();
        if options.tools.is_some() {
            host.set_tools(None).map_err(|e| fail("chat", e))?;
        }
        if options.tool_choice.is_some() {
            host.set("chat.tool_choice", &old_choice).map_err(|e| fail("chat", e))?;
        }
        result
    }

    fn tool_loop(&mut self, ctx: &NativeCallContext, message: &str, options: &ToolOptions) -> Fallible<Map> {
        let mut answered = Array::new();
        let mut first = true;
        let mut replies = 0;
        let mut reply_tokens = Array::new();
        loop {
            let mut steps = Vec::new();
            let turn: Turn = {
                let mut host = self.host.borrow_mut();
                let result = if std::mem::take(&mut first) {
                    run_guarded(&mut host, &mut steps, |h, on| h.chat(message, on))
                } else {
                    run_guarded(&mut host, &mut steps, |h, on| h.continue_reply(on))
                };
                result.map_err(|e| fail("chat", e))?
            };
            replies += 1;
            reply_tokens.push((turn.generation.tokens.len() as i64).into());
            self.progress("chat", &turn.generation.summary);
            check_interrupt(&turn.generation, "chat")?;
            let done = turn.tool_calls.is_empty() || turn.generation.aborted || replies >= options.max_steps;
            let Some(call) = options.call.as_ref().filter(|_| !done) else {
                let mut map = self.result_map(&turn.generation, Some((&turn.reasoning, &turn.answer)), &steps, false);
                let unanswered: Array = turn.tool_calls.iter().map(|c| Dynamic::from_map(call_map(c))).collect();
                let limited = options.call.is_some() && !unanswered.is_empty() && !turn.generation.aborted;
                if limited {
                    eprintln!(
                        "bmoe run: note: chat stopped after max_steps = {} replies with calls unanswered",
                        options.max_steps
                    );
                }
                map.insert("tool_calls".into(), unanswered.into());
                map.insert("calls".into(), answered.into());
                map.insert("replies".into(), (replies as i64).into());
                map.insert("reply_tokens".into(), reply_tokens.into());
                map.insert("step_limit".into(), limited.into());
                return Ok(map);
            };
            for tool_call in &turn.tool_calls {
                let args = json_to_dynamic(&tool_call.function.arguments_object());
                let name = tool_call.function.name.clone();
                let value: Dynamic = call
                    .call_within_context(ctx, (name.clone(), args))
                    .map_err(|e| fail("chat", format!("tool {name}: {e}")))?;
                let text = result_text(&value);
                self.host.borrow_mut().answer_call(&text).map_err(|e| fail("chat", e))?;
                let mut entry = call_map(tool_call);
                entry.insert("result".into(), text.into());
                answered.push(entry.into());
            }
        }
    }

    /// `s.messages()`: the conversation so far, as maps (`role`, `content`,
    /// and `reasoning`, `tool_calls`, `tool_call_id`, `name` where set).
    pub fn messages(&mut self) -> Array {
        let host = self.host.borrow();
        let messages = host.conversation().rendered_messages();
        messages.iter().map(|m| serde_json::to_value(m).map_or(Dynamic::UNIT, |v| json_to_dynamic(&v))).collect()
    }
}

/// A call as scripts see it: `id`, `name`, `arguments`.
fn call_map(call: &ToolCall) -> Map {
    let mut m = Map::new();
    m.insert("id".into(), call.id.clone().map_or(Dynamic::UNIT, Dynamic::from));
    m.insert("name".into(), call.function.name.clone().into());
    m.insert("arguments".into(), json_to_dynamic(&call.function.arguments_object()));
    m
}

/// What a tool function returned, as the `tool` message's text: a string
/// as it is, `()` as nothing, anything else as JSON.
fn result_text(value: &Dynamic) -> String {
    if value.is_unit() {
        return String::new();
    }
    if let Ok(text) = value.clone().into_string() {
        return text;
    }
    dynamic_to_json(value).to_string()
}
