//! The metad binary: parse flags, then run one replica until SIGINT or SIGTERM.

use clap::Parser;
use weir_metad::MetadArgs;

// jemalloc returns freed memory to the system. glibc's malloc kept the peaks of
// transient buffers (compaction windows, object reads) resident, so RSS rose for as
// long as a soak ran although the live heap stayed bounded (issue 23).
#[cfg(unix)]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    weir_shared::service::main("metad", MetadArgs::parse().validate(), weir_metad::run)
}
