//! Medians, and the whole path's three goals (docs/benchmarks/e2e.md) judged on them.

/// The median of `xs` (the mean of the two middle values when the count is even); `None` when
/// empty. NaNs sort last.
pub fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The most the daemon's cost (wall minus compute) may exceed inferproxy's alone, in ms.
pub const DAEMON_OVER_PROXY_MS: f64 = 2.0;
/// The most the daemon's first token may come after the direct path's, in ms.
pub const FIRST_TOKEN_OVER_DIRECT_MS: f64 = 2.0;
/// The least the daemon's pair may reach of the direct pair's tokens/s.
pub const PAIR_RATIO: f64 = 0.98;

/// One goal: what it asks, the figure, and whether it is met.
#[derive(Debug, Clone, PartialEq)]
pub struct Goal {
    /// What the goal asks, in words.
    pub what: &'static str,
    /// The measured figure, in words.
    pub figure: String,
    /// Whether the figure meets the goal.
    pub met: bool,
}

/// The medians of one run that the goals are judged on, in ms and tokens/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Medians {
    /// Wall minus compute through inferproxy.
    pub proxy_cost: f64,
    /// Wall minus compute through `loopd serve`.
    pub daemon_cost: f64,
    /// First token, direct.
    pub direct_first: f64,
    /// First token through `loopd serve`.
    pub daemon_first: f64,
    /// Two clients at once, direct, tokens/s.
    pub direct_pair: f64,
    /// Two clients at once through `loopd serve`, tokens/s.
    pub daemon_pair: f64,
}

/// The three goals: the daemon's cost over inferproxy's, the first token over direct, two
/// clients against the direct pair.
pub fn goals(m: &Medians) -> [Goal; 3] {
    let cost = m.daemon_cost - m.proxy_cost;
    let first = m.daemon_first - m.direct_first;
    let ratio = m.daemon_pair / m.direct_pair;
    [
        Goal {
            what: "the daemon's cost within 2 ms of inferproxy's alone",
            figure: format!("{cost:+.2} ms"),
            met: cost <= DAEMON_OVER_PROXY_MS,
        },
        Goal {
            what: "first token within 2 ms of direct",
            figure: format!("{first:+.2} ms"),
            met: first <= FIRST_TOKEN_OVER_DIRECT_MS,
        },
        Goal {
            what: "two clients >= 0.98x the direct pair",
            figure: format!("{ratio:.3}x"),
            met: ratio >= PAIR_RATIO,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    fn at(cost: f64, first: f64, pair: f64) -> Medians {
        Medians {
            proxy_cost: 7.0,
            daemon_cost: 7.0 + cost,
            direct_first: 27.0,
            daemon_first: 27.0 + first,
            direct_pair: 100.0,
            daemon_pair: pair,
        }
    }

    /// Each goal met at its limit and missed one step past it.
    #[test]
    fn goals_at_the_limit_and_past_it() {
        let met = |m: Medians| goals(&m).map(|g| g.met);
        assert_eq!(met(at(2.0, 2.0, 98.0)), [true, true, true]);
        assert_eq!(met(at(2.25, 2.0, 98.0)), [false, true, true]);
        assert_eq!(met(at(2.0, 2.25, 98.0)), [true, false, true]);
        assert_eq!(met(at(2.0, 2.0, 97.5)), [true, true, false]);
        let g = goals(&at(3.5, -1.0, 99.0));
        assert_eq!(g[0].figure, "+3.50 ms");
        assert_eq!(g[1].figure, "-1.00 ms");
        assert_eq!(g[2].figure, "0.990x");
    }
}
