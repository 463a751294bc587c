//! The metad binary: parse flags, then run one replica until SIGINT or SIGTERM.

use clap::Parser;
use weir_metad::MetadArgs;

fn main() -> std::process::ExitCode {
    weir_shared::service::main("metad", MetadArgs::parse().validate(), weir_metad::run)
}
