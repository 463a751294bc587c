//! Failpoints for fault tests: `WEIR_FAILPOINT_<NAME>` in the environment selects an
//! action at a named point (`sleep(<ms>)`, `hang`, `drop`, `return(err)`). Read once per
//! use, so a test sets them per process; unset costs one environment lookup.
//!
//! Compiled only with the `failpoints` feature, which the test crate turns on for the
//! binaries the tests start (`cargo build --workspace --all-targets`), and only with
//! debug assertions: a release build has none however it is built (`cargo build
//! --release --workspace` unifies the test crate's features into every binary), and
//! every point is `None` there. `scripts/check-release-failpoints.sh` checks the
//! release binaries.

use std::time::Duration;

/// What a failpoint asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Wait this long, then go on.
    Sleep(Duration),
    /// Never go on (until the caller's own bound ends the wait).
    Hang,
    /// Do the work but drop the reply.
    Drop,
    /// As `Drop`, the first time only in this process (`1*drop`).
    DropOnce,
    /// Answer now as if lost, and do the work once this file is gone, the first time
    /// only (`1*late while exists(<path>)`): a proposal that lands after its caller
    /// gave up, when the test says.
    LateOnce(std::path::PathBuf),
    /// Fail instead of doing the work.
    Error,
    /// Fail while this file exists (`return(err) while exists(<path>)`): a test lifts
    /// the fault by removing the file, without restarting the process.
    ErrorWhile(std::path::PathBuf),
    /// As `Drop`, while this file exists (`drop while exists(<path>)`).
    DropWhile(std::path::PathBuf),
}

/// The action set for failpoint `name` (`drain_reply` reads `WEIR_FAILPOINT_DRAIN_REPLY`;
/// characters other than letters, digits and `_` read as `_`, so a name may carry a
/// stream name: `close_stream_orders/0` reads `WEIR_FAILPOINT_CLOSE_STREAM_ORDERS_0`).
#[cfg(all(feature = "failpoints", debug_assertions))]
pub fn action(name: &str) -> Option<Action> {
    let value = std::env::var(env_key(name)).ok()?;
    let parsed = parse(&value);
    if parsed.is_none() {
        tracing::warn!(failpoint = name, value, "unrecognized failpoint action ignored");
    }
    parsed
}

/// Without the `failpoints` feature, or in a release build, no point is ever set.
#[cfg(not(all(feature = "failpoints", debug_assertions)))]
pub fn action(_name: &str) -> Option<Action> {
    None
}

/// Whether failpoint `name` is set at all, whatever its value (points that only stop
/// the process where they stand).
pub fn is_set(name: &str) -> bool {
    cfg!(all(feature = "failpoints", debug_assertions)) && std::env::var_os(env_key(name)).is_some()
}

/// `WEIR_FAILPOINT_<NAME>`, other characters than letters and digits read as `_`.
fn env_key(name: &str) -> String {
    let key: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("WEIR_FAILPOINT_{key}")
}

#[cfg_attr(not(all(feature = "failpoints", debug_assertions)), allow(dead_code))]
fn parse(value: &str) -> Option<Action> {
    match value.trim() {
        "hang" => Some(Action::Hang),
        "drop" => Some(Action::Drop),
        "1*drop" => Some(Action::DropOnce),
        "return(err)" => Some(Action::Error),
        v if v.starts_with("1*late while exists(") => v
            .strip_prefix("1*late while exists(")
            .and_then(|r| r.strip_suffix(')'))
            .map(|path| Action::LateOnce(path.into())),
        v if v.starts_with("drop while exists(") => v
            .strip_prefix("drop while exists(")
            .and_then(|r| r.strip_suffix(')'))
            .map(|path| Action::DropWhile(path.into())),
        v if v.starts_with("return(err) while exists(") => v
            .strip_prefix("return(err) while exists(")
            .and_then(|r| r.strip_suffix(')'))
            .map(|path| Action::ErrorWhile(path.into())),
        v => v
            .strip_prefix("sleep(")
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|ms| ms.parse().ok())
            .map(|ms| Action::Sleep(Duration::from_millis(ms))),
    }
}

