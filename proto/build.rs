//! Generates the gRPC code from `proto/` with protox, so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/weir/raft/v1/raft.proto",
        "proto/weir/metad/v1/metad.proto",
        "proto/weir/streamd/v1/streamd.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
