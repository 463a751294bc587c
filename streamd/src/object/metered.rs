//! Counts every object-store request streamd makes, by operation and by what its key
//! holds (`wal/…`, `data/…`, other), and the bytes of each PUT: what the node costs
//! in requests, busy or idle (`streamd_object_requests_total`,
//! `streamd_object_put_bytes`).

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, RenameOptions, Result,
};
use std::fmt;

/// What a key holds, for the metrics' `kind` label.
fn kind(location: &Path) -> &'static str {
    match location.parts().next().as_ref().map(|p| p.as_ref()) {
        Some("wal") => "wal",
        Some("data") => "data",
        _ => "other",
    }
}

fn count(op: &str, location: Option<&Path>) {
    let kind = location.map_or("other", kind);
    crate::metrics::metrics()
        .object_requests
        .with_label_values(&[op, kind])
        .inc();
}

/// A store that counts the requests made to `inner`.
#[derive(Debug)]
pub struct MeteredStore<S> {
    inner: S,
}

impl<S> MeteredStore<S> {
    pub fn new(inner: S) -> Self {
        MeteredStore { inner }
    }
}

impl<S: fmt::Display> fmt::Display for MeteredStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Metered({})", self.inner)
    }
}

#[async_trait]
impl<S: ObjectStore> ObjectStore for MeteredStore<S> {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        count("put", Some(location));
        crate::metrics::metrics()
            .object_put_bytes
            .with_label_values(&[kind(location)])
            .observe(payload.content_length() as f64);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(&self, location: &Path, opts: PutMultipartOptions) -> Result<Box<dyn MultipartUpload>> {
        count("multipart", Some(location));
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        count("get", Some(location));
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[std::ops::Range<u64>]) -> Result<Vec<bytes::Bytes>> {
        count("get", Some(location));
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        let counted = locations
            .inspect(|l| {
                if let Ok(l) = l {
                    count("delete", Some(l));
                }
            })
            .boxed();
        self.inner.delete_stream(counted)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        count("list", prefix);
        self.inner.list(prefix)
    }

    fn list_with_offset(&self, prefix: Option<&Path>, offset: &Path) -> BoxStream<'static, Result<ObjectMeta>> {
        count("list", prefix);
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        count("list", prefix);
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        count("copy", Some(to));
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        count("copy", Some(to));
        self.inner.rename_opts(from, to, options).await
    }
}
