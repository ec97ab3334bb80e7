//! `loopd ask`: one request through the whole client, shown as a person wants to watch it.
//!
//! On a terminal: a progress bar while the prompt is processed, the reasoning dimmed (not with
//! `NO_COLOR` set and non-empty, <https://no-color.org>), the answer plain, notices on their own
//! lines. Anywhere else: the same in plain text, with the reasoning and the answer under
//! `[reasoning]` and `[answer]` headers and no control characters. A generation that ended
//! inside its reasoning, with no answer, says so before its finish line.

use std::ffi::OsStr;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use loopd_client::clock::{Clock, SystemClock};
use loopd_client::llama::{ChatEvent, Completion, FinishReason};

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";
const BAR_WIDTH: u64 = 30;

/// Which part of the output the last text belonged to, so headers and colours switch once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    None,
    Progress,
    Reasoning,
    Answer,
    Notice,
}

/// Renders [`ChatEvent`]s and the final [`Completion`] to a writer.
pub struct Watcher<W: Write> {
    out: W,
    terminal: bool,
    /// Whether the reasoning is dimmed: on a terminal, unless `NO_COLOR` says no.
    colour: bool,
    /// The first write that failed (a closed stdout): nothing more is written after it.
    error: Option<std::io::Error>,
    part: Part,
    /// Where the time to the first token and the speed are read.
    clock: Arc<dyn Clock>,
    first_token: Option<Duration>,
    /// The waiting line last shown (`slot_busy`), so each poll does not repeat it.
    waiting: Option<bool>,
}

impl<W: Write> Watcher<W> {
    /// A watcher writing to `out`; `terminal` turns on the bar and, unless the environment's
    /// `NO_COLOR` is set and non-empty, the colours. It times the answer on the system clock
    /// until [`on_clock`](Self::on_clock) says otherwise.
    pub fn new(out: W, terminal: bool) -> Self {
        let colour = terminal && colour_allowed(std::env::var_os("NO_COLOR").as_deref());
        Watcher {
            out,
            terminal,
            colour,
            error: None,
            part: Part::None,
            clock: Arc::new(SystemClock::new()),
            first_token: None,
            waiting: None,
        }
    }

    /// The same watcher with colours on or off (`NO_COLOR`); off, a terminal gets the plain
    /// text's headers and keeps its progress bar.
    pub fn with_colour(mut self, colour: bool) -> Self {
        self.colour = colour && self.terminal;
        self
    }

    /// The same watcher timing the answer on `clock` (the client's).
    pub fn on_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Notes the first token's time, once.
    fn first_token(&mut self) {
        if self.first_token.is_none() {
            self.first_token = Some(self.clock.now());
        }
    }

    /// The writer back (tests read what was written).
    #[cfg(test)]
    pub fn into_inner(self) -> W {
        self.out
    }

    /// Shows one event. The request goes on if stdout closes: the first write error is kept
    /// for [`write_error`](Self::write_error) and nothing more is written.
    pub fn event(&mut self, ev: &ChatEvent) {
        if self.error.is_none() {
            if let Err(e) = self.try_event(ev) {
                self.error = Some(e);
            }
        }
    }

    /// The first write that failed, if one did.
    pub fn write_error(&mut self) -> Option<std::io::Error> {
        self.error.take()
    }

    /// Ends whatever was streaming with a newline (before an error is said on stderr).
    pub fn end_line(&mut self) {
        if self.error.is_none() && self.part != Part::None {
            if let Err(e) = self.switch(Part::None) {
                self.error = Some(e);
            }
        }
    }

