//! [`CountingAlloc`]: a global allocator that counts the allocations of each thread, for the
//! tests that prove a parser allocates nothing. A test binary installs it with
//! `#[global_allocator] static A: CountingAlloc = CountingAlloc;` and measures with
//! [`counted`]; only the calling thread's allocations count (the test harness allocates on its
//! own threads).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    // `const` initialised: reading it never allocates, so the allocator can use it.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: a thread being torn down may still free and allocate.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

/// The system allocator, counting every allocation (and reallocation) per thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAlloc;

// SAFETY: every call is forwarded unchanged to the system allocator; it only counts.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations made on this thread so far (0 unless [`CountingAlloc`] is the global allocator).
pub fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

/// Runs `f` and returns its value and the allocations it made on this thread.
pub fn counted<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = allocations();
    let out = f();
    (out, allocations() - before)
}
