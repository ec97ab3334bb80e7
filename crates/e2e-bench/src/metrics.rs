//! The server's compute time for a request the bench did not read itself: from llama-server's
//! `/metrics` (started with `metrics = true` in its preset), scraped just before and just after
//! the request, outside the timed window.
//!
//! `loopd serve` does not pass the final chunk's `timings` on to its clients (its result has
//! the token counts, not the milliseconds), so on the daemon's path the milliseconds come from
//! here, and so they do on the other two, so that every path has its compute subtracted the same
//! way. The `_total` seconds counters are printed with six significant digits, too coarse once
//! they grow; the two throughput gauges are not: llama-server computes them over what happened
//! since the previous scrape and then starts them again (a second scrape reads 0), so the tokens
//! counted between two scrapes over the gauge give the time to six significant digits of itself.
//! Two details, seen on this build (b0a2feb64c6f): the generation gauge counts one token fewer
//! per request than `tokens_predicted_total` (the first token comes with the prompt), as the
//! stream's `predicted_per_second` does; and the prompt's time is not quite the stream's
//! `prompt_ms` (40.54 ms against 40.79 for one cached prompt token; 1,483.27 against 1,484.20
//! for 19). The bench prints how far the two are apart on the paths that have both.

use std::fmt;

/// The values of one scrape that the compute time needs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Scrape {
    /// `llamacpp:prompt_tokens_total`: prompt tokens evaluated (cached ones excluded).
    pub prompt_tokens: f64,
    /// `llamacpp:tokens_predicted_total`.
    pub predicted_tokens: f64,
    /// `llamacpp:prompt_tokens_seconds`: prompt tokens per second since the previous scrape.
    pub prompt_rate: f64,
    /// `llamacpp:predicted_tokens_seconds`: generated tokens per second since the previous scrape.
    pub predicted_rate: f64,
}

/// A metric the compute time needs is missing from a scrape, or not a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingMetric(pub &'static str);

impl fmt::Display for MissingMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "llama-server's /metrics has no number for {} (is `metrics = true` in the preset?)",
            self.0
        )
    }
}

impl std::error::Error for MissingMetric {}

const PROMPT_TOKENS: &str = "llamacpp:prompt_tokens_total";
const PREDICTED_TOKENS: &str = "llamacpp:tokens_predicted_total";
const PROMPT_RATE: &str = "llamacpp:prompt_tokens_seconds";
const PREDICTED_RATE: &str = "llamacpp:predicted_tokens_seconds";

impl Scrape {
    /// Reads the four values from the Prometheus text `/metrics` returns.
    pub fn parse(text: &str) -> Result<Scrape, MissingMetric> {
        let value = |name: &'static str| {
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .find_map(|l| {
                    let (n, v) = l.split_once(' ')?;
                    (n == name).then(|| v.trim().parse::<f64>().ok()).flatten()
                })
                .ok_or(MissingMetric(name))
        };
        Ok(Scrape {
            prompt_tokens: value(PROMPT_TOKENS)?,
            predicted_tokens: value(PREDICTED_TOKENS)?,
            prompt_rate: value(PROMPT_RATE)?,
            predicted_rate: value(PREDICTED_RATE)?,
        })
    }

    /// The server's compute time in ms (prompt plus generation) of the one request that ran
    /// between `before` and this scrape, taken just after it: the tokens counted in between
    /// over the rates this scrape reports for the same interval (the generation's less the
    /// first token, which the gauge does not count).
    pub fn compute_ms_since(&self, before: &Scrape) -> f64 {
        let ms = |tokens: f64, rate: f64| {
            if tokens > 0.0 && rate > 0.0 {
                tokens / rate * 1e3
            } else {
                0.0
            }
        };
        let generated = self.predicted_tokens - before.predicted_tokens;
        ms(self.prompt_tokens - before.prompt_tokens, self.prompt_rate)
            + ms(generated - 1.0, self.predicted_rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 120
llamacpp:prompt_tokens_cached_total 900
llamacpp:prompt_seconds_total 2.53997
llamacpp:tokens_predicted_total 640
llamacpp:tokens_predicted_seconds_total 13.7396
llamacpp:prompt_tokens_seconds 7.47898
llamacpp:predicted_tokens_seconds 46.5807
";

    const AFTER: &str = "llamacpp:prompt_tokens_total 121
llamacpp:tokens_predicted_total 704
llamacpp:prompt_tokens_seconds 80
llamacpp:predicted_tokens_seconds 126
";

    #[test]
    fn parses_the_four_values() {
        assert_eq!(
            Scrape::parse(BEFORE),
            Ok(Scrape {
                prompt_tokens: 120.0,
                predicted_tokens: 640.0,
                prompt_rate: 7.47898,
                predicted_rate: 46.5807,
            })
        );
    }

    /// One prompt token at 80/s is 12.5 ms; 64 generated, of which the gauge counts 63, at
    /// 126/s are 500 ms.
    #[test]
    fn compute_is_tokens_over_rate() {
        let before = Scrape::parse(BEFORE).unwrap();
        let after = Scrape::parse(AFTER).unwrap();
        assert_eq!(after.compute_ms_since(&before), 512.5);
    }

    /// The scrapes around one request to this build's server, with the stream's own figures:
    /// 16 tokens generated in 1,414.293 ms (`predicted_per_second` 10.60600596906016), 19
    /// prompt tokens in 1,484.196 ms; the gauge gives the generation's time to 0.01 ms and the
    /// prompt's about 1 ms short.
    #[test]
    fn recorded_scrapes_against_the_stream() {
        let zero = Scrape::default();
        let after = Scrape::parse(
            "llamacpp:prompt_tokens_total 19\nllamacpp:tokens_predicted_total 16\n\
             llamacpp:prompt_tokens_seconds 12.8095\nllamacpp:predicted_tokens_seconds 10.606\n",
        )
        .unwrap();
        let generation = after.compute_ms_since(&Scrape {
            prompt_tokens: 19.0,
            ..zero
        });
        assert!((generation - 1414.293).abs() < 0.01, "{generation}");
        let prompt = after.compute_ms_since(&zero) - generation;
        assert!((prompt - 1483.27).abs() < 0.01, "{prompt}");
    }

    /// Nothing evaluated: the gauges are 0 (what a second scrape reads), and so is the time.
    #[test]
    fn nothing_counted_is_no_time() {
        let s = Scrape::parse(AFTER).unwrap();
        let idle = Scrape {
            prompt_rate: 0.0,
            predicted_rate: 0.0,
            ..s
        };
        assert_eq!(idle.compute_ms_since(&s), 0.0);
    }

    #[test]
    fn a_missing_metric_is_named() {
        assert_eq!(
            Scrape::parse("llamacpp:prompt_tokens_total 1\n"),
            Err(MissingMetric("llamacpp:tokens_predicted_total"))
        );
        assert_eq!(
            Scrape::parse(&AFTER.replace("126\n", "nan?\n")),
            Err(MissingMetric("llamacpp:predicted_tokens_seconds"))
        );
    }
}
