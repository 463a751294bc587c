//! Opens the object store named by `--object-store`: `file:///dir` for the local
//! filesystem, or `s3://bucket[/prefix]` for any S3-compatible endpoint configured
//! through the usual `AWS_*` environment (`AWS_ENDPOINT`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ALLOW_HTTP`).

use super::local::SteppedLocalStore;
use super::metered::MeteredStore;
use super::pace::PacedStore;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;
use std::sync::Arc;
use weir_shared::config::ConfigError;

/// The local directory of a `file://` store, whose volume's free space is watched
/// (issue 60); `None` for a remote store.
pub fn local_dir(url: &str) -> Option<std::path::PathBuf> {
    let parsed = url::Url::parse(url).ok()?;
    (parsed.scheme() == "file")
        .then(|| parsed.to_file_path().ok())
        .flatten()
}

/// The store for `url`, with any path in the URL as a key prefix.
pub fn open(url: &str) -> Result<Arc<dyn ObjectStore>, ConfigError> {
    let bad = |why: String| ConfigError::new(format!("--object-store '{url}': {why}"));
    let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
    match parsed.scheme() {
        "file" => {
            let path = parsed.to_file_path().map_err(|_| bad("not a local path".into()))?;
            weir_shared::durable_dir::create_dir_all(&path)
                .map_err(|e| bad(format!("cannot create {}: {e}", path.display())))?;
            // Synced (file and directory) before a PUT returns: an object is committed to
            // the index, and the WAL behind it reclaimed, as soon as its PUT returns, so
            // an object still in the page cache would be lost with the machine.
            let fs = LocalFileSystem::new_with_prefix(&path)
                .map_err(|e| bad(e.to_string()))?
                .with_fsync(true);
            // Large objects in synced steps: the WAL usually shares this disk.
            Ok(Arc::new(MeteredStore::new(SteppedLocalStore::new(fs))))
        }
        "s3" => {
            let bucket = parsed
                .host_str()
                .filter(|b| !b.is_empty())
                .ok_or_else(|| bad("missing bucket".into()))?;
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
            // Over TLS the body is already protected in transit, so hashing it again for
            // the signature only spends CPU on every upload (AWS's own SDKs sign
            // `UNSIGNED-PAYLOAD` over HTTPS too). Over plain HTTP the signed hash is the
            // only check that the stored body is the one sent, so it stays. An explicit
            // `AWS_UNSIGNED_PAYLOAD` wins either way.
            if std::env::var_os("AWS_UNSIGNED_PAYLOAD").is_none() {
                let endpoint = builder.get_config_value(&AmazonS3ConfigKey::Endpoint);
                builder = builder.with_unsigned_payload(reached_over_tls(endpoint.as_deref()));
            }
            let s3 = builder.build().map_err(|e| bad(e.to_string()))?;
            let prefix = parsed.path().trim_matches('/');
            // A PUT carrying a pace (compaction's) waits for its share first.
            // Every request counted, by what its key holds (above the bucket prefix).
            if prefix.is_empty() {
                Ok(Arc::new(MeteredStore::new(PacedStore::new(s3))))
            } else {
                Ok(Arc::new(MeteredStore::new(PacedStore::new(PrefixStore::new(
                    s3, prefix,
                )))))
            }
        }
        other => Err(bad(format!("scheme '{other}' is not supported; use file:// or s3://"))),
    }
}

/// Whether requests to `endpoint` go over TLS: AWS itself (no endpoint) and `https://`
/// endpoints do; a plain `http://` endpoint does not.
fn reached_over_tls(endpoint: Option<&str>) -> bool {
    endpoint.is_none_or(|e| e.trim().to_ascii_lowercase().starts_with("https://"))
}

#[cfg(test)]
mod tests {
    use super::reached_over_tls;

    #[test]
    fn only_tls_endpoints_skip_the_payload_hash() {
        assert!(reached_over_tls(None), "AWS itself is reached over HTTPS");
        assert!(reached_over_tls(Some("https://minio.internal:9000")));
        assert!(reached_over_tls(Some("HTTPS://s3.example.com")));
        assert!(!reached_over_tls(Some("http://127.0.0.1:9000")));
    }
}
