//! Generates berth's typed API (`proto/berth/v1.proto`), client and server,
//! with the pure-Rust `protox` compiler so the build needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = "proto";
    let file = "berth/v1.proto";
    println!("cargo:rerun-if-changed={root}/{file}");
    let fds = protox::compile([file], [root])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .compile_fds(fds)?;
    Ok(())
}
