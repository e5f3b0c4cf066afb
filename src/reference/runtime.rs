//! docs/reference/configuration.md: the subcommands, the config file's
//! fields (from its schema, i.e. the doc comments of `config::file`) and
//! the flags of `run` (from clap, i.e. the doc comments of `RunArgs`).

use super::schema::{cell, fields, table};
use crate::config::Cli;
use crate::config::file::FileConfig;
use clap::CommandFactory;

pub fn page() -> String {
    let mut out = format!(
        "{}# Configuration\n\n`spot-node-manager run [--config FILE] [flags]` runs the manager. A flag overrides the file's field of the same meaning. A bad field or flag exits with status 2 and a message naming it.\n\n## Subcommands\n\n| subcommand | what it does |\n|---|---|\n",
        super::HEADER
    );
    let cli = Cli::command();
    for sub in cli.get_subcommands() {
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        out.push_str(&format!("| `{}` | {} |\n", sub.get_name(), cell(&about)));
    }
    out.push_str(&file_fields());
    out.push_str(&flags(&cli));
    out
}

fn file_fields() -> String {
    let schema = serde_json::to_value(schemars::schema_for!(FileConfig)).unwrap_or_default();
    let defs = schema.get("$defs").cloned().unwrap_or_default();
    // Sections (objects) are headings' business; the table lists leaves.
    let rows: Vec<_> = fields(&schema, &defs, "")
        .into_iter()
        .filter(|f| f.type_ != "object")
        .collect();
    format!(
        "\n## The config file\n\nYAML; every field optional; unknown fields are errors. An example with the defaults: `config/spot-node-manager.yaml`. Durations are Go-style (`90s`, `5m`, `1h30m`).\n\n{}",
        table(&rows)
    )
}

fn flags(cli: &clap::Command) -> String {
    let run = cli.get_subcommands().find(|s| s.get_name() == "run");
    let preview = cli.get_subcommands().find(|s| s.get_name() == "preview");
    let run_flags: Vec<&clap::Arg> = run.map(|r| r.get_arguments().collect()).unwrap_or_default();
    let own: Vec<&clap::Arg> = preview
        .map(|p| {
            p.get_arguments()
                .filter(|a| !run_flags.iter().any(|r| r.get_id() == a.get_id()))
                .collect()
        })
        .unwrap_or_default();
    format!(
        "\n## Flags of `run`\n\n{}\n## Flags of `preview`, besides those of `run`\n\n{}",
        flag_table(&run_flags),
        flag_table(&own)
    )
}

fn flag_table(args: &[&clap::Arg]) -> String {
    let mut out = String::from("| flag | environment | meaning |\n|---|---|---|\n");
    for arg in args.iter().filter(|a| !a.is_hide_set()) {
        let Some(long) = arg.get_long() else {
            continue;
        };
        let name = match arg.get_short() {
            Some(short) => format!("`--{long}`, `-{short}`"),
            None => format!("`--{long}`"),
        };
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        out.push_str(&format!("| {name} | {env} | {} |\n", cell(&help)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_field_and_flag_is_described() {
        let text = page();
        for row in text.lines().filter(|l| l.starts_with("| `")) {
            let meaning = row
                .trim_end_matches(" |")
                .rsplit(" | ")
                .next()
                .unwrap_or_default();
            assert!(
                meaning.len() > 10,
                "{row} has no description (write its doc comment)"
            );
        }
        for needed in [
            "`aws.region`",
            "`leaderElection.renewDeadline`",
            "`--dry-run`",
            "`--config`, `-c`",
        ] {
            assert!(text.contains(needed), "{needed} missing");
        }
    }
}
