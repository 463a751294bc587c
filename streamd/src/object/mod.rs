//! Data objects: batches of several streams uploaded together, their format, the
//! uploader that commits them, and the reader that serves ranges of them.

pub mod cache;
pub mod format;
pub mod gc;
pub mod local;
pub mod metered;
pub mod pace;
pub mod range_reads;
pub mod store;