    fn try_event(&mut self, ev: &ChatEvent) -> std::io::Result<()> {
        let shown = self.waiting.take();
        match ev {
            ChatEvent::Queued { ahead } => self.notice(&format!("queued: {ahead} ahead")),
            // Said once while `/slots` keeps saying the same; the exchange says nothing idle.
            ChatEvent::Waiting { slot_busy } => {
                self.waiting = Some(*slot_busy);
                match (shown == Some(*slot_busy), slot_busy) {
                    (true, _) => Ok(()),
                    (false, true) => self.notice("waiting: the slot is busy with another request"),
                    (false, false) => {
                        self.notice("waiting: the server cannot say its slots (loading a model)")
                    }
                }
            }
            ChatEvent::Progress {
                total,
                cache,
                processed,
            } => self.progress(*total, *cache, *processed),
            ChatEvent::Reasoning(text) => {
                self.switch(Part::Reasoning)?;
                self.first_token();
                self.text(text)
            }
            ChatEvent::Content(text) => {
                self.switch(Part::Answer)?;
                self.first_token();
                self.text(text)
            }
            ChatEvent::ToolCallDelta {
                index,
                id,
                name,
                arguments,
            } => {
                if let Some(name) = name {
                    let id = id.as_deref().unwrap_or("");
                    self.notice(&format!("tool call {index}: {name} {id}"))?;
                    self.part = Part::Answer;
                }
                self.text(arguments)
            }
            ChatEvent::ThinkingCapped { tokens } => self.notice(&format!(
                "thinking capped after {tokens} tokens: asked the server to end reasoning"
            )),
            ChatEvent::Retrying {
                attempt,
                after_ms,
                error,
            } => self.notice(&format!(
                "retrying: attempt {attempt} in {:.1} s after: {error} (its output so far is dropped)",
                *after_ms as f64 / 1000.0
            )),
        }
    }

    /// Shows the end of the request: that it ended inside its reasoning if it did, then the
    /// finish reason, token counts and generation speed.
    pub fn finish(&mut self, done: &Completion) {
        if self.error.is_some() {
            return;
        }
        let m = &done.message;
        let said = |t: &Option<String>| t.as_deref().is_some_and(|t| !t.trim().is_empty());
        let in_reasoning =
            said(&m.reasoning_content) && !said(&m.content) && m.tool_calls.is_empty();
        if in_reasoning && done.finish_reason != FinishReason::ToolCalls {
            let notice = format!(
                "no answer: the generation ended inside its reasoning (finish_reason {}); more \
                 tokens (limits.max_tokens, limits.thinking_cap) or no --thinking may get one",
                done.finish_reason.as_str()
            );
            if let Err(e) = self.notice(&notice) {
                self.error = Some(e);
                return;
            }
        }
        let t = done.timings.unwrap_or_default();
        let speed = match self.first_token {
            Some(start) if t.predicted_n > 0 => {
                let secs = self
                    .clock
                    .now()
                    .saturating_sub(start)
                    .as_secs_f64()
                    .max(1e-3);
                format!(", {:.1} tokens/s", t.predicted_n as f64 / secs)
            }
            _ => String::new(),
        };
        let capped = if done.thinking_capped {
            ", thinking capped"
        } else {
            ""
        };
        let end = self.notice(&format!(
            "finish: {}; prompt {} tokens ({} from cache), generated {} ({} reasoning){speed}{capped}",
            done.finish_reason.as_str(),
            t.prompt_n.saturating_add(t.cache_n),
            t.cache_n,
            t.predicted_n,
            done.reasoning_tokens,
        ));
        if let Err(e) = end {
            self.error = Some(e);
        }
    }

    fn progress(&mut self, total: u64, cache: u64, processed: u64) -> std::io::Result<()> {
        if !self.terminal {
            return self.notice(&format!(
                "prompt: {processed}/{total} tokens ({cache} from cache)"
            ));
        }
        self.switch(Part::Progress)?;
        // In u128: the server's counts are any u64, and the product must not overflow.
        let filled = (u128::from(processed.min(total)) * u128::from(BAR_WIDTH))
            .checked_div(u128::from(total))
            .unwrap_or(0);
        let bar: String = (0..BAR_WIDTH)
            .map(|i| if u128::from(i) < filled { '#' } else { '.' })
            .collect();
        write!(
            self.out,
            "\rprompt [{bar}] {processed}/{total} tokens ({cache} cached)"
        )?;
        self.out.flush()
    }

