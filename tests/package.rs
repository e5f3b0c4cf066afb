//! What `cargo install --path .` installs: the manager alone. Test support
//! (the simulated kubelet) lives in the `testkit` workspace member, and the
//! test-only support (emulator accounts, the fake cloud) is a feature only the
//! test kit turns on.

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
        .arg(snm_testkit::repo_root().join("Cargo.toml"))
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
    // Test hooks (crash points, the emulator's accounts) are features the
    // product never turns on by itself; only the test kit asks for one.
    let features = product["features"].as_object().expect("features");
    for hook in ["fault-injection", "test-support"] {
        assert!(
            features.contains_key(hook),
            "feature {hook} missing: {features:?}"
        );
    }
    let default = features.get("default").and_then(|d| d.as_array());
    assert!(
        default.is_none_or(|d| d.is_empty()),
        "the product turns on features by default: {default:?}"
    );
    let kit_uses: Vec<&str> = testkit["dependencies"]
        .as_array()
        .expect("dependencies")
        .iter()
        .filter(|d| d["name"] == "spot-node-manager")
        .flat_map(|d| d["features"].as_array().into_iter().flatten())
        .filter_map(|f| f.as_str())
        .collect();
    assert_eq!(kit_uses, vec!["test-support"]);
}
