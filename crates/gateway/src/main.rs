//! An OpenAI-compatible LLM gateway guarded by every tailguard layer.
//!
//! ```text
//! cargo run --release -p tailguard-gateway                        # over embedded mock replicas
//! cargo run --release -p tailguard-gateway -- --upstream http://127.0.0.1:8000 --upstream http://127.0.0.1:8001
//! cargo run --release -p tailguard-gateway -- --config crates/gateway/gateway.toml
//! cargo run --release -p tailguard-gateway -- --help               # every flag and variable
//! ```
//!
//! The gateway itself is `tailguard_gateway` (in this package's library, so tests can
//! start it in-process); this program reads the configuration, sets up logging, prints how to
//! try it and waits for Ctrl-C.

use std::process::ExitCode;

use tailguard_gateway::{Args, Config, Gateway};
use tracing_subscriber::EnvFilter;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::from_command_line();
    let config = match Config::load(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();

    let gateway = match Gateway::start(config.clone()).await {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: cannot start the gateway on {}: {e}", config.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = gateway.addr();
    println!("tailguard gateway listening on http://{addr}");
    for (i, (url, kind)) in gateway.upstreams().iter().enumerate() {
        println!("  upstream {i}: {url} ({kind})");
    }
    println!("  metrics:    http://{addr}/metrics");
    println!("  health:     http://{addr}/healthz");
    println!("try:");
    let model = config.models.first().map_or("mock-llm", String::as_str);
    println!("  {}", gateway.curl_line(model));
    println!(
        "Ctrl-C stops accepting, lets streams finish for {:?}, then ends them in-band.",
        gateway.grace()
    );

    shutdown_signal().await;
    tokio::select! {
        r = gateway.shutdown() => match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        // A second Ctrl-C does not wait for the grace period.
        _ = tokio::signal::ctrl_c() => {
            eprintln!("second Ctrl-C: exiting without waiting for in-flight streams");
            ExitCode::from(130)
        }
    }
}

/// Ctrl-C, or SIGTERM where there is one (what container runtimes send).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
