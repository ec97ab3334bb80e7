//! Writing to stdout without `println!`, which panics ("failed printing to stdout: Broken
//! pipe") when the reader of a pipe has gone (`loopd ... | head`): a write error comes back as
//! a [`Fail`], and a closed pipe ends the command quietly with status 141.

use std::io::Write;

use crate::exit::Fail;

/// Writes `text` and flushes it.
pub fn print(text: &str) -> Result<(), Fail> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}