    /// Model text, without the control characters that would drive the terminal.
    fn text(&mut self, text: &str) -> std::io::Result<()> {
        write!(self.out, "{}", Printable(text))?;
        self.out.flush()
    }

    /// A line of its own, after whatever was streaming.
    pub fn notice(&mut self, line: &str) -> std::io::Result<()> {
        self.switch(Part::Notice)?;
        writeln!(self.out, "{}", Printable(line))?;
        self.part = Part::None;
        self.out.flush()
    }

    /// Ends the current part and starts `next`: a newline, the colour, the plain-text header.
    fn switch(&mut self, next: Part) -> std::io::Result<()> {
        if self.part == next {
            return Ok(());
        }
        if self.colour && self.part == Part::Reasoning {
            write!(self.out, "{RESET}")?;
        }
        if self.part != Part::None {
            writeln!(self.out)?;
        }
        match (next, self.colour) {
            (Part::Reasoning, true) => write!(self.out, "{DIM}")?,
            (Part::Reasoning, false) => writeln!(self.out, "[reasoning]")?,
            (Part::Answer, false) => writeln!(self.out, "[answer]")?,
            _ => {}
        }
        self.part = next;
        Ok(())
    }
}

/// Whether colours may be used, given the environment's `NO_COLOR`: not when it is set and
/// non-empty (<https://no-color.org>).
pub fn colour_allowed(no_color: Option<&OsStr>) -> bool {
    no_color.is_none_or(OsStr::is_empty)
}

/// Text from the server as it may reach a terminal: control characters other than newline
/// and tab are dropped (an escape sequence in model output must not move the cursor, retitle
/// the window or change colours), so what is left of an escape sequence prints as plain text.
struct Printable<'a>(&'a str);

