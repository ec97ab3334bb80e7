//! The `[runner]` section (`loopd_agent::runner::RunnerConfig`) as the file gives it: its
//! keys, its checks and the defaults that follow `[limits]`, read through the whole file.

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{Config, ConfigError};
    use loopd_agent::runner::RunnerConfig;

    fn parse(runner: &str) -> Result<Config, ConfigError> {
        let text = format!("socket = \"/run/infer.sock\"\nmodel = \"m\"\n{runner}");
        Config::parse(Path::new("/etc/loopd.toml"), &text)
    }

    #[test]
    fn runner_defaults_and_every_key() {
        let c = parse("").unwrap();
        assert_eq!(c.runner, RunnerConfig::default());
        assert_eq!(
            (c.runner.budget, c.runner.tool_timeout_ms, c.runner.stall_ms),
            (8, 10_000, 30_000)
        );
        assert_eq!(c.runner.loop_detector.medium_repeats, 8);
        let c = parse(
            "[runner]\nbudget = 2\nslots = 4\ntool_timeout_ms = 5\nworker_socket = \"/run/w.sock\"\n\
             worker_poll_ms = 7\nworker_timeout_ms = 9\nstall_ms = 11\ndeath_grace_ms = 0\n\
             [runner.loop_detector]\nmedium_from = 10\nlong_from = 40\nshort_repeats = 30\n\
             medium_repeats = 6\nlong_repeats = 3\nsentence_ends_line = false\n",
        )
        .unwrap();
        let r = c.runner;
        assert_eq!((r.budget, r.slots, r.tool_timeout_ms), (2, 4, 5));
        assert_eq!(r.worker_socket.as_deref(), Some(Path::new("/run/w.sock")));
        assert_eq!(
            (r.worker_poll_ms, r.worker_timeout_ms, r.stall_ms),
            (7, 9, 11)
        );
        assert_eq!(r.death_grace_ms, 0, "0 is allowed: at once");
        let l = r.loop_detector;
        assert_eq!(
            (
                l.medium_from,
                l.long_from,
                l.short_repeats,
                l.medium_repeats,
                l.long_repeats
            ),
            (10, 40, 30, 6, 3)
        );
        assert!(!l.sentence_ends_line);
        assert!(parse("").unwrap().runner.loop_detector.sentence_ends_line);
    }

    #[test]
    fn the_kv_table_and_its_defaults() {
        let kv = parse("").unwrap().runner.kv;
        assert_eq!((kv.dir, kv.max_bytes, kv.min_tokens), (None, 4 << 30, 256));
        let kv = parse("[runner.kv]\ndir = \"/var/lib/llama/kv\"\nmax_bytes = 1\nmin_tokens = 0\n")
            .unwrap()
            .runner
            .kv;
        assert_eq!(kv.dir.as_deref(), Some(Path::new("/var/lib/llama/kv")));
        assert_eq!((kv.max_bytes, kv.min_tokens), (1, 0));
        let e = parse("[runner.kv]\nmax_bytes = 0\n").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (4, "runner.kv.max_bytes"));
        assert_eq!(e.message, "must be at least 1");
        assert!(parse("[runner.kv]\nsize = 1\n").is_err());
    }

    #[test]
    fn bad_runner_values_name_their_key_and_line() {
        let e = parse("[runner]\nbudget = 1\nstall_ms = 0\n").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (5, "runner.stall_ms"));
        assert_eq!(e.message, "must be at least 1 ms");
        let e = parse("[runner.loop_detector]\nlong_repeats = 1\n").unwrap_err();
        assert_eq!(
            (e.line, e.key.as_str()),
            (4, "runner.loop_detector.long_repeats")
        );
        assert!(parse("[runner.loop_detector]\nlong_repeats = 2\n").is_ok());
        let e = parse("[runner.loop_detector]\nmedium_from = 20\nlong_from = 19\n").unwrap_err();
        assert_eq!(
            (e.line, e.key.as_str()),
            (4, "runner.loop_detector.medium_from")
        );
        let e = parse("[runner]\nbudgett = 1\n").unwrap_err();
        assert_eq!(e.key, "runner.budgett");
        let e = parse("[runner]\nbudget = -1\n").unwrap_err();
        assert_eq!(e.key, "runner.budget");
    }

    #[test]
    fn stall_ms_left_out_follows_limits_liveness_ms() {
        let c = parse("[limits]\nliveness_ms = 3000\n").unwrap();
        assert_eq!((c.limits.liveness_ms, c.runner.stall_ms), (3_000, 3_000));
        let c = parse("[limits]\nliveness_ms = 120000\n").unwrap();
        assert_eq!(c.runner.stall_ms, 120_000);
        assert_eq!(parse("").unwrap().runner.stall_ms, 30_000);
        let c = parse("[limits]\nliveness_ms = 3000\n[runner]\nstall_ms = 1000\n").unwrap();
        assert_eq!(c.runner.stall_ms, 1_000, "a value written is kept");
    }

    #[test]
    fn stall_ms_written_past_liveness_is_refused_at_one_past() {
        let at = parse("[limits]\nliveness_ms = 3000\n[runner]\nstall_ms = 3000\n").unwrap();
        assert_eq!(at.runner.stall_ms, 3_000);
        let e = parse("[limits]\nliveness_ms = 3000\n[runner]\nbudget = 2\nstall_ms = 3001\n")
            .unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (7, "runner.stall_ms"));
        assert_eq!(
            e.message,
            "3001 is greater than limits.liveness_ms (3000): the client would end the \
             generation as stalled before the stall report was due; lower runner.stall_ms to \
             at most 3000 (or leave it out to follow limits.liveness_ms), or raise \
             limits.liveness_ms to at least 3001"
        );
        // Against liveness_ms's default: still the written key is the one named.
        assert!(parse("[runner]\nstall_ms = 30000\n").is_ok());
        let e = parse("[runner]\nstall_ms = 30001\n").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (4, "runner.stall_ms"));
        assert!(e.to_string().starts_with(
            "/etc/loopd.toml:4: key `runner.stall_ms`: 30001 is greater than \
             limits.liveness_ms (30000): "
        ));
    }

    #[test]
    fn a_loop_tier_left_out_follows_the_one_written() {
        let l = parse("[runner.loop_detector]\nlong_from = 10\n")
            .unwrap()
            .runner
            .loop_detector;
        assert_eq!((l.medium_from, l.long_from), (10, 10));
        let l = parse("[runner.loop_detector]\nlong_from = 17\n")
            .unwrap()
            .runner
            .loop_detector;
        assert_eq!(
            (l.medium_from, l.long_from),
            (16, 17),
            "no contradiction: kept"
        );
        let l = parse("[runner.loop_detector]\nmedium_from = 65\n")
            .unwrap()
            .runner
            .loop_detector;
        assert_eq!((l.medium_from, l.long_from), (65, 65));
        let l = parse("[runner.loop_detector]\nmedium_from = 8\n")
            .unwrap()
            .runner
            .loop_detector;
        assert_eq!((l.medium_from, l.long_from), (8, 64));
        // Both written: at the limit accepted, one past refused.
        let both = "[runner.loop_detector]\nmedium_from = 20\nlong_from = 20\n";
        assert!(parse(both).is_ok());
        let past = "[runner.loop_detector]\nmedium_from = 21\nlong_from = 20\n";
        assert_eq!(
            parse(past).unwrap_err().key,
            "runner.loop_detector.medium_from"
        );
    }
}
