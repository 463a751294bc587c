//! The streams a node serves: per-stream offset assignment, the in-memory tail of
//! durable records not yet in committed objects, and readers waiting for new data.

pub mod handle;
pub mod tail;

pub use handle::{Buffered, ReadHint, StreamHandle, StreamInner};
pub use tail::TailState;
