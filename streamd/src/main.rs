//! The streamd binary: exits 0 after a clean stop (1 if the shutdown deadline forced it),
//! 75 when fenced (D-5), 1 on failure, 2 on invalid flags (`weir_shared::service`).

use clap::Parser;
use weir_streamd::StreamdArgs;

// jemalloc returns freed memory to the system. glibc's malloc kept the peaks of
// transient buffers (compaction windows, object reads) resident, so RSS rose for as
// long as a soak ran although the live heap stayed bounded (issue 23).
#[cfg(unix)]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    let args = StreamdArgs::parse();
    let config = args.validate().map(|()| args);
    weir_shared::service::main("streamd", config, weir_streamd::run)
}
