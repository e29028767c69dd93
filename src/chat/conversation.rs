//! A conversation: an optional system prompt and the turns so far, saved to
//! and loaded from JSON.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::template::Message;

/// Version of the saved-conversation format.
const FORMAT: &str = "bmoe-conversation-v1";

/// The system prompt and the messages after it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conversation {
    /// The system prompt, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// User and assistant messages, in order.
    #[serde(default)]
    pub messages: Vec<Message>,
}

#[derive(Serialize)]
struct Saved {
    format: String,
    #[serde(flatten)]
    conversation: Conversation,
}

impl Conversation {
    /// Every message a template sees: the system prompt first.
    pub fn rendered_messages(&self) -> Vec<Message> {
        let system = self.system.iter().map(|s| Message::new("system", s));
        system.chain(self.messages.iter().cloned()).collect()
    }

    /// Writes the conversation as JSON.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let saved = Saved { format: FORMAT.into(), conversation: self.clone() };
        let text = serde_json::to_string_pretty(&saved).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// Reads a conversation written by [`Conversation::save`] (or a bare
    /// `{"messages": [...]}` / `[...]` list of messages).
    pub fn load(path: &Path) -> Result<Conversation, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        Conversation::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the JSON forms [`Conversation::load`] accepts.
    pub fn from_json(text: &str) -> Result<Conversation, String> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let mut conversation: Conversation = match value {
            serde_json::Value::Array(list) => Conversation { system: None, messages: parse_messages(list)? },
            _ => {
                let format = value.get("format").and_then(|f| f.as_str()).unwrap_or(FORMAT);
                if format != FORMAT {
                    return Err(format!("unknown format {format:?} (this bmoe reads {FORMAT})"));
                }
                let serde_json::Value::Object(mut fields) = value else {
                    return Err("a conversation is a list of messages or an object with `messages`".into());
                };
                fields.remove("format");
                let list = match fields.remove("messages") {
                    Some(serde_json::Value::Array(list)) => list,
                    Some(_) => return Err("`messages` is not a list".into()),
                    None => Vec::new(),
                };
                let mut conversation: Conversation = serde_json::from_value(serde_json::Value::Object(fields))
                    .map_err(|e| format!("bad conversation: {e}"))?;
                conversation.messages = parse_messages(list)?;
                conversation
            }
        };
        // A leading system message in the list is the system prompt.
        if conversation.system.is_none() && conversation.messages.first().is_some_and(|m| m.role == "system") {
            conversation.system = Some(conversation.messages.remove(0).content);
        }
        for (i, m) in conversation.messages.iter().enumerate() {
            if !["user", "assistant", "system", "tool"].contains(&m.role.as_str()) {
                return Err(format!("message {}: unknown role {:?}", i + 1, m.role));
            }
        }
        Ok(conversation)
    }
}

/// Parses each message on its own, so an error says which one.
fn parse_messages(list: Vec<serde_json::Value>) -> Result<Vec<Message>, String> {
    list.into_iter()
        .enumerate()
        .map(|(i, m)| serde_json::from_value(m).map_err(|e| format!("message {}: {e}", i + 1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_and_loads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.json");
        let c = Conversation {
            system: Some("Be brief.".into()),
            messages: vec![
                Message::new("user", "Hi"),
                Message { reasoning: Some("greet back".into()), ..Message::new("assistant", "Hello!") },
            ],
        };
        c.save(&path).unwrap();
        assert_eq!(Conversation::load(&path).unwrap(), c);
        assert_eq!(c.rendered_messages()[0], Message::new("system", "Be brief."));
    }

    #[test]
    fn reads_plain_message_lists_and_refuses_bad_ones() {
        let c = Conversation::from_json(r#"[{"role":"system","content":"S"},{"role":"user","content":"U"}]"#).unwrap();
        assert_eq!(c.system.as_deref(), Some("S"));
        assert_eq!(c.messages, [Message::new("user", "U")]);
        assert!(Conversation::from_json("[{\"role\":\"robot\",\"content\":\"x\"}]").unwrap_err().contains("robot"));
        assert!(Conversation::from_json("{\"format\":\"v9\"}").unwrap_err().contains("unknown format"));
        assert!(Conversation::from_json("nope").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn reads_reasoning_content_and_names_unknown_keys() {
        let c = Conversation::from_json(
            r#"[{"role":"user","content":"U"},{"role":"assistant","content":"A","reasoning_content":"R"}]"#,
        )
        .unwrap();
        assert_eq!(c.messages[1].reasoning.as_deref(), Some("R"));
        // Saved under bmoe's own name, read back the same.
        let saved = Conversation::from_json(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(saved, c);
        let e = Conversation::from_json(r#"[{"role":"user","content":"U"},{"role":"user","content":"V","mood":1}]"#)
            .unwrap_err();
        assert!(e.contains("message 2") && e.contains("unknown field `mood`"), "{e}");
        let e = Conversation::from_json(r#"{"messages":[{"role":"user","content":"U","reasoning_contents":"x"}]}"#)
            .unwrap_err();
        assert!(e.contains("message 1") && e.contains("`reasoning_contents`"), "{e}");
        let e = Conversation::from_json(r#"{"system":"S","extra":true}"#).unwrap_err();
        assert!(e.contains("unknown field `extra`"), "{e}");
    }
}
