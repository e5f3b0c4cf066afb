//! docs/reference/{nodegroup,refresher,replenisher}.md, from the CRDs the
//! manager installs (`crate::crd::all`), whose schemas carry the doc
//! comments of the crd types.

use super::schema::{cell, fields, table};
use serde_json::Value;

/// What each kind is for, in a line (the schema's own top description is
/// kube's boilerplate).
fn intro(kind: &str) -> &'static str {
    match kind {
        "NodeGroup" => {
            "One per kops master or worker instance group, written by you: which ASGs, how many Ready nodes, when to refresh, what to do with drift, interruptions and disruption. Its status is the inventory (written by the manager)."
        }
        "Refresher" => {
            "Created by the manager, one per NodeGroup with `refresh` or `drift.action: Replace` (owned by it; do not write one). Its status is the persisted state of the refresh and drift runs: the next run, the run in progress, the last run."
        }
        _ => {
            "Created by the manager, one per NodeGroup unless `replenish.enabled` is false (owned by it; do not write one). Its status is the persisted state of the replenisher: raises, removals, repairs and replacements in flight, and the last action."
        }
    }
}

pub fn pages() -> Result<Vec<(&'static str, String)>, String> {
    crate::crd::all()
        .into_iter()
        .map(|(file, crd)| {
            let value = serde_json::to_value(&crd).map_err(|e| format!("{file}: {e}"))?;
            let name = match file {
                "nodegroups.yaml" => "nodegroup.md",
                "refreshers.yaml" => "refresher.md",
                _ => "replenisher.md",
            };
            Ok((name, page(&value)))
        })
        .collect()
}

fn page(crd: &Value) -> String {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let kind = names["kind"].as_str().unwrap_or_default();
    let version = &spec["versions"][0];
    let short: Vec<String> = names["shortNames"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|s| format!("`{s}`"))
                .collect()
        })
        .unwrap_or_default();
    let mut out = format!(
        "{}# {kind}\n\n`{}/{}`, namespaced; `kubectl get {}` (short: {}).\n\n{}\n\n",
        super::HEADER,
        spec["group"].as_str().unwrap_or_default(),
        version["name"].as_str().unwrap_or_default(),
        names["plural"].as_str().unwrap_or_default(),
        short.join(", "),
        intro(kind)
    );
    out.push_str(&columns(version));
    let schema = &version["schema"]["openAPIV3Schema"]["properties"];
    for part in ["spec", "status"] {
        let rows = fields(&schema[part], &Value::Null, part);
        if rows.is_empty() {
            continue;
        }
        out.push_str(&format!("\n## `{part}`\n\n{}", table(&rows)));
    }
    out
}

/// The printer columns: what `kubectl get` (and `-o wide`) shows.
fn columns(version: &Value) -> String {
    let Some(cols) = version["additionalPrinterColumns"].as_array() else {
        return String::new();
    };
    let mut out = String::from("## Columns\n\n| column | shown | from |\n|---|---|---|\n");
    for c in cols {
        let wide = c["priority"].as_i64().unwrap_or(0) > 0;
        out.push_str(&format!(
            "| {} | {} | `{}` |\n",
            cell(c["name"].as_str().unwrap_or_default()),
            if wide { "`-o wide`" } else { "always" },
            c["jsonPath"].as_str().unwrap_or_default()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The meaning of every field, spec and status, lives in its doc comment.
    #[test]
    fn every_field_says_what_it_means() {
        for (name, text) in pages().expect("pages") {
            let rows: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("| `spec.") || l.starts_with("| `status."))
                .collect();
            assert!(rows.len() > 20, "{name}: {} rows", rows.len());
            for row in rows {
                assert!(
                    !row.ends_with("|  |"),
                    "{name}: {row} has no description (write its doc comment)"
                );
            }
        }
    }
}
