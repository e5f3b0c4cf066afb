use clap::Parser;
use spot_node_manager::config::{Cli, Command, PreviewOutput, RunArgs, Settings};
use spot_node_manager::{
    check, crd, iam_policy, manager, preview as previews, reference, telemetry,
};
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    spot_node_manager::heap_trim::configure();
    // Two workers whatever the core count: the manager waits on the network;
    // a worker per core (64 on a large node) costs a stack each for nothing.
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run()),
        Err(e) => {
            eprintln!("spot-node-manager: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd { out_dir } => print_crds(out_dir),
        Command::Reference { out_dir } => write_reference(&out_dir),
        Command::Preview { run, output, file } => preview(&run, output, file.as_deref()).await,
        Command::Check { run, output } => check(&run, output).await,
        Command::IamPolicy {
            cluster,
            account,
            region,
            queue_name,
            partition,
            statements,
        } => {
            let values = iam_policy::ClusterValues {
                cluster,
                account,
                region,
                partition,
                queue: queue_name,
            };
            print_iam_policy(&values, statements)
        }
        Command::Run(args) => {
            let settings = match Settings::load(&args) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("spot-node-manager: invalid configuration: {e}");
                    return ExitCode::from(2);
                }
            };
            telemetry::init(settings.log_format, &settings.log_level);
            let shutdown = CancellationToken::new();
            manager::spawn_signal_handler(shutdown.clone());
            match manager::run(settings, shutdown).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, category = e.category(), "spot-node-manager failed");
                    eprintln!("spot-node-manager: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn print_crds(out_dir: Option<std::path::PathBuf>) -> ExitCode {
    let result = match out_dir {
        None => crd::all_yaml()
            .map(|y| print!("{y}"))
            .map_err(|e| e.to_string()),
        Some(dir) => crd::all().into_iter().try_for_each(|(file, crd)| {
            let yaml = crd::to_yaml(&crd).map_err(|e| e.to_string())?;
            std::fs::write(dir.join(file), yaml)
                .map_err(|e| format!("{}: {e}", dir.join(file).display()))
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spot-node-manager crd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write_reference(dir: &std::path::Path) -> ExitCode {
    let result = reference::pages()
        .and_then(|pages| {
            pages.into_iter().try_for_each(|(file, text)| {
                std::fs::write(dir.join(file), text)
                    .map_err(|e| format!("{}: {e}", dir.join(file).display()))
            })
        })
        .and_then(|()| reference::write_embedded(dir));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spot-node-manager reference: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The settings of a read-only subcommand (`preview`, `check`), exit 2 on
/// a bad configuration; logs go to stderr only when asked (RUST_LOG), since
/// stdout is the answer.
fn read_only_settings(args: &RunArgs) -> Result<Settings, ExitCode> {
    let settings = Settings::load(args).map_err(|e| {
        eprintln!("spot-node-manager: invalid configuration: {e}");
        ExitCode::from(2)
    })?;
    if std::env::var_os("RUST_LOG").is_some() {
        telemetry::init(settings.log_format, &settings.log_level);
    }
    Ok(settings)
}

/// Prints subcommand `name`'s answer as text (`text`) or JSON.
fn print_answer<T: serde::Serialize>(
    name: &str,
    output: PreviewOutput,
    answer: &T,
    text: impl FnOnce(&T) -> String,
) -> Result<(), ExitCode> {
    match output {
        PreviewOutput::Text => print!("{}", text(answer)),
        PreviewOutput::Json => {
            let json = serde_json::to_string_pretty(answer).map_err(|e| {
                eprintln!("spot-node-manager {name}: {e}");
                ExitCode::FAILURE
            })?;
            println!("{json}");
        }
    }
    Ok(())
}

async fn preview(
    args: &RunArgs,
    output: PreviewOutput,
    file: Option<&std::path::Path>,
) -> ExitCode {
    let settings = match read_only_settings(args) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let proposed = match file.map(previews::read_proposal).transpose() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("spot-node-manager preview: {e}");
            return ExitCode::from(2);
        }
    };
    let answer = match previews::run(settings, proposed).await {
        Ok(answer) => answer,
        Err(e) => {
            eprintln!("spot-node-manager preview: {e}");
            return ExitCode::FAILURE;
        }
    };
    match print_answer("preview", output, &answer, |a| previews::text(a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => code,
    }
}

/// Exit 1 when a finding blocks operation, 2 when check itself could not
/// run.
async fn check(args: &RunArgs, output: PreviewOutput) -> ExitCode {
    let settings = match read_only_settings(args) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let findings = match check::run(settings).await {
        Ok(findings) => findings,
        Err(e) => {
            eprintln!("spot-node-manager check: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(code) = print_answer("check", output, &findings, |f| check::text(f)) {
        return code;
    }
    match check::passes(&findings) {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    }
}

fn print_iam_policy(values: &iam_policy::ClusterValues, statements: bool) -> ExitCode {
    let policy = match iam_policy::policy(values) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("spot-node-manager iam-policy: {e}");
            return ExitCode::from(2);
        }
    };
    let printed = match statements {
        true => &policy["Statement"],
        false => &policy,
    };
    match serde_json::to_string_pretty(printed) {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("spot-node-manager iam-policy: {e}");
            ExitCode::FAILURE
        }
    }
}
