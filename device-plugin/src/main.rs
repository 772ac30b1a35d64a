//! `trainyard-device-plugin`: see the library for what it does.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tokio_util::sync::CancellationToken;
use trainyard_device_plugin::config::{Cli, Command, LogFormat, RunConfig};
use trainyard_device_plugin::labels::{self, LabelWriter};

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        // The default reports a failed write with eprintln!, which panics
        // when stderr is gone and would kill whichever task was logging.
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

async fn wait_for_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}

fn real_main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    // One thread is plenty for a handful of RPCs per pod start and keeps the
    // resident set small; NVML calls go to a small blocking pool.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(2)
        .thread_stack_size(512 * 1024)
        .build()
        .context("cannot start the async runtime")?;
    match cli.command {
        Command::Run(args) => {
            let mut config = RunConfig::try_from(*args)?;
            if config.node_name.is_some() {
                // Keep the Kubernetes client out of the long-lived process.
                let exe = std::env::current_exe().context("cannot find our own executable")?;
                config.label_writer = LabelWriter::Subprocess(exe);
            }
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                let signals = {
                    let shutdown = shutdown.clone();
                    tokio::spawn(async move {
                        if let Err(e) = wait_for_signal().await {
                            tracing::error!(error = %e, "cannot install signal handlers");
                            return;
                        }
                        shutdown.cancel();
                        tracing::info!("shutting down");
                    })
                };
                let result = trainyard_device_plugin::run(config, shutdown).await;
                signals.abort();
                result
            })?;
        }
        Command::ApplyLabels(args) => {
            let mut input = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut input)
                .context("cannot read labels from stdin")?;
            let wanted: BTreeMap<String, String> = serde_json::from_str(&input)
                .context("labels on stdin are not a JSON object of strings")?;
            let mode = if args.if_missing {
                labels::ApplyMode::IfMissing
            } else {
                labels::ApplyMode::Always
            };
            let outcome = runtime.block_on(labels::apply_once(&args.node_name, &wanted, mode))?;
            // The parent reads this to tell a re-apply from a no-op check.
            let _ = writeln!(std::io::stdout().lock(), "{}", outcome.as_str());
        }
        Command::Discover(args) => {
            let choice = args.backend.choice()?;
            let report = trainyard_device_plugin::discover(&choice)?;
            let json = serde_json::to_string_pretty(&report)?;
            // `discover | head` closing the pipe early is not an error worth a panic.
            if let Err(e) = writeln!(std::io::stdout().lock(), "{json}")
                && e.kind() != std::io::ErrorKind::BrokenPipe
            {
                return Err(e).context("cannot write the report");
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match real_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Most of our errors (and kube's) already print their cause; only
            // add the causes that the message does not contain yet.
            let mut message = e.to_string();
            for cause in e.chain().skip(1) {
                let cause = cause.to_string();
                if !message.contains(&cause) {
                    message.push_str(": ");
                    message.push_str(&cause);
                }
            }
            let _ = writeln!(std::io::stderr(), "error: {message}");
            ExitCode::FAILURE
        }
    }
}
