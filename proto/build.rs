//! Generates the gRPC code from `proto/` with protox, so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/weir/raft/v1/raft.proto",
        "proto/weir/metad/v1/metad.proto",
        "proto/weir/streamd/v1/streamd.proto",
    ];
    println!("cargo:rerun-if-changed=build.rs");
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    // The data plane's payloads are `Bytes`: a record batch goes from the Kafka socket
    // to the WAL and back to a Fetch response without being copied into a `Vec`.
    tonic_prost_build::configure()
        .bytes(".weir.streamd.v1")
        // Messages are encoded into a buffer reserved to their size (src/codec.rs).
        .codec_path("crate::codec::SizedProstCodec")
        .compile_fds(descriptors)?;
    Ok(())
}
