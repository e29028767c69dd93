//! One table of keys: it drives dispatch, the help overlay and the key
//! hints on the bottom line, so help cannot drift from what the keys do.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

/// Where a key applies. Overlays get keys before the chat screen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// Everywhere.
    Global,
    /// The chat screen (the message box has focus).
    Chat,
    /// The help overlay.
    Help,
    /// The settings list.
    Settings,
    /// Editing a setting's value.
    SettingEdit,
}

impl Context {
    /// Its heading in the help overlay.
    pub fn title(self) -> &'static str {
        match self {
            Context::Global => "Anywhere",
            Context::Chat => "Chat",
            Context::Help => "Help",
            Context::Settings => "Settings",
            Context::SettingEdit => "Editing a setting",
        }
    }
}

/// What a key does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Quit (the second press in a row; the first arms it).
    Quit,
    /// Stop the reply being generated, or close an overlay.
    Stop,
    /// Send the message.
    Send,
    /// Insert a line break.
    Newline,
    /// Open the help overlay.
    Help,
    /// Open the settings popup.
    Settings,
    /// Cycle the routing panel's view.
    RoutingView,
    /// Show or hide reasoning.
    ToggleThinking,
    /// Turn the model's thinking off or on (`chat.think`) from the next turn.
    ThinkSwitch,
    /// Scroll the conversation up a page.
    PageUp,
    /// Scroll the conversation down a page.
    PageDown,
    /// Scroll the routing panel up.
    RoutingUp,
    /// Scroll the routing panel down.
    RoutingDown,
    /// Start a new conversation.
    NewChat,
    /// Close the overlay.
    Close,
    /// Select the previous entry.
    Prev,
    /// Select the next entry.
    Next,
    /// Edit (settings list) or apply (editing).
    Enter,
}

/// One binding.
pub struct Binding {
    /// Where it applies.
    pub context: Context,
    /// The keys (code, modifiers) that trigger it.
    pub keys: &'static [(KeyCode, KeyModifiers)],
    /// How the keys are written in help.
    pub label: &'static str,
    /// What it does.
    pub action: Action,
    /// What help says.
    pub help: &'static str,
    /// Its short name on the bottom line (empty: not hinted).
    pub hint: &'static str,
}

const NONE: KeyModifiers = KeyModifiers::NONE;
const CTRL: KeyModifiers = KeyModifiers::CONTROL;
const ALT: KeyModifiers = KeyModifiers::ALT;
const SHIFT: KeyModifiers = KeyModifiers::SHIFT;

macro_rules! bind {
    ($ctx:ident, [$(($code:expr, $mods:expr)),+], $label:expr, $action:ident, $help:expr, $hint:expr $(,)?) => {
        Binding {
            context: Context::$ctx,
            keys: &[$(($code, $mods)),+],
            label: $label,
            action: Action::$action,
            help: $help,
            hint: $hint,
        }
    };
}

/// The keys that edit the message box and a setting being edited (handled
/// as typing, not bound to actions), as help lists them.
pub static EDITING_KEYS: &[(&str, &str)] = &[
    ("Left / Right", "move the cursor"),
    ("Home / Ctrl-A", "to the start of the line"),
    ("End / Ctrl-E", "to the end of the line"),
    ("Backspace", "delete before the cursor (Delete: after it)"),
    ("Ctrl-U", "clear the line"),
];

