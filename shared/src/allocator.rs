//! The allocator of every Weir binary, and its tuning, in one place: [`jemalloc!`]
//! installs it in a binary's root.
//!
//! jemalloc returns freed memory to the system. glibc's malloc kept the peaks of
//! transient buffers (compaction windows, object reads) resident, so RSS rose for as
//! long as a soak ran although the live heap stayed bounded (issue 23).
//!
//! Its default sends allocations of 8 MiB and more (an upload's object, a compaction
//! window, a large WAL group) to an arena that unmaps them as soon as they are freed,
//! so the next one faults in every page again: at 400 MB/s of produce, page faults and
//! unmapping were a third of the server's CPU (issue 62, `perf`). With that arena off,
//! they are reused like any other allocation and returned after jemalloc's usual
//! 10 s decay, which still bounds RSS as issue 23 needs.

#[doc(hidden)]
#[cfg(unix)]
pub use tikv_jemallocator;

/// jemalloc's `malloc_conf`: a pointer to a NUL-terminated option string, read once at
/// its first allocation.
#[doc(hidden)]
#[repr(transparent)]
pub struct MallocConf(pub *const u8);

// SAFETY: it points to a static, immutable byte string.
#[allow(unsafe_code)]
unsafe impl Sync for MallocConf {}

/// The options: no dedicated arena for large allocations (above).
#[doc(hidden)]
pub const MALLOC_CONF: MallocConf = MallocConf(b"oversize_threshold:0\0".as_ptr());

/// Installs jemalloc, tuned as above, as the global allocator of the binary whose root
/// module invokes it.
#[macro_export]
macro_rules! jemalloc {
    () => {
        #[cfg(unix)]
        #[global_allocator]
        static ALLOCATOR: $crate::allocator::tikv_jemallocator::Jemalloc =
            $crate::allocator::tikv_jemallocator::Jemalloc;

        // Read by jemalloc itself (its symbol prefix is `_rjem_`). SAFETY: the one
        // definition of that symbol, of the type jemalloc declares (`const char *`).
        #[cfg(unix)]
        #[allow(non_upper_case_globals, unsafe_code)]
        #[export_name = "_rjem_malloc_conf"]
        static malloc_conf: $crate::allocator::MallocConf = $crate::allocator::MALLOC_CONF;
    };
}
