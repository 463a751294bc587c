//! The metad binary: parse flags, then run one replica until SIGINT or SIGTERM.

use clap::Parser;
use weir_metad::MetadArgs;

// jemalloc, tuned (weir_shared::allocator says why).
weir_shared::jemalloc!();

fn main() -> std::process::ExitCode {
    weir_shared::service::main("metad", MetadArgs::parse().validate(), weir_metad::run)
}
