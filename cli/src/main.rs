//! The `weir` command: admin commands over metad's gRPC admin API, and `weir dev`.

mod certs;
mod dev;
mod output;

use clap::{Parser, Subcommand};
use std::time::Duration;
use weir_meta::client::MetadClient;
use weir_meta::model::{Command, CordonBy, DamageRemedy, Proposer, StreamConfig};
use weir_proto::metad::{DrainRequest, TransferRequest};

// jemalloc returns freed memory to the system. glibc's malloc kept the peaks of
// transient buffers (compaction windows, object reads) resident, so RSS rose for as
// long as a soak ran although the live heap stayed bounded (issue 23).
#[cfg(unix)]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "weir", version, about = "Weir: durable streams on object storage")]
struct Cli {
    /// metad replicas to talk to, comma-separated HOST:PORT.
    #[arg(long, env = "WEIR_METAD", default_value = "127.0.0.1:7400", global = true)]
    metad: String,

    /// Print JSON instead of tables.
    #[arg(long, env = "WEIR_JSON", global = true)]
    json: bool,

    #[command(flatten)]
    cluster_tls: weir_shared::cluster_tls::ClusterTlsArgs,

    /// An admin token to authenticate to metad with, instead of an operator
    /// certificate: sent over TLS, trusting `--cluster-ca`. Prefer the environment
    /// variable to the flag, which other users can see in the process list.
    #[arg(long, env = "WEIR_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,

    /// Seconds to wait for an answer.
    #[arg(long, env = "WEIR_TIMEOUT_SEC", default_value_t = 10, global = true)]
    timeout_sec: u64,

    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run Weir on local disk in one process: metad, streamd and gatewayd.
    Dev(Box<dev::DevArgs>),
    /// The cluster's certificate authority and node certificates (TLS).
    Certs {
        #[command(subcommand)]
        action: certs::CertsCmd,
    },
    /// Registered nodes.
    Nodes {
        #[command(subcommand)]
        action: NodesCmd,
    },
    /// Streams and their owners.
    Streams {
        #[command(subcommand)]
        action: StreamsCmd,
    },
    /// Kafka topics.
    Topics {
        #[command(subcommand)]
        action: TopicsCmd,
    },
    /// The metadata log.
    Metadata {
        #[command(subcommand)]
        action: MetadataCmd,
    },
    /// API tokens for the gateway's `--auth` (the secret is printed once).
    Tokens {
        #[command(subcommand)]
        action: TokensCmd,
    },
    /// Raft status of the replica that answers.
    Status,
}

#[derive(Subcommand)]
enum TokensCmd {
    List,
    /// Issue a token NAME and print its secret.
    Issue {
        name: String,
        /// Let the token use admin endpoints (tokens, nodes): the `admin` scope.
        #[arg(long)]
        admin: bool,
        /// A scope: read, write, manage or admin, the first three optionally limited
        /// to names with a prefix (`read:orders-`); repeat for more. Without scopes
        /// (and without --admin) the token may read, write and manage every stream.
        #[arg(long = "scope", value_name = "SCOPE")]
        scopes: Vec<String>,
        /// Seconds until the token stops authenticating (default: never).
        #[arg(long, value_name = "SECONDS")]
        ttl_sec: Option<u64>,
    },
    Revoke {
        name: String,
    },
}

#[derive(Subcommand)]
enum NodesCmd {
    List,
    /// Stop placing streams on NODE (an operator cordon survives restarts).
    Cordon {
        node: String,
    },
    /// Remove an operator cordon from NODE.
    Uncordon {
        node: String,
    },
    /// Cordon NODE and move each of its streams to another node by planned transfer,
    /// in batches (everything buffered is uploaded first); reports per stream what
    /// moved and why a move failed, and exits 1 when not everything moved. The process
    /// keeps running.
    Drain {
        node: String,
        /// Seconds the whole drain may take; each stream's move is bounded by what is left.
        #[arg(long, default_value_t = 300)]
        budget_sec: u64,
    },
}

#[derive(Subcommand)]
enum StreamsCmd {
    List,
    /// Streams whose committed data is damaged: what, where, and who found it. Reads of
    /// the damage are refused until `weir streams repair`.
    Damaged,
    /// Resolve STREAM's damage, recorded in the metadata log: --restored after putting
    /// the damaged object back (the owner reads it again and reports it anew if it is
    /// still damaged), or --trim-past to move the stream's start past the damage.
    Repair {
        stream: String,
        #[arg(long, conflicts_with = "trim_past", required_unless_present = "trim_past")]
        restored: bool,
        #[arg(long)]
        trim_past: bool,
    },
    /// Move STREAM (a stream name or `topic/partition`) to node --to by planned
    /// transfer; with --dry-run only check that it could (the error names the first
    /// failing check).
    Transfer {
        stream: String,
        #[arg(long)]
        to: String,
        #[arg(long)]
        dry_run: bool,
        /// Seconds the transfer may take.
        #[arg(long, default_value_t = 60)]
        budget_sec: u64,
    },
}

