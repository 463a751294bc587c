//! Opens the object store named by `--object-store`: `file:///dir` for the local
//! filesystem, or `s3://bucket[/prefix]` for any S3-compatible endpoint configured
//! through the usual `AWS_*` environment (`AWS_ENDPOINT`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ALLOW_HTTP`).

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;
use std::sync::Arc;
use weir_shared::config::ConfigError;

/// The store for `url`, with any path in the URL as a key prefix.
pub fn open(url: &str) -> Result<Arc<dyn ObjectStore>, ConfigError> {
    let bad = |why: String| ConfigError::new(format!("--object-store '{url}': {why}"));
    let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    match parsed.scheme() {
        "file" => {
            let path = parsed.to_file_path().map_err(|_| bad("not a local path".into()))?;
            weir_shared::durable_dir::create_dir_all(&path)
                .map_err(|e| bad(format!("cannot create {}: {e}", path.display())))?;
            let fs = LocalFileSystem::new_with_prefix(&path).map_err(|e| bad(e.to_string()))?;
            Ok(Arc::new(fs))
        }
        "s3" => {
            let bucket = parsed
                .host_str()
                .filter(|b| !b.is_empty())
                .ok_or_else(|| bad("missing bucket".into()))?;
            let s3 = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .build()
                .map_err(|e| bad(e.to_string()))?;
            let prefix = parsed.path().trim_matches('/');
            if prefix.is_empty() {
                Ok(Arc::new(s3))
            } else {
                Ok(Arc::new(PrefixStore::new(s3, prefix)))
            }
        }
        other => Err(bad(format!("scheme '{other}' is not supported; use file:// or s3://"))),
    }
}