/// Every key bmoe chat knows, in help order.
pub static KEYMAP: &[Binding] = &[
    bind!(Global, [(KeyCode::Char('c'), CTRL)], "Ctrl-C ×2", Quit, "quit (press twice in a row)", "quit"),
    bind!(Chat, [(KeyCode::Enter, NONE)], "Enter", Send, "send the message", ""),
    bind!(
        Chat,
        [(KeyCode::Enter, ALT), (KeyCode::Enter, SHIFT), (KeyCode::Char('j'), CTRL)],
        "Alt-Enter",
        Newline,
        "new line in the message (also Shift-Enter, Ctrl-J)",
        ""
    ),
    bind!(Chat, [(KeyCode::Esc, NONE)], "Esc", Stop, "stop the reply; the conversation stays usable", "stop reply"),
    bind!(Chat, [(KeyCode::Tab, NONE)], "Tab", ToggleThinking, "show or hide the model's reasoning", "thinking"),
    bind!(
        Chat,
        [(KeyCode::Char('t'), CTRL)],
        "Ctrl-T",
        ThinkSwitch,
        "thinking off or on from the next turn (chat.think)",
        ""
    ),
    bind!(Chat, [(KeyCode::F(2), NONE)], "F2", Settings, "settings: change knobs between turns", "settings"),
    bind!(Chat, [(KeyCode::F(3), NONE)], "F3", RoutingView, "routing view: now, heat, cache", "view"),
    bind!(Chat, [(KeyCode::PageUp, NONE)], "PgUp", PageUp, "scroll the conversation up", ""),
    bind!(Chat, [(KeyCode::PageDown, NONE)], "PgDn", PageDown, "scroll the conversation down (to the end follows)", ""),
    bind!(
        Chat,
        [(KeyCode::Up, SHIFT), (KeyCode::Up, ALT)],
        "Shift-Up",
        RoutingUp,
        "scroll the routing panel up (also Alt-Up)",
        ""
    ),
    bind!(
        Chat,
        [(KeyCode::Down, SHIFT), (KeyCode::Down, ALT)],
        "Shift-Down",
        RoutingDown,
        "scroll the routing panel down (also Alt-Down)",
        ""
    ),
    bind!(Chat, [(KeyCode::Char('n'), CTRL)], "Ctrl-N", NewChat, "new conversation (the cache stays warm)", ""),
    bind!(
        Chat,
        [(KeyCode::F(1), NONE), (KeyCode::Char('?'), NONE)],
        "? / F1",
        Help,
        "this help (? when the message box is empty)",
        "help"
    ),
    bind!(
        Help,
        [(KeyCode::Esc, NONE), (KeyCode::Char('?'), NONE), (KeyCode::F(1), NONE), (KeyCode::Char('q'), NONE)],
        "Esc",
        Close,
        "close help",
        "close"
    ),
    bind!(Help, [(KeyCode::Up, NONE)], "Up", Prev, "scroll help up", ""),
    bind!(Help, [(KeyCode::Down, NONE)], "Down", Next, "scroll help down", "scroll"),
    bind!(Settings, [(KeyCode::Up, NONE)], "Up", Prev, "previous setting", "up"),
    bind!(Settings, [(KeyCode::Down, NONE)], "Down", Next, "next setting", "down"),
    bind!(Settings, [(KeyCode::Enter, NONE)], "Enter", Enter, "edit the selected setting", "edit"),
    bind!(Settings, [(KeyCode::Esc, NONE), (KeyCode::F(2), NONE)], "Esc", Close, "close settings", "close"),
    bind!(SettingEdit, [(KeyCode::Enter, NONE)], "Enter", Enter, "apply the new value", "apply"),
    bind!(SettingEdit, [(KeyCode::Esc, NONE)], "Esc", Close, "cancel the edit", "cancel"),
];

/// The action `key` triggers in `context` (or globally).
pub fn action(context: Context, key: &KeyEvent) -> Option<Action> {
    // Shifted characters arrive with SHIFT on some terminals and without on others.
    let mods = match key.code {
        KeyCode::Char(_) => key.modifiers - KeyModifiers::SHIFT,
        _ => key.modifiers,
    };
    KEYMAP
        .iter()
        .filter(|b| b.context == context || b.context == Context::Global)
        .find(|b| b.keys.iter().any(|&(code, m)| code == key.code && m == mods))
        .map(|b| b.action)
}

/// The bindings hinted on the bottom line in `context`: its own, then the
/// global ones.
pub fn hints(context: Context) -> impl Iterator<Item = &'static Binding> {
    let of = move |ctx: Context| KEYMAP.iter().filter(move |b| !b.hint.is_empty() && b.context == ctx);
    of(context).chain(of(Context::Global))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_key_is_bound_twice_in_one_context() {
        for (i, a) in KEYMAP.iter().enumerate() {
            for b in &KEYMAP[i + 1..] {
                let overlap = a.context == b.context || a.context == Context::Global || b.context == Context::Global;
                for k in a.keys {
                    assert!(!(overlap && b.keys.contains(k)), "{:?} bound to {} and {}", k, a.label, b.label);
                }
            }
        }
    }

    #[test]
    fn keys_map_to_their_actions() {
        let key = |code, mods| KeyEvent::new(code, mods);
        assert_eq!(action(Context::Chat, &key(KeyCode::Esc, NONE)), Some(Action::Stop));
        assert_eq!(action(Context::Help, &key(KeyCode::Esc, NONE)), Some(Action::Close));
        assert_eq!(action(Context::Settings, &key(KeyCode::Char('c'), CTRL)), Some(Action::Quit));
        assert_eq!(action(Context::Chat, &key(KeyCode::Char('?'), SHIFT)), Some(Action::Help));
        assert_eq!(action(Context::Chat, &key(KeyCode::Char('a'), NONE)), None);
    }
}