#[derive(Subcommand)]
enum TopicsCmd {
    List,
    Create {
        name: String,
        #[arg(long, default_value_t = 1)]
        partitions: u32,
    },
    Delete {
        name: String,
    },
}

#[derive(Subcommand)]
enum MetadataCmd {
    /// Applied log entries with index, command and outcome.
    Dump {
        #[arg(long, default_value_t = 0)]
        from: u64,
        #[arg(long, default_value_t = 1000)]
        limit: u64,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("weir: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

/// A client of metad: over mTLS with an operator certificate, over TLS with an admin
/// token (`--token` and `--cluster-ca`), or plaintext.
fn metad_client(cli: &Cli) -> anyhow::Result<MetadClient> {
    let addrs = weir_shared::config::addr_list(&cli.metad);
    let timeout = Duration::from_secs(cli.timeout_sec);
    let tls = &cli.cluster_tls;
    let Some(token) = &cli.token else {
        cli.cluster_tls.install()?;
        return Ok(MetadClient::new(&addrs, timeout)?);
    };
    if tls.cluster_cert.is_some() || tls.cluster_key.is_some() {
        anyhow::bail!("--token and --cluster-cert/--cluster-key are two ways to authenticate; give one");
    }
    let Some(ca) = &tls.cluster_ca else {
        anyhow::bail!(
            "--token needs --cluster-ca: a token is sent only over TLS, to a metad the cluster's CA vouches for"
        );
    };
    let trust = weir_shared::cluster_tls::trust_only(ca)?;
    Ok(MetadClient::with_credentials(
        &addrs,
        timeout,
        Some(trust),
        Some(token),
    )?)
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let cli = match cli.command {
        Cmd::Dev(args) => return dev::run(*args).await,
        Cmd::Certs { action } => return certs::run(action),
        command => Cli { command, ..cli },
    };
    let client = metad_client(&cli)?;
    // On a secure cluster metad logs the operator its certificate or token names; on a
    // plaintext one, the login name.
    let principal = match weir_shared::cluster_tls::installed() {
        Some(tls) => tls.me.id.clone(),
        None => std::env::var("USER").unwrap_or_else(|_| "cli".into()),
    };
    let operator = Proposer::Operator { principal };
    let out = output::Output { json: cli.json };
    match cli.command {
        Cmd::Dev(_) | Cmd::Certs { .. } => unreachable!("handled above"),
        Cmd::Status => out.value(&client.admin("status", 0, 0).await?),
        Cmd::Nodes { action: NodesCmd::List } => out.nodes(&client.admin("nodes", 0, 0).await?),
        Cmd::Nodes {
            action: NodesCmd::Cordon { node },
        } => {
            let cmd = Command::Cordon {
                node: weir_shared::ids::NodeId::new(node),
                by: CordonBy::Operator,
            };
            out.outcome(client.propose(&operator, cmd).await?)?
        }
        Cmd::Nodes {
            action: NodesCmd::Uncordon { node },
        } => {
            let cmd = Command::Uncordon {
                node: weir_shared::ids::NodeId::new(node),
                by: CordonBy::Operator,
            };
            out.outcome(client.propose(&operator, cmd).await?)?
        }
        Cmd::Nodes {
            action: NodesCmd::Drain { node, budget_sec },
        } => {
            let budget = budget_flag("--budget-sec", budget_sec)?;
            let request = DrainRequest {
                node: node.clone(),
                budget_ms: budget.as_millis() as u64,
                requester: Vec::new(),
                principal: String::new(),
            };
            let report = client.drain(request, budget + CALL_MARGIN).await?;
            out.value(&report);
            if report["finished"] != true {
                anyhow::bail!(
                    "node '{node}' is not fully drained: {}",
                    report["error"]
                        .as_str()
                        .unwrap_or("some streams did not move (see the report)")
                );
            }
        }
        Cmd::Streams {
            action: StreamsCmd::List,
        } => pages(&client, "streams", |page, first| out.streams(page, first)).await?,
        Cmd::Streams {
            action: StreamsCmd::Damaged,
        } => pages(&client, "damaged", |page, first| out.damaged(page, first)).await?,
        Cmd::Streams {
            action: StreamsCmd::Repair { stream, restored, .. },
        } => {
            let found = client.admin_stream(&stream).await?;
            let id = found["stream"]["id"]
                .as_u64()
                .ok_or_else(|| anyhow::anyhow!("stream '{stream}' does not exist"))?;
            let remedy = if restored {
                DamageRemedy::Restored
            } else {
                DamageRemedy::TrimPast
            };
            let cmd = Command::ResolveDamage {
                stream: weir_shared::ids::StreamId(id),
                remedy,
            };
            out.outcome(client.propose(&operator, cmd).await?)?
        }
        Cmd::Streams {
            action:
                StreamsCmd::Transfer {
                    stream,
                    to,
                    dry_run,
                    budget_sec,
                },
        } => {
            let budget = budget_flag("--budget-sec", budget_sec)?;
            let request = TransferRequest {
                stream: stream.clone(),
                target: to,
                dry_run,
                budget_ms: budget.as_millis() as u64,
                principal: String::new(),
            };
            let moved = client.transfer(request, budget + CALL_MARGIN).await?;
            out.value(&moved);
            if !dry_run && moved["moved"] != true {
                anyhow::bail!(
                    "stream '{stream}' did not move: {}",
                    moved["error"].as_str().unwrap_or("unknown")
                );
            }
        }
        Cmd::Topics {
            action: TopicsCmd::List,
        } => out.value(&client.admin("topics", 0, 0).await?),
        Cmd::Topics {
            action: TopicsCmd::Create { name, partitions },
        } => {
            let cmd = Command::CreateTopic {
                name,
                partitions,
                config: StreamConfig::default(),
            };
            out.outcome(client.propose(&operator, cmd).await?)?
        }
        Cmd::Topics {
            action: TopicsCmd::Delete { name },
        } => {
            // By name: the operator's one proposal is answered, or retried by hand.
            let cmd = Command::DeleteTopic { name, topic_id: None };
            out.outcome(client.propose(&operator, cmd).await?)?
        }
        Cmd::Metadata {
            action: MetadataCmd::Dump { from, limit },
        } => out.log(&client.admin("log", from, limit).await?),
        Cmd::Tokens {
            action: TokensCmd::List,
        } => out.value(&client.admin("tokens", 0, 0).await?),
        Cmd::Tokens {
            action:
                TokensCmd::Issue {
                    name,
                    admin,
                    scopes,
                    ttl_sec,
                },
        } => {
            let expires_at_ms =
                weir_gatewayd::api::tokens::expiry(ttl_sec).map_err(|e| anyhow::anyhow!("--ttl-sec: {e}"))?;
            let secret = weir_gatewayd::api::tokens::new_secret();
            let cmd = Command::IssueToken {
                name: name.clone(),
                secret_sha256: weir_gatewayd::api::auth::secret_hash(&secret),
                scopes: {
                    let mut scopes = scopes;
                    if admin {
                        scopes.push("admin".into());
                    }
                    weir_meta::model::scopes::Scopes::parse(&scopes).map_err(|e| anyhow::anyhow!("--scope: {e}"))?;
                    scopes
                },
                expires_at_ms,
                scram: Some(weir_meta::scram::credentials(&secret)),
            };
            let (_, outcome) = client.propose(&operator, cmd).await?;
            outcome.map_err(|r| anyhow::anyhow!("token not issued: {}", r.message))?;
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({"name": name, "token": secret, "expires_at_ms": expires_at_ms})
                );
            } else {
                println!("{secret}");
            }
        }
        Cmd::Tokens {
            action: TokensCmd::Revoke { name },
        } => out.outcome(client.propose(&operator, Command::RevokeToken { name }).await?)?,
    }
    Ok(())
}

/// Follows a paged listing from its first page to its last, handing each to `show`
/// (with whether it is the first) as it arrives: no answer, and nothing in memory,
/// grows with the number of streams.
async fn pages(client: &MetadClient, what: &str, mut show: impl FnMut(&serde_json::Value, bool)) -> anyhow::Result<()> {
    let mut from = 0;
    let mut first = true;
    loop {
        let page = client.admin(what, from, 0).await?;
        show(&page, first);
        first = false;
        match page["next"].as_u64() {
            Some(next) => from = next,
            None => return Ok(()),
        }
    }
}

/// How much longer than its budget a drain or transfer call waits for the report.
const CALL_MARGIN: Duration = Duration::from_secs(10);

fn budget_flag(flag: &str, sec: u64) -> anyhow::Result<Duration> {
    if sec == 0 || sec > 3600 {
        anyhow::bail!("{flag} must be between 1 and 3600 seconds, got {sec}");
    }
    Ok(Duration::from_secs(sec))
}
