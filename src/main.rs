mod sandbox_exec;

fn main() -> std::process::ExitCode {
    // The local exec wrapper runs before anything else exists in the process.
    if let Some(code) = sandbox_exec::dispatch() {
        return code;
    }
    std::process::ExitCode::SUCCESS
}
