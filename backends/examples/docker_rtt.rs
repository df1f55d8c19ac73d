//! Round-trip probe (development aid): echo lines through `cat` in an attached exec.
use berth_backends::docker::DockerBackend;
use berth_core::backend::{Backend, RemoveOpts, SandboxSpec, SpawnOpts};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let backend = DockerBackend::connect().await?;
    let name = format!("rtt-{}", std::process::id());
    let sb = backend.provision(&SandboxSpec::named(&name)).await?.sandbox;
    for prog in ["cat", "bash"] {
        let argv = vec![prog.to_string()];
        let mut p = sb.spawn(&argv, SpawnOpts::default()).await?;
        let mut i = p.take_stdin().ok_or("stdin")?;
        let mut o = p.take_stdout().ok_or("stdout")?;
        let mut buf = [0u8; 64];
        let line: &[u8] = if prog == "cat" { b"x\n" } else { b"echo x\n" };
        let t = std::time::Instant::now();
        for _ in 0..200 {
            i.write_all(line).await?;
            i.flush().await?;
            let n = o.read(&mut buf).await?;
            assert!(n > 0);
        }
        println!(
            "{prog}: {:.3} ms/round trip",
            t.elapsed().as_secs_f64() * 1e3 / 200.0
        );
    }
    backend.remove(&name, RemoveOpts { volumes: true }).await?;
    Ok(())
}
