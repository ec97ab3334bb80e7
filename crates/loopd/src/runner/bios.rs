//! The BIOS: the first system message of every generation, written by a provider.
//!
//! The runner asks its [`BiosProvider`] for the message before each generation, so the text
//! can say what changed (the tool iterations left). The messages sent are always ordered
//! BIOS, then the caller's system message, then the conversation.

use crate::llama::ToolSchema;

/// What the BIOS may state.
#[derive(Debug, Clone, Copy)]
pub struct BiosContext<'a> {
    /// Tool iterations left.
    pub budget_left: u32,
    /// Tool iterations the request started with.
    pub budget: u32,
    /// Iterations done so far (0 before the first).
    pub iterations: u32,
    /// The tools offered, exit tools included.
    pub tools: &'a [ToolSchema],
    /// The names of the exit tools.
    pub exit_tools: &'a [String],
}

/// Writes the BIOS system message.
pub trait BiosProvider: Send + Sync {
    /// The BIOS text for the next generation.
    fn bios(&self, ctx: &BiosContext<'_>) -> String;
}

/// The BIOS `loopd run` uses: who the model is, how tools work, and the iterations left.
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
            "\nTool iterations left: {} of {}.",
            ctx.budget_left, ctx.budget
        ));
        if ctx.budget_left == 0 {
            s.push_str(" Do not call tools any more; answer now.");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_bios_states_the_budget_left_and_the_exit_tools() {
        let exits = vec!["finish".to_string()];
        let ctx = |left| BiosContext {
            budget_left: left,
            budget: 3,
            iterations: 3 - left,
            tools: &[],
            exit_tools: &exits,
        };
        let b = StandardBios.bios(&ctx(2));
        assert!(
            b.ends_with("Signal tools (free, no result): finish.\nTool iterations left: 2 of 3.")
        );
        assert_eq!(
            StandardBios.bios(&ctx(0)).lines().last(),
            Some("Tool iterations left: 0 of 3. Do not call tools any more; answer now.")
        );
        // Only the last line changes with the budget.
        let (a, b) = (StandardBios.bios(&ctx(3)), StandardBios.bios(&ctx(1)));
        assert_eq!(a.lines().next(), b.lines().next());
    }
}
