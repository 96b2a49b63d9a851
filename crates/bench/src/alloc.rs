//! A global allocator wrapper that counts heap bytes, for memory figures measured rather than
//! estimated. The binary installs it. It counts only inside a window the benchmark opens around
//! what it measures ([`measure`]), so timed code pays one relaxed load per allocation, not an
//! atomic add.

use mimalloc::MiMalloc as System;
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static ON: AtomicBool = AtomicBool::new(false);

/// Runs `f` and returns its result with the heap bytes it left allocated (0 if the binary did not
/// install [`Counting`]). Single-threaded use only.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LIVE.store(0, Ordering::Relaxed);
    ON.store(true, Ordering::Relaxed);
    let out = f();
    ON.store(false, Ordering::Relaxed);
    (out, LIVE.load(Ordering::Relaxed))
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() && ON.load(Ordering::Relaxed) {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() && ON.load(Ordering::Relaxed) {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        if ON.load(Ordering::Relaxed) {
            // Wrapping: memory allocated before the window and freed inside it counts negative.
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() && ON.load(Ordering::Relaxed) {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

/// mimalloc's `mi_option_purge_delay` (its place in `mi_option_e`, the same in mimalloc 2 and 3).
const MI_OPTION_PURGE_DELAY: i32 = 15;

extern "C" {
    /// In the mimalloc library that `mimalloc` links statically.
    fn mi_option_set(option: i32, value: std::os::raw::c_long);
}

/// Has the allocator return pages freed for `ms` milliseconds to the system (mimalloc 3 waits a
/// second by default), unless `MIMALLOC_PURGE_DELAY` says otherwise. A daemon at full load frees
/// tens of megabytes a second; kept for a second, they showed as a sawtooth of 25 MiB in the
/// three daemons' memory, over their 100 MiB budget, for no throughput that a shorter delay
/// lost (0 ms, returning them at once, cost a third of it).
///
/// Call it before the process starts other threads: mimalloc reads its options without
/// synchronization.
pub fn purge_freed_pages_after(ms: u32) {
    let set = |name| std::env::var_os(name).is_some();
    // The option's older name is read too.
    if !set("MIMALLOC_PURGE_DELAY") && !set("MIMALLOC_RESET_DELAY") {
        // At most i32::MAX, so that it fits a 32-bit `long` too.
        let ms = ms.min(i32::MAX as u32) as std::os::raw::c_long;
        // SAFETY: an option of the allocator linked into this binary, set (as documented above)
        // before any other thread could read it.
        unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, ms) }
    }
}
