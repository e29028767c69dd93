//! How a reply ended: the reason as the OpenAI API names it, and what a
//! reply that ran out of tokens left open (its reasoning, a tool call, a
//! constrained output), so front ends can say so instead of showing a
//! silently truncated result.

use std::fmt;

/// Why a generation ended, as OpenAI's `finish_reason` names it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FinishReason {
    /// The model ended it (an end-of-generation token; a completed
    /// constrained output).
    #[default]
    Stop,
    /// It ran out of tokens: `-n` (`generate.n_predict`) or the context.
    Length,
    /// The reply called tools.
    ToolCalls,
    /// Stopped by the user (Esc, Ctrl-C, an abort).
    Aborted,
}

impl FinishReason {
    /// `stop`, `length`, `tool_calls` or `aborted`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::Aborted => "aborted",
        }
    }
}

/// What a generation that ran out of tokens left unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Its reasoning block: no answer was written.
    Reasoning,
    /// A tool call it had begun.
    ToolCall,
    /// The output a grammar or JSON schema constrains.
    Constrained,
}

/// Which limit ended a generation that ran out of tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The token limit (`-n`, `generate.n_predict`).
    Predict,
    /// The room left in the context.
    Context,
}

/// How a generation ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ending {
    /// Why it ended.
    pub reason: FinishReason,
    /// What it left open, when it ran out of tokens inside something.
    pub cut: Option<Cut>,
    /// The limit it ran into, when it ran out of tokens.
    pub limit: Option<Limit>,
    /// Tokens generated.
    pub tokens: usize,
}

impl Ending {
    /// The ending of a generation of `tokens` tokens that `stopped` itself
    /// (an end-of-generation token) or was `aborted`, with `calls` complete
    /// tool calls in it, `n_predict` the token limit it ran under and
    /// `open` what was unfinished at its end.
    pub fn new(tokens: usize, stopped: bool, aborted: bool, calls: usize, n_predict: u32, open: Option<Cut>) -> Ending {
        let reason = if calls > 0 {
            FinishReason::ToolCalls
        } else if aborted {
            FinishReason::Aborted
        } else if stopped {
            FinishReason::Stop
        } else {
            FinishReason::Length
        };
        let ran_out = reason == FinishReason::Length;
        let limit = ran_out.then_some(if tokens >= n_predict as usize { Limit::Predict } else { Limit::Context });
        Ending { reason, cut: open.filter(|_| ran_out), limit, tokens }
    }

    /// One line saying the reply was cut off, where (inside its reasoning,
    /// a tool call or the constrained output, when so) and by which limit,
    /// for a generation that ran out of tokens (`None` otherwise).
    pub fn cut_notice(&self) -> Option<String> {
        Some(format!("{}", CutNotice { cut: self.cut, limit: self.limit?, tokens: self.tokens }))
    }
}

struct CutNotice {
    cut: Option<Cut>,
    limit: Limit,
    tokens: usize,
}

impl fmt::Display for CutNotice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.cut {
            Some(Cut::Reasoning) => " inside its reasoning, before any answer",
            Some(Cut::ToolCall) => " inside a tool call, which is incomplete and was not made",
            Some(Cut::Constrained) => " before the constrained output (grammar or JSON schema) was complete",
            None => "",
        };
        let limit = match self.limit {
            Limit::Predict => "the token limit; raise -n (generate.n_predict)",
            Limit::Context => "the end of the context; raise -c (generate.ctx_size) or start a new conversation",
        };
        write!(f, "the reply was cut off at {} tokens{what}: it ran into {limit}", self.tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_and_cuts() {
        let e = Ending::new(24, false, false, 0, 24, Some(Cut::ToolCall));
        assert_eq!((e.reason, e.limit), (FinishReason::Length, Some(Limit::Predict)));
        let notice = e.cut_notice().unwrap();
        assert!(notice.contains("24 tokens") && notice.contains("tool call") && notice.contains("-n"), "{notice}");
        // Cut by the context, not -n.
        let e = Ending::new(10, false, false, 0, 64, Some(Cut::Reasoning));
        assert!(e.cut_notice().unwrap().contains("end of the context"));
        // An ending the model chose cuts nothing, whatever was open.
        let e = Ending::new(5, true, false, 0, 64, Some(Cut::Constrained));
        assert_eq!((e.reason, e.cut_notice()), (FinishReason::Stop, None));
        assert_eq!(Ending::new(5, true, false, 2, 64, None).reason.as_str(), "tool_calls");
        assert_eq!(Ending::new(5, false, true, 0, 64, Some(Cut::Reasoning)).reason, FinishReason::Aborted);
        // A plain answer cut by a limit is said to be cut too; one the model ended is not.
        let plain = Ending::new(64, false, false, 0, 64, None).cut_notice().unwrap();
        assert!(plain.starts_with("the reply was cut off at 64 tokens: it ran into the token limit"), "{plain}");
        let by_context = Ending::new(30, false, false, 0, u32::MAX, None).cut_notice().unwrap();
        assert!(by_context.contains("end of the context"), "{by_context}");
        assert_eq!(Ending::new(64, true, false, 0, 64, None).cut_notice(), None);
    }
}
