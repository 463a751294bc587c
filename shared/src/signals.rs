//! Turns the first SIGINT or SIGTERM into a cancellation of the root token.
//! (The full shutdown orchestrator with phases and a deadline builds on this.)

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// Cancels `token` on the first SIGINT or SIGTERM; a second one exits at once with 128+signo.
pub fn stop_on_signal(token: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            eprintln!("failed to register termination signal handlers");
            std::process::exit(1);
        };
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "termination signal received; stopping"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "termination signal received; stopping"),
        }
        token.cancel();
        let code = tokio::select! {
            _ = term.recv() => 143,
            _ = int.recv() => 130,
        };
        tracing::warn!("repeated termination signal received; abandoning graceful shutdown");
        std::process::exit(code);
    })
}