/// Whether failpoint `name` is `1*drop` and has not fired yet in this process; a true
/// answer fires it.
pub fn drop_once(name: &str) -> bool {
    if action(name) != Some(Action::DropOnce) || !first_time(name) {
        return false;
    }
    tracing::warn!(failpoint = name, "failpoint: dropping the reply once");
    true
}

/// When failpoint `name` is `1*late while exists(<path>)` and has not fired yet in
/// this process: a wait that ends once the file is gone, for the work to be done
/// after it; its caller answers now as if the answer were lost.
pub fn late_once(name: &str) -> Option<impl std::future::Future<Output = ()>> {
    let Some(Action::LateOnce(path)) = action(name) else {
        return None;
    };
    if !first_time(name) {
        return None;
    }
    tracing::warn!(failpoint = name, path = %path.display(), "failpoint: the work lands late");
    Some(async move {
        while path.exists() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// Whether a once-only failpoint `name` fires now: true the first time in this process.
fn first_time(name: &str) -> bool {
    static FIRED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut fired = FIRED.lock().unwrap_or_else(|e| e.into_inner());
    if fired.iter().any(|n| n == name) {
        return false;
    }
    fired.push(name.to_string());
    true
}

/// Whether failpoint `name` asks that the work be done and its answer lost now:
/// `drop`, or `drop while exists(<path>)` while that file exists.
pub fn drops(name: &str) -> bool {
    let dropped = match action(name) {
        Some(Action::Drop) => true,
        Some(Action::DropWhile(path)) => path.exists(),
        _ => false,
    };
    if dropped {
        tracing::warn!(failpoint = name, "failpoint: dropping the answer");
    }
    dropped
}

/// Whether failpoint `name` asks the work to fail now: `return(err)`, or
/// `return(err) while exists(<path>)` while that file exists.
pub fn fails(name: &str) -> bool {
    match action(name) {
        Some(Action::Error) => true,
        Some(Action::ErrorWhile(path)) => path.exists(),
        _ => false,
    }
}

/// Runs the waiting actions (`sleep`, `hang`) of failpoint `name`; returns the others.
pub async fn pause(name: &str) -> Option<Action> {
    match action(name) {
        Some(Action::Sleep(d)) => {
            tracing::warn!(failpoint = name, delay = ?d, "failpoint: sleeping");
            tokio::time::sleep(d).await;
            None
        }
        Some(Action::Hang) => {
            tracing::warn!(failpoint = name, "failpoint: hanging");
            std::future::pending().await
        }
        other => other,
    }
}

/// As [`pause`], for a thread that blocks (the WAL writer): a `sleep` or `hang` action
/// waits in 10 ms steps, so `stop` ends it early; false if the stop came first.
pub fn pause_blocking(name: &str, stop: &tokio_util::sync::CancellationToken) -> bool {
    let until = match action(name) {
        Some(Action::Sleep(d)) => {
            tracing::warn!(failpoint = name, delay = ?d, "failpoint: sleeping");
            Some(std::time::Instant::now() + d)
        }
        Some(Action::Hang) => {
            tracing::warn!(failpoint = name, "failpoint: hanging");
            None
        }
        _ => return true,
    };
    while until.is_none_or(|t| std::time::Instant::now() < t) {
        if stop.is_cancelled() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_parse() {
        assert_eq!(parse("sleep(1500)"), Some(Action::Sleep(Duration::from_millis(1500))));
        assert_eq!(parse("hang"), Some(Action::Hang));
        assert_eq!(parse("drop"), Some(Action::Drop));
        assert_eq!(parse("1*drop"), Some(Action::DropOnce));
        assert_eq!(
            parse("1*late while exists(/tmp/z)"),
            Some(Action::LateOnce("/tmp/z".into()))
        );
        assert_eq!(parse("return(err)"), Some(Action::Error));
        assert_eq!(
            parse("return(err) while exists(/tmp/x)"),
            Some(Action::ErrorWhile("/tmp/x".into()))
        );
        assert_eq!(
            parse("drop while exists(/tmp/y)"),
            Some(Action::DropWhile("/tmp/y".into()))
        );
        assert_eq!(parse("sleep(x)"), None);
        assert_eq!(parse("panic"), None);
    }
}
