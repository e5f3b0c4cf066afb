//! What `cargo install --path .` installs: the manager alone. Test support
//! (the simulated kubelet) lives in the `testkit` workspace member.

use std::process::Command;

#[test]
fn the_product_package_installs_only_the_manager() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--manifest-path",
        ])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let product = packages
        .iter()
        .find(|p| p["name"] == "spot-node-manager")
        .expect("the product package");
    let bins: Vec<&str> = product["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .filter(|t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"))
        })
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(bins, vec!["spot-node-manager"]);
    // The simulated kubelet comes from the test kit, a dev-dependency only.
    let testkit = packages
        .iter()
        .find(|p| p["name"] == "snm-testkit")
        .expect("the test kit is a workspace member");
    assert!(
        testkit["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .any(|t| t["name"] == "sim-kubelet"),
        "{testkit}"
    );
    let normal_deps: Vec<&str> = product["dependencies"]
        .as_array()
        .expect("dependencies")
        .iter()
        .filter(|d| d["kind"].is_null())
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert!(
        !normal_deps.contains(&"snm-testkit"),
        "the product must not depend on its test kit: {normal_deps:?}"
    );
}
