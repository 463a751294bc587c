//! Lints of the operator docs against what the code logs: a record an operator may meet
//! has a row saying what it means and what to do.

use std::path::{Path, PathBuf};

/// Every exact message of OBS-6 to OBS-14 (the seed's shutdown, drain, cordon,
/// catch-up and hand-off records); placeholders as the requirements write them.
const MESSAGES: &[&str] = &[
    // OBS-6
    "shutdown stop-requested phase finished",
    "shutdown drain-support phase finished",
    "shutdown terminal-teardown phase finished",
    // OBS-7
    "shutdown deadline expired; abandoning graceful shutdown",
    "repeated termination signal received; abandoning graceful shutdown",
    "failed to register termination signal handlers",
    // OBS-8
    "stopping-node drain lost leadership; remaining work needs the next leader",
    "preserving operator cordon across graceful shutdown",
    "no live schedulable replacement node remains; admitted work completes in place",
    "timed out reaching the leader before requesting a graceful shutdown drain",
    "drained local node before graceful shutdown",
    "failed to drain local node before graceful shutdown",
    "the leader did not answer the graceful shutdown drain of the local node",
    "timed out moving scheduled work off the local node before graceful shutdown",
    // OBS-9
    "cleared shutdown drain cordon before graceful shutdown",
    "failed to clear shutdown drain cordon before graceful shutdown",
    "the leader did not answer the release of the shutdown drain cordon",
    "timed out clearing shutdown drain cordon",
    // OBS-11
    "local graph drain timed out with admitted work outstanding",
    "local graph drain timed out before confirming that no admitted work is still moving",
    // OBS-12
    "shutdown task exceeded grace period; aborting",
    // OBS-13
    "runtime execution is waiting for linearizable consensus catch-up",
    "runtime execution admitted after linearizable consensus catch-up",
    // OBS-14
    "node '<node_id>' is terminating",
    "node '<node_id>' is cordoned",
    "destination node '<node_id>' changed process incarnation during ownership handoff",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(relative: &str) -> String {
    let path = workspace().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The rows of the table under `## Troubleshooting` in `doc`.
fn troubleshooting_rows(doc: &str) -> Vec<&str> {
    doc.split("\n## ")
        .find(|section| section.starts_with("Troubleshooting"))
        .expect("a Troubleshooting section")
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---"))
        .skip(1)
        .collect()
}

/// The services' Rust code, concatenated: without comments and without the unit-test
/// modules that end a file, so a message counts only where the code writes it.
fn sources() -> String {
    fn walk(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).expect("source dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("source");
                let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
    }
    let mut all = String::new();
    for krate in ["shared", "meta", "metad", "streamd", "gatewayd"] {
        walk(&workspace().join(krate).join("src"), &mut all);
    }
    all
}

/// What the code holds for a message with a placeholder: the format string and the
/// words it is filled with. Any other message is written as it stands.
fn written_as(message: &str) -> Vec<&str> {
    match message {
        "node '<node_id>' is terminating" => vec![r#""node '{node}' is {why}""#, r#"Some("terminating")"#],
        "node '<node_id>' is cordoned" => vec![r#""node '{node}' is {why}""#, r#"Some("cordoned")"#],
        "destination node '<node_id>' changed process incarnation during ownership handoff" => {
            vec![r#""destination node '{target}' changed process incarnation during ownership handoff""#]
        }
        other => {
            assert!(!other.contains('<'), "say how `{other}` is written");
            vec![other]
        }
    }
}

// OBS-19: the troubleshooting table of docs/operations/shutdown.md maps every exact
// message of OBS-6 to OBS-14 to its cause and remedy, and the code (not a comment or a
// unit test) writes each of them, so a renamed record fails the lint.
#[test]
fn obs_19_every_shutdown_and_drain_record_has_a_troubleshooting_row() {
    let doc = read("docs/operations/shutdown.md");
    let rows = troubleshooting_rows(&doc);
    let code = sources();
    for message in MESSAGES {
        let row = rows
            .iter()
            .find(|r| r.contains(&format!("`{message}`")))
            .unwrap_or_else(|| panic!("no troubleshooting row quotes `{message}`"));
        let cells: Vec<&str> = row.split('|').map(str::trim).filter(|c| !c.is_empty()).collect();
        assert_eq!(
            cells.len(),
            3,
            "a row has what you see, what it means, what to do: {row}"
        );
        for fragment in written_as(message) {
            assert!(
                code.contains(fragment),
                "`{message}` is in the table but no service writes it (`{fragment}`)"
            );
        }
    }
    // The seed's four translated rows (OBS-19's list).
    for (what, says) in [
        ("a second signal", "exit 130 or 143"),
        ("the deadline", "--shutdown-deadline-sec"),
        ("a cordon still set", "weir nodes uncordon"),
        ("reappearing records", "records that reappear after a forced stop"),
    ] {
        assert!(rows.iter().any(|r| r.contains(says)), "no row for {what}");
    }
}

// DEP-6: the docs warn that a second Ctrl-C in a foreground compose up, or any double
// signal, forces exit 130/143.
#[test]
fn dep_6_the_docs_warn_against_a_second_stop_signal() {
    let compose = read("docs/deploy/compose.md");
    for needed in ["second Ctrl-C", "docker-compose up", "double signal", "130", "143"] {
        // DEP-6: the compose guide's warning names the second Ctrl-C, a double signal and
        // the exit statuses it forces.
        assert!(
            compose.contains(needed),
            "docs/deploy/compose.md's stop warning lacks `{needed}`"
        );
    }
    let shutdown = read("docs/operations/shutdown.md");
    assert!(shutdown.contains("a second SIGINT / SIGTERM abandoned the shutdown"));
}
