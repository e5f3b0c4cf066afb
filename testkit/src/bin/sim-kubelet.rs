//! Test support: runs the simulated kubelet (see `snm_testkit::sim`)
//! against a kubeconfig and an AWS endpoint (the moto emulator).

use clap::Parser;
use snm_testkit::sim::{SimConfig, SimKubelet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(about = "Simulated kubelet: registers the emulator's instances as Nodes")]
struct Args {
    #[arg(long)]
    kubeconfig: PathBuf,
    #[arg(long)]
    aws_endpoint: String,
    #[arg(long, default_value = "ap-northeast-1")]
    aws_region: String,
    /// Emulator account (x-moto-account-id); the default account when unset.
    #[arg(long)]
    aws_emulator_account: Option<String>,
    #[arg(long, default_value = "3s")]
    register_delay: String,
    #[arg(long, default_value = "5s")]
    ready_delay: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    spot_node_manager::telemetry::init(spot_node_manager::config::LogFormat::Text, "info");
    let parse = |field: &str, v: &str| {
        spot_node_manager::duration::parse(v).map_err(|e| format!("--{field}: {e}"))
    };
    let (register_delay, ready_delay) = match (
        parse("register-delay", &args.register_delay),
        parse("ready-delay", &args.ready_delay),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("sim-kubelet: {e}");
            return ExitCode::from(2);
        }
    };
    let (client, aws) = match snm_testkit::binary_clients(
        &args.kubeconfig,
        &args.aws_endpoint,
        &args.aws_region,
        args.aws_emulator_account.as_deref(),
    )
    .await
    {
        Ok(clients) => clients,
        Err(e) => {
            eprintln!("sim-kubelet: {e}");
            return ExitCode::FAILURE;
        }
    };
    let config = SimConfig {
        register_delay,
        ready_delay,
        poll: Duration::from_millis(500),
        account: args
            .aws_emulator_account
            .unwrap_or_else(|| "default".into()),
        ..SimConfig::default()
    };
    let shutdown = CancellationToken::new();
    spot_node_manager::manager::spawn_signal_handler(shutdown.clone());
    SimKubelet::new(client, aws, config).run(shutdown).await;
    ExitCode::SUCCESS
}
