//! Generates the Modal stand-in's server code from the protos in `proto/`
//! (a subset of Modal's public spec), with the pure-Rust `protox` compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(feature = "modal")]
    {
        let root = "../../proto";
        let files = [
            "modal_proto/api.proto",
            "modal_proto/task_command_router.proto",
        ];
        for f in &files {
            println!("cargo:rerun-if-changed={root}/{f}");
        }
        let fds = protox::compile(files, [root])?;
        tonic_prost_build::configure()
            .build_client(false)
            .build_server(true)
            .generate_default_stubs(true)
            .compile_fds(fds)?;
    }
    Ok(())
}
