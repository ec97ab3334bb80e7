//! Parser for one `/proc/<pid>/stat` line: pid, state, process group and CPU ticks.
//!
//! The second field, `comm`, is the executable name in parentheses and may itself hold spaces
//! and parentheses (a process can name itself `a) b`). The kernel never escapes it, so the only
//! sound split is at the LAST `)` of the line: everything after it is space-separated numbers.
//! Pure function over bytes; reading the file is the caller's business ([`crate::cpu`]).

use core::fmt;

/// The fields the liveness probe needs from one `/proc/<pid>/stat` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 1, the process id.
    pub pid: i32,
    /// Field 3, the state letter (`R`, `S`, `Z`, ...).
    pub state: u8,
    /// Field 5, the process group id.
    pub pgrp: i32,
    /// Field 14, user-mode CPU time in clock ticks.
    pub utime: u64,
    /// Field 15, kernel-mode CPU time in clock ticks.
    pub stime: u64,
}

impl ProcStat {
    /// `utime + stime`, saturating (a kernel counter near `u64::MAX` is not a reason to panic).
    pub fn cpu_ticks(&self) -> u64 {
        self.utime.saturating_add(self.stime)
    }

    /// True for a zombie (`Z`) or dead (`X`) entry: it holds no resources and runs nothing.
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, b'Z' | b'X')
    }
}

/// What was wrong with a stat line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StatError {
    /// No `(` before the command name.
    NoOpenParen,
    /// No `)` after the command name.
    NoCloseParen,
    /// The line ended before the named field (1-based, as in `man 5 proc`).
    MissingField(u8),
    /// The named field (1-based) is not a decimal number that fits its type.
    BadNumber(u8),
    /// The state field is not one ASCII letter.
    BadState,
}

impl fmt::Display for StatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoOpenParen => f.write_str("/proc stat: no '(' opening the command name"),
            Self::NoCloseParen => f.write_str("/proc stat: no ')' closing the command name"),
            Self::MissingField(n) => write!(f, "/proc stat: line ends before field {n}"),
            Self::BadNumber(n) => write!(f, "/proc stat: field {n} is not a number"),
            Self::BadState => f.write_str("/proc stat: field 3 (state) is not one letter"),
        }
    }
}

impl core::error::Error for StatError {}

/// Field number (1-based, `man 5 proc`) of the last field this parser reads.
const LAST_FIELD_READ: u8 = 15;

/// Parses one `/proc/<pid>/stat` line (a trailing newline is allowed).
///
/// Never panics; any malformed input is a [`StatError`] naming the field.
pub fn parse_stat(line: &[u8]) -> Result<ProcStat, StatError> {
    let open = line
        .iter()
        .position(|&b| b == b'(')
        .ok_or(StatError::NoOpenParen)?;
    // The LAST ')' ends comm: comm may contain ')' but the numeric fields after it never do.
    let close = line
        .iter()
        .rposition(|&b| b == b')')
        .filter(|&c| c > open)
        .ok_or(StatError::NoCloseParen)?;
    let pid = parse_num::<i32>(trim_spaces(&line[..open]), 1)?;
    let mut rest = line[close + 1..]
        .split(|&b| b == b' ' || b == b'\n')
        .filter(|f| !f.is_empty());
    // Field 3 is the first after comm.
    let mut field = |n: u8| rest.next().ok_or(StatError::MissingField(n));
    let state = match field(3)? {
        [s] if s.is_ascii_alphabetic() => *s,
        _ => return Err(StatError::BadState),
    };
    let _ppid = field(4)?;
    let pgrp = parse_num::<i32>(field(5)?, 5)?;
    for n in 6..=13 {
        field(n)?;
    }
    let utime = parse_num::<u64>(field(14)?, 14)?;
    let stime = parse_num::<u64>(field(LAST_FIELD_READ)?, LAST_FIELD_READ)?;
    Ok(ProcStat {
        pid,
        state,
        pgrp,
        utime,
        stime,
    })
}

fn trim_spaces(mut s: &[u8]) -> &[u8] {
    while let [b' ', r @ ..] = s {
        s = r;
    }
    while let [r @ .., b' '] = s {
        s = r;
    }
    s
}

