//! A real S3-protocol server process (s3s-fs) on loopback, one per test.

use crate::{free_port, wait_for};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const ACCESS_KEY: &str = "weir-test";
pub const SECRET_KEY: &str = "weir-test-secret";
pub const BUCKET: &str = "weir";

/// The s3s-fs binary: `$S3S_FS`, or on `PATH`, or where `.ci/run` installs it.
pub fn s3s_fs_path() -> PathBuf {
    if let Some(p) = std::env::var_os("S3S_FS") {
        return PathBuf::from(p);
    }
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/var/cache/weir/tools/bin"])
    {
        let p = PathBuf::from(dir).join("s3s-fs");
        if p.exists() {
            return p;
        }
    }
    panic!("s3s-fs is not installed: run .ci/run, or `cargo install --locked s3s-fs@0.14.1 --features binary`");
}

/// A running s3s-fs serving `dir`, with bucket [`BUCKET`] created.
pub struct S3Server {
    pub endpoint: String,
    pub dir: tempfile::TempDir,
    child: Child,
}

impl S3Server {
    pub async fn start() -> S3Server {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join(BUCKET)).expect("bucket dir");
        let port = free_port();
        let child = Command::new(s3s_fs_path())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn s3s-fs");
        let endpoint = format!("http://127.0.0.1:{port}");
        wait_for("s3s-fs to listen", Duration::from_secs(10), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        })
        .await;
        S3Server { endpoint, dir, child }
    }

    /// The environment object_store's S3 client reads.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ENDPOINT".into(), self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), SECRET_KEY.into()),
            ("AWS_REGION".into(), "us-east-1".into()),
            ("AWS_ALLOW_HTTP".into(), "true".into()),
        ]
    }

    pub fn url(&self) -> String {
        format!("s3://{BUCKET}")
    }

    /// A client of the bucket, as a node has it.
    pub fn store(&self) -> object_store::aws::AmazonS3 {
        object_store::aws::AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_bucket_name(BUCKET)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .with_region("us-east-1")
            .with_allow_http(true)
            .build()
            .expect("s3 client")
    }

    /// Puts object `key`, as an uploader would.
    pub async fn put(&self, key: &str, bytes: &[u8]) {
        use object_store::ObjectStoreExt;
        self.store()
            .put(&object_store::path::Path::from(key), bytes.to_vec().into())
            .await
            .expect("put");
    }

    /// Whether object `key` exists.
    pub async fn exists(&self, key: &str) -> bool {
        use object_store::ObjectStoreExt;
        self.store().head(&object_store::path::Path::from(key)).await.is_ok()
    }

    /// Where the server keeps object `key` on disk.
    pub fn object_path(&self, key: &str) -> PathBuf {
        self.dir.path().join(BUCKET).join(key)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
