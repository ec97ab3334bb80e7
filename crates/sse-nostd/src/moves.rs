//! Moving bytes inside the parser's buffer without `memmove`.
//!
//! On a 64-bit host these are `copy_within` and `rotate_left`. On a 32-bit device they are
//! built from non-overlapping `copy_from_slice` pieces (`memcpy`, which every image has
//! anyway) and `reverse`, so that compiler-builtins' `memmove` (about 1.6 KiB of Thumb code,
//! docs/benchmarks/embedded.md) is not linked for these few moves. Both versions are tested
//! against each other on the host (`tests::pieces_agree_with_copy_within`).

use core::ops::Range;

/// Copies `buf[src]` to `buf[dest..dest + src.len()]`; the ranges may overlap. Panics where
/// `copy_within` does (a range out of the buffer): callers pass ranges inside it.
#[inline]
pub(crate) fn move_within(buf: &mut [u8], src: Range<usize>, dest: usize) {
    #[cfg(target_pointer_width = "64")]
    buf.copy_within(src, dest);
    #[cfg(not(target_pointer_width = "64"))]
    move_by_pieces(buf, src, dest);
}

/// Rotates `buf` left by `mid` bytes, as `slice::rotate_left`.
#[inline]
pub(crate) fn rotate_left(buf: &mut [u8], mid: usize) {
    #[cfg(target_pointer_width = "64")]
    buf.rotate_left(mid);
    #[cfg(not(target_pointer_width = "64"))]
    rotate_by_reversal(buf, mid);
}

/// [`move_within`] as copies of at most the distance moved, none of which overlaps its
/// source: front to back when moving left, back to front when moving right.
#[cfg(any(test, not(target_pointer_width = "64")))]
fn move_by_pieces(buf: &mut [u8], src: Range<usize>, dest: usize) {
    let Range { start, end } = src;
    let n = end.saturating_sub(start);
    if dest < start {
        let gap = start - dest;
        let mut done = 0;
        while done < n {
            let k = gap.min(n - done);
            // Every byte written so far lies below `start + done`, every byte still to read above.
            let (lo, hi) = buf.split_at_mut(start + done);
            lo[dest + done..dest + done + k].copy_from_slice(&hi[..k]);
            done += k;
        }
    } else if dest > start {
        let gap = dest - start;
        let mut left = n;
        while left > 0 {
            let k = gap.min(left);
            let from = start + left - k;
            let (lo, hi) = buf.split_at_mut(dest + left - k);
            hi[..k].copy_from_slice(&lo[from..from + k]);
            left -= k;
        }
    } else {
        // In place: only the range check of `copy_within`.
        let _ = &buf[start..end];
    }
}

/// [`rotate_left`] as three reversals.
#[cfg(any(test, not(target_pointer_width = "64")))]
fn rotate_by_reversal(buf: &mut [u8], mid: usize) {
    let (a, b) = buf.split_at_mut(mid);
    a.reverse();
    b.reverse();
    buf.reverse();
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_move_by_one_either_way_and_in_place() {
        let mut b = *b"abcdefgh";
        move_by_pieces(&mut b, 1..7, 2);
        assert_eq!(&b, b"abbcdefg");
        let mut b = *b"abcdefgh";
        move_by_pieces(&mut b, 2..8, 1);
        assert_eq!(&b, b"acdefghh");
        let mut b = *b"abcdefgh";
        move_by_pieces(&mut b, 3..5, 3);
        assert_eq!(&b, b"abcdefgh");
        let mut b = *b"abcdefgh";
        rotate_by_reversal(&mut b, 3);
        assert_eq!(&b, b"defghabc");
    }

    proptest! {
        #[test]
        fn pieces_agree_with_copy_within(
            len in 0usize..64,
            a in 0usize..64,
            b in 0usize..64,
            d in 0usize..64,
        ) {
            let (start, end) = (a.min(b).min(len), a.max(b).min(len));
            let dest = d.min(len - (end - start));
            let orig: std::vec::Vec<u8> = (0..len as u8).collect();
            let mut want = orig.clone();
            want.copy_within(start..end, dest);
            let mut got = orig;
            move_by_pieces(&mut got, start..end, dest);
            prop_assert_eq!(got, want);
        }

        #[test]
        fn reversal_agrees_with_rotate_left(len in 0usize..64, m in 0usize..64) {
            let mid = m.min(len);
            let mut want: std::vec::Vec<u8> = (0..len as u8).collect();
            let mut got = want.clone();
            want.rotate_left(mid);
            rotate_by_reversal(&mut got, mid);
            prop_assert_eq!(got, want);
        }
    }
}
