//! The gatewayd binary: exits 0 after a clean stop (1 if the shutdown deadline forced it),
//! 75 when fenced (D-5), 1 on failure, 2 on invalid flags (`weir_shared::service`).

use clap::Parser;
use weir_gatewayd::GatewaydArgs;

// jemalloc, tuned (weir_shared::allocator says why).
weir_shared::jemalloc!();

fn main() -> std::process::ExitCode {
    let args = GatewaydArgs::parse();
    let config = args.validate().map(|()| args);
    weir_shared::service::main("gatewayd", config, weir_gatewayd::run)
}
