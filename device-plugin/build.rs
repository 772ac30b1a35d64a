//! Compiles the vendored kubelet device-plugin API with a pure-Rust protobuf
//! compiler, so building needs no system `protoc`.

use std::error::Error;

fn main() -> Result<(), Box<dyn Error>> {
    let proto_dir = "proto";
    let proto = "proto/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], [proto_dir])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
