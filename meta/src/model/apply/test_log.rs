//! A small metadata log for the apply rules' unit tests: two open streams on one node.

use crate::model::command::{Applied, CommitRange, Proposal, Proposer, RejectCode};
use crate::model::rows::*;
use crate::model::{Command, Metadata};
use weir_shared::ids::{Epoch, Incarnation, NodeId, ObjectKey, Offset, StreamId};

pub struct Log {
    pub meta: Metadata,
    index: u64,
}

pub fn op() -> Proposer {
    Proposer::Operator { principal: "op".into() }
}

pub fn node() -> Proposer {
    Proposer::Node(Incarnation {
        node: NodeId::new("n"),
        epoch: Epoch(1),
    })
}

impl Log {
    pub fn apply(&mut self, proposer: Proposer, command: Command) -> Result<Applied, RejectCode> {
        self.index += 1;
        let (outcome, _) = self.meta.apply(self.index, &Proposal { proposer, command });
        outcome.map_err(|r| r.code)
    }

    /// Registers streamd `n` (again: a new incarnation).
    pub fn register_n(&mut self) -> Result<Applied, RejectCode> {
        self.apply(
            op(),
            Command::RegisterNode {
                node: NodeId::new("n"),
                kind: NodeKind::Streamd,
                addrs: NodeAddrs::default(),
                heartbeat_interval_sec: 1,
                node_timeout_sec: 3,
            },
        )
    }

    /// Two open streams on node `n`.
    pub fn new() -> Self {
        let mut log = Log {
            meta: Metadata::default(),
            index: 0,
        };
        let settings = ClusterSettings {
            heartbeat_interval_sec: 1,
            node_timeout_sec: 3,
        };
        log.apply(op(), Command::InitCluster { settings }).expect("init");
        log.register_n().expect("register");
        for name in ["a", "b"] {
            let config = StreamConfig::default();
            let Ok(Applied::StreamCreated { stream }) = log.apply(
                op(),
                Command::CreateStream {
                    name: name.into(),
                    config,
                },
            ) else {
                panic!("create")
            };
            log.apply(
                op(),
                Command::PlaceStream {
                    stream,
                    node: NodeId::new("n"),
                },
            )
            .expect("place");
            log.apply(
                node(),
                Command::OpenStream {
                    stream,
                    stamps_leader_epochs: true,
                },
            )
            .expect("open");
        }
        log
    }

    /// Commits object `key` holding `ranges` of (stream, records, bytes).
    pub fn commit(&mut self, key: &str, ranges: &[(u64, u64, u64)]) {
        self.commit_as(node(), key, ranges).expect("commit");
    }

    /// As [`Log::commit`], proposed by `proposer`; its outcome.
    pub fn commit_as(
        &mut self,
        proposer: Proposer,
        key: &str,
        ranges: &[(u64, u64, u64)],
    ) -> Result<Applied, RejectCode> {
        let mut pos = 0;
        let ranges = ranges
            .iter()
            .map(|&(s, records, len)| {
                let row = &self.meta.state.streams[&StreamId(s)];
                let range = CommitRange {
                    stream: StreamId(s),
                    stream_epoch: row.epoch,
                    start: row.committed_end,
                    end: Offset(row.committed_end.0 + records),
                    pos,
                    len,
                    crc: 0,
                    max_timestamp: 1,
                    txns: Default::default(),
                };
                pos += len;
                range
            })
            .collect();
        let command = Command::CommitObjects {
            key: ObjectKey(key.into()),
            size: pos,
            ranges,
        };
        self.apply(proposer, command)
    }

    /// Closes stream `s` at its epoch, as its owner `n`.
    pub fn close(&mut self, s: u64) {
        let stream_epoch = self.row(s).epoch;
        let close = Command::CloseStream {
            stream: StreamId(s),
            stream_epoch,
        };
        self.apply(node(), close).expect("close");
    }

    /// Places stream `s` on `n` again, after a close.
    pub fn place_on_n(&mut self, s: u64) {
        let place = Command::PlaceStream {
            stream: StreamId(s),
            node: NodeId::new("n"),
        };
        self.apply(op(), place).expect("placed again");
    }

    /// `n`'s open of stream `s`, stamping leader epochs as a streamd does.
    pub fn open_by_n(s: u64) -> Command {
        Command::OpenStream {
            stream: StreamId(s),
            stamps_leader_epochs: true,
        }
    }

    pub fn row(&self, s: u64) -> &StreamRow {
        &self.meta.state.streams[&StreamId(s)]
    }
}
