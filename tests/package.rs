//! What `cargo install --path .` installs: the manager alone. Test support
//! (the simulated kubelet) lives in the `testkit` workspace member, and the
//! test-only support (emulator accounts, the fake cloud) is a feature only the
//! test kit turns on.

use std::process::Command;

/// `cargo metadata` of the workspace, with `flag` (`--no-deps`: our packages
/// only; `--locked`: the whole graph as locked).
fn metadata(flag: &str) -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", flag, "--format-version", "1", "--manifest-path"])
        .arg(snm_testkit::repo_root().join("Cargo.toml"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("metadata JSON")
}

#[test]
fn the_product_package_installs_only_the_manager() {
    let metadata = metadata("--no-deps");
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

fn version(text: &str) -> Vec<u64> {
    let mut parts: Vec<u64> = text
        .split('.')
        .map(|p| {
            p.parse()
                .unwrap_or_else(|_| panic!("not a version: {text}"))
        })
        .collect();
    parts.resize(3, 0);
    parts
}

/// The rust-version we declare is one the locked dependencies build with,
/// and the Containerfile builds with exactly that toolchain: a user building
/// the image elsewhere must not meet "requires rustc 1.9x".
#[test]
fn the_declared_rust_version_builds_every_dependency_and_the_image_uses_it() {
    let metadata = metadata("--locked");
    let packages = metadata["packages"].as_array().expect("packages");
    let ours = packages
        .iter()
        .find(|p| p["name"] == "spot-node-manager")
        .and_then(|p| p["rust_version"].as_str())
        .expect("spot-node-manager declares a rust-version");
    let needed = packages
        .iter()
        .filter_map(|p| {
            Some((
                version(p["rust_version"].as_str()?),
                p["name"].as_str()?.to_string(),
            ))
        })
        .max()
        .expect("some package declares a rust-version");
    assert!(
        version(ours) >= needed.0,
        "rust-version {ours} is older than {:?} needs ({:?})",
        needed.1,
        needed.0
    );
    let containerfile = std::fs::read_to_string(snm_testkit::repo_root().join("Containerfile"))
        .expect("the Containerfile");
    let image = containerfile
        .lines()
        .find_map(|l| l.strip_prefix("ARG RUST_IMAGE="))
        .expect("ARG RUST_IMAGE= in the Containerfile");
    let tag = image
        .rsplit_once(':')
        .and_then(|(_, tag)| tag.strip_suffix("-bookworm"))
        .unwrap_or_else(|| panic!("not a rust:<version>-bookworm image: {image}"));
    assert_eq!(version(tag), version(ours), "the image builds with {image}");
}

/// The manager is linked with packed relative relocations (build.rs): its
/// resident set at 1,000 nodes was 2.7 MiB larger with the plain table,
/// which the loader reads whole at start (benches/footprint.rs).
#[test]
fn the_manager_binary_packs_its_relative_relocations() {
    let binary = snm_testkit::manager::manager_binary();
    let out = Command::new("readelf")
        .arg("--dynamic")
        .arg(&binary)
        .output()
        .expect("run readelf (binutils, which links the manager)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dynamic = String::from_utf8_lossy(&out.stdout);
    assert!(
        dynamic.contains("(RELR)"),
        "{} has no DT_RELR entry: build.rs's -z pack-relative-relocs was not applied\n{dynamic}",
        binary.display()
    );
}