impl std::fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for piece in self
            .0
            .split(|c: char| c.is_control() && c != '\n' && c != '\t')
        {
            f.write_str(piece)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loopd_client::llama::{AssistantMessage, Timings};

    fn plain(events: &[ChatEvent]) -> String {
        let mut w = Watcher::new(Vec::new(), false);
        for e in events {
            w.event(e);
        }
        String::from_utf8(w.out).unwrap()
    }

    #[test]
    fn plain_text_sets_reasoning_and_answer_apart_without_control_characters() {
        let out = plain(&[
            ChatEvent::Queued { ahead: 1 },
            ChatEvent::Progress {
                total: 10,
                cache: 2,
                processed: 10,
            },
            ChatEvent::Reasoning("hm".into()),
            ChatEvent::Reasoning("m".into()),
            ChatEvent::ThinkingCapped { tokens: 7 },
            ChatEvent::Content("Blue".into()),
            ChatEvent::Content(".".into()),
        ]);
        assert_eq!(
            out,
            "queued: 1 ahead\nprompt: 10/10 tokens (2 from cache)\n[reasoning]\nhmm\n\
             thinking capped after 7 tokens: asked the server to end reasoning\n[answer]\nBlue."
        );
    }

    #[test]
    fn the_waiting_line_is_said_once_per_state_of_the_slot() {
        let busy = ChatEvent::Waiting { slot_busy: true };
        let loading = ChatEvent::Waiting { slot_busy: false };
        let out = plain(&[
            busy.clone(),
            busy.clone(),
            busy.clone(),
            loading.clone(),
            loading,
            busy.clone(),
            ChatEvent::Content("a".into()),
        ]);
        assert_eq!(
            out,
            "waiting: the slot is busy with another request\n\
             waiting: the server cannot say its slots (loading a model)\n\
             waiting: the slot is busy with another request\n[answer]\na"
        );
    }

    #[test]
    fn tool_calls_name_the_function_then_stream_arguments() {
        let out = plain(&[
            ChatEvent::ToolCallDelta {
                index: 0,
                id: Some("c1".into()),
                name: Some("get_weather".into()),
                arguments: "{\"ci".into(),
            },
            ChatEvent::ToolCallDelta {
                index: 0,
                id: None,
                name: None,
                arguments: "ty\": \"Paris\"}".into(),
            },
        ]);
        assert_eq!(out, "tool call 0: get_weather c1\n{\"city\": \"Paris\"}");
    }

    #[test]
    fn a_terminal_gets_a_bar_and_dimmed_reasoning() {
        let mut w = Watcher::new(Vec::new(), true).with_colour(true);
        w.event(&ChatEvent::Progress {
            total: 4,
            cache: 0,
            processed: 2,
        });
        w.event(&ChatEvent::Reasoning("r".into()));
        w.event(&ChatEvent::Content("a".into()));
        let out = String::from_utf8(w.out).unwrap();
        let bar = format!("[{}{}]", "#".repeat(15), ".".repeat(15));
        assert_eq!(
            out,
            format!("\rprompt {bar} 2/4 tokens (0 cached)\n{DIM}r{RESET}\na")
        );
    }

    #[test]
    fn no_color_keeps_the_bar_and_drops_every_colour_code_for_headers() {
        assert!(colour_allowed(None));
        assert!(colour_allowed(Some(OsStr::new(""))));
        assert!(!colour_allowed(Some(OsStr::new("1"))));
        assert!(!colour_allowed(Some(OsStr::new("0"))));
        let mut w = Watcher::new(Vec::new(), true).with_colour(false);
        w.event(&ChatEvent::Progress {
            total: 2,
            cache: 0,
            processed: 2,
        });
        w.event(&ChatEvent::Reasoning("r".into()));
        w.event(&ChatEvent::ThinkingCapped { tokens: 1 });
        w.event(&ChatEvent::Reasoning("s".into()));
        w.event(&ChatEvent::Content("a".into()));
        let bar = format!("[{}]", "#".repeat(30));
        assert_eq!(
            String::from_utf8(w.out).unwrap(),
            format!(
                "\rprompt {bar} 2/2 tokens (0 cached)\n[reasoning]\nr\nthinking capped after 1 \
                 tokens: asked the server to end reasoning\n[reasoning]\ns\n[answer]\na"
            )
        );
    }

    fn ended(content: Option<&str>, reasoning: Option<&str>, finish: FinishReason) -> String {
        let mut w = Watcher::new(Vec::new(), false);
        w.finish(&Completion {
            id: "x".into(),
            message: AssistantMessage {
                content: content.map(Into::into),
                reasoning_content: reasoning.map(Into::into),
                tool_calls: Vec::new(),
            },
            finish_reason: finish,
            timings: Some(Timings {
                cache_n: 0,
                prompt_n: 5,
                predicted_n: 9,
            }),
            reasoning_tokens: 9,
            thinking_capped: false,
        });
        String::from_utf8(w.out).unwrap()
    }

    #[test]
    fn a_generation_that_ended_inside_its_reasoning_says_so() {
        let notice = |r: &str| {
            format!(
                "no answer: the generation ended inside its reasoning (finish_reason {r}); more \
                 tokens (limits.max_tokens, limits.thinking_cap) or no --thinking may get one\n"
            )
        };
        let finish = |r: &str| {
            format!("finish: {r}; prompt 5 tokens (0 from cache), generated 9 (9 reasoning)\n")
        };
        for (reason, r) in [
            (FinishReason::Length, "length"),
            (FinishReason::Stop, "stop"),
        ] {
            for content in [None, Some(""), Some(" \n")] {
                assert_eq!(
                    ended(content, Some("hmm"), reason),
                    format!("{}{}", notice(r), finish(r)),
                    "{content:?}"
                );
            }
            // An answer, or no reasoning at all: nothing to say.
            assert_eq!(ended(Some("Blue."), Some("hmm"), reason), finish(r));
            assert_eq!(ended(None, None, reason), finish(r));
            assert_eq!(ended(None, Some(""), reason), finish(r));
        }
    }

    #[test]
    fn a_closed_stdout_stops_the_writes_and_is_kept() {
        struct Closed(usize);
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                self.0 += 1;
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut w = Watcher::new(Closed(0), false);
        w.event(&ChatEvent::Content("a".into()));
        w.event(&ChatEvent::Content("b".into()));
        w.end_line();
        assert_eq!(w.out.0, 1, "one write tried, none after it failed");
        assert_eq!(
            w.write_error().map(|e| e.kind()),
            Some(std::io::ErrorKind::BrokenPipe)
        );
    }

    #[test]
    fn control_characters_from_the_server_never_reach_the_terminal() {
        let hostile = "a\x1b]0;pwned\x07b\x1b[2Jc\r\u{9b}31md\u{7f}\n\te";
        for terminal in [false, true] {
            let mut w = Watcher::new(Vec::new(), terminal);
            w.event(&ChatEvent::Content(hostile.into()));
            w.event(&ChatEvent::ToolCallDelta {
                index: 0,
                id: Some("\x1b[1m".into()),
                name: Some("f\x1b[5m".into()),
                arguments: "{\x08}".into(),
            });
            w.event(&ChatEvent::Retrying {
                attempt: 2,
                after_ms: 2_000,
                error: "HTTP 500: \x1b[31mboom".into(),
            });
            let out = String::from_utf8(w.out).unwrap();
            let header = if terminal { "" } else { "[answer]\n" };
            assert_eq!(
                out,
                format!(
                    "{header}a]0;pwnedb[2Jc31md\n\te\ntool call 0: f[5m [1m\n{{}}\n\
                     retrying: attempt 2 in 2.0 s after: HTTP 500: [31mboom (its output so far is \
                     dropped)\n"
                )
            );
        }
    }

    #[test]
    fn huge_server_counts_neither_overflow_nor_panic() {
        let mut w = Watcher::new(Vec::new(), true);
        w.event(&ChatEvent::Progress {
            total: u64::MAX,
            cache: u64::MAX,
            processed: u64::MAX,
        });
        let mut w = Watcher::new(Vec::new(), false);
        w.finish(&Completion {
            id: "x".into(),
            message: Default::default(),
            finish_reason: FinishReason::Length,
            timings: Some(Timings {
                cache_n: u64::MAX,
                prompt_n: u64::MAX,
                predicted_n: u64::MAX,
            }),
            reasoning_tokens: u64::MAX,
            thinking_capped: false,
        });
        assert!(String::from_utf8(w.out)
            .unwrap()
            .starts_with(&format!("finish: length; prompt {} tokens", u64::MAX)));
    }

    #[test]
    fn the_end_line_names_the_finish_reason_and_counts() {
        let mut w = Watcher::new(Vec::new(), false);
        w.finish(&Completion {
            id: "x".into(),
            message: AssistantMessage {
                content: Some("a".into()),
                ..Default::default()
            },
            finish_reason: FinishReason::Stop,
            timings: Some(Timings {
                cache_n: 3,
                prompt_n: 4,
                predicted_n: 0,
            }),
            reasoning_tokens: 0,
            thinking_capped: false,
        });
        assert_eq!(
            String::from_utf8(w.out).unwrap(),
            "finish: stop; prompt 7 tokens (3 from cache), generated 0 (0 reasoning)\n"
        );
    }

    #[test]
    fn the_speed_is_timed_from_the_first_token_on_the_watchers_clock() {
        let clock = loopd_client::clock::FakeClock::new();
        let mut w = Watcher::new(Vec::new(), false).on_clock(Arc::new(clock.clone()));
        clock.advance(Duration::from_secs(7));
        w.event(&ChatEvent::Content("a".into()));
        clock.advance(Duration::from_secs(2));
        w.event(&ChatEvent::Content("b".into()));
        w.finish(&Completion {
            id: "x".into(),
            message: AssistantMessage::default(),
            finish_reason: FinishReason::Stop,
            timings: Some(Timings {
                cache_n: 0,
                prompt_n: 1,
                predicted_n: 10,
            }),
            reasoning_tokens: 0,
            thinking_capped: false,
        });
        let out = String::from_utf8(w.out).unwrap();
        assert!(out.ends_with(", 5.0 tokens/s\n"), "{out}");
    }
}
