//! Renders admin answers as tables for people or JSON for scripts.

use serde_json::Value;
use weir_meta::model::Outcome;

pub struct Output {
    pub json: bool,
}

fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// Column widths of a streams listing, wide enough for most: a paged listing cannot
/// size its columns from rows it has not seen yet.
const STREAM_WIDTHS: [usize; 6] = [8, 32, 7, 20, 6, 13];

/// Prints `rows` in columns at least `min` wide (or as wide as the page needs when no
/// minimum is given), under `headers` when given.
fn table(headers: Option<&[&str]>, rows: Vec<Vec<String>>, min: &[usize]) {
    let columns = headers.map_or_else(|| rows.first().map_or(0, Vec::len), <[&str]>::len);
    let mut widths: Vec<usize> = (0..columns)
        .map(|i| min.get(i).copied().unwrap_or(0).max(headers.map_or(0, |h| h[i].len())))
        .collect();
    if min.is_empty() {
        for row in &rows {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.len());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", parts.join("  ").trim_end());
    };
    if let Some(headers) = headers {
        line(headers.iter().map(|h| h.to_string()).collect());
    }
    for row in rows {
        line(row);
    }
}

/// One JSON document per line.
fn json_lines(values: &[&Value]) {
    for v in values {
        println!("{}", serde_json::to_string(v).unwrap_or_default());
    }
}

impl Output {
    pub fn value(&self, v: &Value) {
        println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
    }

    pub fn nodes(&self, v: &Value) {
        if self.json {
            return self.value(v);
        }
        let rows = v["nodes"]
            .as_array()
            .map(|nodes| {
                nodes
                    .iter()
                    .map(|n| {
                        [
                            "node_id",
                            "kind",
                            "epoch",
                            "heartbeats",
                            "fenced",
                            "terminating",
                            "cordoned",
                            "streams",
                        ]
                        .iter()
                        .map(|k| cell(&n[*k]))
                        .collect()
                    })
                    .collect()
            })
            .unwrap_or_default();
        table(
            Some(&[
                "NODE",
                "KIND",
                "EPOCH",
                "HEARTBEATS",
                "FENCED",
                "TERMINATING",
                "CORDONED",
                "STREAMS",
            ]),
            rows,
            &[],
        );
    }

    /// One page of a streams listing: a table (its header on the first page only), or
    /// with `--json` one JSON document per line, a stream each.
    pub fn streams(&self, v: &Value, first: bool) {
        let rows = v["streams"]
            .as_object()
            .map(|m| m.values().collect::<Vec<_>>())
            .unwrap_or_default();
        if self.json {
            return json_lines(&rows);
        }
        let rows = rows
            .into_iter()
            .map(|s| {
                let owner = match &s["owner"] {
                    Value::Object(o) => format!("{}@{}", cell(&o["node"]), cell(&o["epoch"])),
                    _ => "-".into(),
                };
                vec![
                    cell(&s["id"]),
                    cell(&s["name"]),
                    cell(&s["state"]),
                    owner,
                    cell(&s["epoch"]),
                    cell(&s["committed_end"]),
                ]
            })
            .collect();
        let headers = ["ID", "NAME", "STATE", "OWNER", "EPOCH", "COMMITTED_END"];
        table(first.then_some(&headers[..]), rows, &STREAM_WIDTHS);
    }

    /// One page of the streams marked damaged: a table, or with `--json` one JSON
    /// document per line.
    pub fn damaged(&self, v: &Value, first: bool) {
        let damaged = v["streams"]
            .as_object()
            .map(|m| m.values().collect::<Vec<_>>())
            .unwrap_or_default();
        if self.json {
            return json_lines(&damaged);
        }
        let rows = damaged
            .iter()
            .map(|s| {
                let d = &s["damage"];
                vec![
                    cell(&s["name"]),
                    format!("{}..{}", cell(&d["from"]), cell(&d["until"])),
                    cell(&d["found_by"]),
                    cell(&d["what"]),
                ]
            })
            .collect();
        let headers = ["NAME", "OFFSETS", "FOUND_BY", "WHAT"];
        table(first.then_some(&headers[..]), rows, &[24, 16, 16, 0]);
    }

    pub fn log(&self, v: &Value) {
        if self.json {
            return self.value(v);
        }
        let rows = v["entries"]
            .as_array()
            .map(|entries| {
                entries
                    .iter()
                    .map(|e| {
                        let (proposer, command) = match &e["proposal"] {
                            Value::Object(p) => (compact(&p["proposer"]), compact(&p["command"])),
                            _ if !e["membership"].is_null() => ("-".into(), format!("membership {}", e["membership"])),
                            _ => ("-".into(), "blank".into()),
                        };
                        let outcome = match &e["outcome"] {
                            Value::Object(o) if o.contains_key("Ok") => format!("ok {}", compact(&o["Ok"])),
                            Value::Object(o) if o.contains_key("Err") => format!("rejected {}", compact(&o["Err"])),
                            _ => "-".into(),
                        };
                        vec![cell(&e["index"]), cell(&e["term"]), proposer, command, outcome]
                    })
                    .collect()
            })
            .unwrap_or_default();
        table(Some(&["INDEX", "TERM", "PROPOSER", "COMMAND", "OUTCOME"]), rows, &[]);
    }

    pub fn outcome(&self, (index, outcome): (u64, Outcome)) -> anyhow::Result<()> {
        match outcome {
            Ok(applied) => {
                if self.json {
                    self.value(&serde_json::json!({ "log_index": index, "applied": applied }));
                } else {
                    println!("ok (log index {index}): {}", compact(&serde_json::to_value(&applied)?));
                }
                Ok(())
            }
            Err(rejection) => anyhow::bail!("rejected at log index {index}: {}", rejection.message),
        }
    }
}

fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}
