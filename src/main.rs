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
        .init();
    match cmd::run(cmd::Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            #[expect(clippy::print_stderr, reason = "the CLI's error output")]
            {
                eprintln!("error: {error:#}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
