//! Generates the Modal gRPC client from berth's own subset of Modal's public
//! protos (`proto/modal_proto/`), with the pure-Rust `protox` compiler so the
//! build needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("CARGO_FEATURE_MODAL").is_none() {
        return Ok(());
    }
    #[cfg(feature = "modal")]
    {
        let root = "../proto";
        let files = [
            "modal_proto/api.proto",
            "modal_proto/task_command_router.proto",
        ];
        for f in &files {
            println!("cargo:rerun-if-changed={root}/{f}");
        }
        let fds = protox::compile(files, [root])?;
        tonic_prost_build::configure()
            .build_server(false)
            .build_transport(true)
            .compile_fds(fds)?;
    }
    Ok(())
}
