//! The `xp` command line: submit experiments, watch them, read logs, benchmark.

use clap::Parser;

mod cmd;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("XP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A log line that cannot be written (stderr a closed pipe) is dropped:
        // reporting that on stderr would panic.
        .log_internal_errors(false)
        .init();
    match cmd::run(cmd::Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            cmd::eprintln_note(&format!("error: {error:#}"));
            std::process::ExitCode::from(cmd::exit_code(&error))
        }
    }
}
