//! Front ends: they sit on the session host, consume its events and send it
//! commands; none reaches into the engine.

pub mod chat;
pub mod repl;
