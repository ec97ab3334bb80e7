//! The BIOS: the first system message of every generation, written by a provider once per
//! request, and the note that tells the model its budget.
//!
//! The BIOS is the first message, so anything that changed in it would make the server
//! evaluate the whole prompt again (with the project's template the tool definitions sit in
//! it too): on the local model a BIOS that stated the budget made generation 2 re-evaluate
//! 369 of 417 tokens, a fixed one 31 (docs/runner.md). So the runner asks its
//! [`BiosProvider`] for the BIOS once, when the request starts, and sends it unchanged; what
//! changes, the tool iterations left, goes in a [`budget_note`](BiosProvider::budget_note)
//! appended to the newest tool result, which the model reads next and which is new to the
//! cache anyway. The messages sent are always ordered BIOS, then the caller's system message,
//! then the conversation.

use loopd_client::llama::ToolSchema;

/// What the BIOS and the budget note may state.
#[derive(Debug, Clone, Copy)]
pub struct BiosContext<'a> {
    /// Tool iterations left (for the BIOS: the whole budget).
    pub budget_left: u32,
    /// Tool iterations the request started with.
    pub budget: u32,
    /// Iterations done so far (for the BIOS: 0).
    pub iterations: u32,
    /// The tools offered, exit tools included.
    pub tools: &'a [ToolSchema],
    /// The names of the exit tools.
    pub exit_tools: &'a [String],
}

/// Writes the BIOS system message and the budget note.
pub trait BiosProvider: Send + Sync {
    /// The BIOS text, asked for once when the request starts and sent unchanged at the top
    /// of every generation.
    fn bios(&self, ctx: &BiosContext<'_>) -> String;

    /// A note appended to the newest tool result after each iteration (after a blank line),
    /// where it costs the prompt cache nothing; `None` adds nothing (the default).
    fn budget_note(&self, ctx: &BiosContext<'_>) -> Option<String> {
        let _ = ctx;
        None
    }
}

/// The BIOS `loopd run` uses: who the model is, how tools work and the budget it started
/// with; the note after each iteration says how many iterations are left.
#[derive(Debug, Clone, Default)]
pub struct StandardBios;

impl BiosProvider for StandardBios {
    fn bios(&self, ctx: &BiosContext<'_>) -> String {
        let mut s = String::from(
            "You are an agent. You may call tools; each message in which you call tools is one \
             tool iteration, however many calls it holds. Call tools only when you need them, \
             then answer.",
        );
        if !ctx.exit_tools.is_empty() {
            s.push_str(&format!(
                " Signal tools (free, no result): {}.",
                ctx.exit_tools.join(", ")
            ));
        }
        s.push_str(&format!(
            "\nYou have {} tool iterations; the last tool result of each says how many are left.",
            ctx.budget
        ));
        s
    }

    fn budget_note(&self, ctx: &BiosContext<'_>) -> Option<String> {
        let mut s = format!(
            "[Tool iterations left: {} of {}.",
            ctx.budget_left, ctx.budget
        );
        if ctx.budget_left == 0 {
            s.push_str(" Do not call tools any more; answer now.");
        }
        s.push(']');
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_bios_is_fixed_and_the_note_states_the_budget_left() {
        let exits = vec!["finish".to_string()];
        let ctx = |left| BiosContext {
            budget_left: left,
            budget: 3,
            iterations: 3 - left,
            tools: &[],
            exit_tools: &exits,
        };
        let b = StandardBios.bios(&ctx(3));
        assert!(b.ends_with(
            "Signal tools (free, no result): finish.\nYou have 3 tool iterations; the last tool \
             result of each says how many are left."
        ));
        assert_eq!(
            StandardBios.bios(&ctx(1)),
            b,
            "nothing in it changes with the budget"
        );
        assert_eq!(
            StandardBios.budget_note(&ctx(2)).as_deref(),
            Some("[Tool iterations left: 2 of 3.]")
        );
        assert_eq!(
            StandardBios.budget_note(&ctx(0)).as_deref(),
            Some("[Tool iterations left: 0 of 3. Do not call tools any more; answer now.]")
        );
    }
}
