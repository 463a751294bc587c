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

fn table(headers: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    for row in rows {
        line(row);
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
            &[
                "NODE",
                "KIND",
                "EPOCH",
                "HEARTBEATS",
                "FENCED",
                "TERMINATING",
                "CORDONED",
                "STREAMS",
            ],
            rows,
        );
    }

    pub fn streams(&self, v: &Value) {
        if self.json {
            return self.value(v);
        }
        let rows = v["streams"]
            .as_object()
            .map(|streams| {
                streams
                    .values()
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
                    .collect()
            })
            .unwrap_or_default();
        table(&["ID", "NAME", "STATE", "OWNER", "EPOCH", "COMMITTED_END"], rows);
    }

    /// The streams of an admin `streams` answer that are marked damaged.
    pub fn damaged(&self, v: &Value) {
        let damaged: Vec<&Value> = v["streams"]
            .as_object()
            .map(|all| all.values().filter(|s| !s["damage"].is_null()).collect())
            .unwrap_or_default();
        if self.json {
            return self.value(&Value::Array(damaged.into_iter().cloned().collect()));
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
        table(&["NAME", "OFFSETS", "FOUND_BY", "WHAT"], rows);
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
        table(&["INDEX", "TERM", "PROPOSER", "COMMAND", "OUTCOME"], rows);
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