fn parse_num<T: core::str::FromStr>(field: &[u8], n: u8) -> Result<T, StatError> {
    // Only plain digits (with a '-' for the signed ids); FromStr would also take a leading '+'.
    let digits = field.strip_prefix(b"-").unwrap_or(field);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(StatError::BadNumber(n));
    }
    core::str::from_utf8(field)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(StatError::BadNumber(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A real line recorded from this box (`cat /proc/self/stat`), with the comm replaced.
    fn line(comm: &str) -> String {
        format!(
            "4242 ({comm}) S 4100 4242 4100 34816 4242 4194304 120 0 0 0 \
             731 58 0 0 20 0 1 0 123456 8974336 220 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"
        )
    }

    const EXPECT: ProcStat = ProcStat {
        pid: 4242,
        state: b'S',
        pgrp: 4242,
        utime: 731,
        stime: 58,
    };

    #[test]
    fn hostile_command_names_parse_the_same() {
        for comm in [
            "llama-server",
            "a) b",
            "((",
            "))",
            ")",
            "(",
            "a b c",
            " ",
            "",
            "x) S 1 2 3",
            "123456789012345", // 15 bytes, the kernel's TASK_COMM_LEN - 1
            "(((((((((((((((",
            ")))))))))))))))",
            ") ) ) ) ) ) ) )",
        ] {
            assert_eq!(
                parse_stat(line(comm).as_bytes()),
                Ok(EXPECT),
                "comm {comm:?}"
            );
        }
    }

    #[test]
    fn ticks_sum_and_zombie() {
        assert_eq!(EXPECT.cpu_ticks(), 789);
        let z = parse_stat(line("x").replace(") S ", ") Z ").as_bytes()).unwrap();
        assert!(z.is_zombie());
        assert!(!EXPECT.is_zombie());
        let huge = ProcStat {
            utime: u64::MAX,
            stime: 1,
            ..EXPECT
        };
        assert_eq!(huge.cpu_ticks(), u64::MAX);
    }

    #[test]
    fn malformed_lines_name_the_field() {
        let cases: &[(&[u8], StatError)] = &[
            (b"", StatError::NoOpenParen),
            (b"12 comm S 1 2", StatError::NoOpenParen),
            (b"12 (comm S 1 2", StatError::NoCloseParen),
            (b"12 )comm( S", StatError::NoCloseParen),
            (
                b"x (c) S 1 2 3 4 5 6 7 8 9 10 11 12",
                StatError::BadNumber(1),
            ),
            (b"12 (c)", StatError::MissingField(3)),
            (b"12 (c) SS 1 2", StatError::BadState),
            (b"12 (c) 5 1 2", StatError::BadState),
            (b"12 (c) S 1", StatError::MissingField(5)),
            (b"12 (c) S 1 -x", StatError::BadNumber(5)),
            (
                b"12 (c) S 1 2 3 4 5 6 7 8 9 10",
                StatError::MissingField(14),
            ),
            (
                b"12 (c) S 1 2 3 4 5 6 7 8 9 10 +1 2",
                StatError::BadNumber(14),
            ),
            (
                b"12 (c) S 1 2 3 4 5 6 7 8 9 10 1",
                StatError::MissingField(15),
            ),
            (
                b"12 (c) S 1 2 3 4 5 6 7 8 9 10 1 -2",
                StatError::BadNumber(15),
            ),
            // One past u64::MAX.
            (
                b"12 (c) S 1 2 3 4 5 6 7 8 9 10 18446744073709551616 0",
                StatError::BadNumber(14),
            ),
        ];
        for (input, err) in cases {
            assert_eq!(
                parse_stat(input),
                Err(*err),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
        // At the limit: u64::MAX itself parses.
        let max = parse_stat(b"12 (c) S 1 2 3 4 5 6 7 8 9 10 18446744073709551615 0").unwrap();
        assert_eq!(max.utime, u64::MAX);
    }

    proptest! {
        /// Whatever bytes the command name holds (the kernel caps it at 15), the numbers after
        /// the last ')' are what comes out.
        #[test]
        fn any_comm_any_numbers(
            comm in proptest::collection::vec(any::<u8>().prop_filter("no newline", |b| *b != b'\n'), 0..=15),
            pid in 1i32..=i32::MAX,
            pgrp in 0i32..=i32::MAX,
            utime in any::<u64>(),
            stime in any::<u64>(),
            state in proptest::sample::select(b"RSDZTtXIP".to_vec()),
        ) {
            let mut l = format!("{pid} (").into_bytes();
            l.extend_from_slice(&comm);
            l.extend_from_slice(
                format!(") {} 1 {pgrp} 0 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0\n", state as char)
                    .as_bytes(),
            );
            prop_assert_eq!(parse_stat(&l), Ok(ProcStat { pid, state, pgrp, utime, stime }));
        }

        /// Arbitrary bytes never panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_stat(&bytes);
        }
    }
}
