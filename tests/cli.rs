//! The binary's command line: bad configuration exits non-zero naming the field.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spot-node-manager"))
        .args(args)
        .env_remove("SNM_CONFIG")
        .output()
        .expect("run binary");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn with_config(yaml: &str) -> (i32, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, yaml).expect("write config");
    let (code, _, stderr) = run(&["run", "--config", path.to_str().expect("utf-8 path")]);
    (code, stderr)
}

#[test]
fn version_names_the_release_and_the_commit_built_from() {
    let (code, stdout, stderr) = run(&["--version"]);
    assert_eq!(code, 0, "{stderr}");
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    assert_eq!(
        stdout.trim(),
        format!(
            "spot-node-manager {} (commit {head})",
            env!("CARGO_PKG_VERSION")
        )
    );
}

#[test]
fn a_bad_config_field_exits_2_naming_the_field() {
    let cases = [
        (
            "leaderElection:\n  leaseDuration: soon\n",
            "leaderElection.leaseDuration",
        ),
        ("admin:\n  address: 8080\n", "admin.address"),
        ("aws:\n  endpoint: localhost:5000\n", "aws.endpoint"),
        ("log:\n  format: xml\n", "log.format"),
        ("namespaces: [a]\n", "namespaces"),
    ];
    for (yaml, field) in cases {
        let (code, stderr) = with_config(yaml);
        assert_eq!(code, 2, "exit code for {yaml:?}: {stderr}");
        assert!(stderr.contains("invalid configuration"), "{stderr}");
        assert!(
            stderr.contains(field),
            "message for {yaml:?} must name {field}: {stderr}"
        );
    }
}

#[test]
fn a_missing_config_file_is_named() {
    let (code, _, stderr) = run(&["run", "--config", "/nonexistent/snm.yaml"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("/nonexistent/snm.yaml"), "{stderr}");
}

#[test]
fn a_bad_flag_value_is_named() {
    let (code, _, stderr) = run(&["run", "--log-format", "xml"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("--log-format"), "{stderr}");
    let (code, _, stderr) = run(&["run", "--admin-address", "nowhere"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("admin.address"), "{stderr}");
}

#[test]
fn crd_prints_all_three_crds() {
    let (code, stdout, stderr) = run(&["crd"]);
    assert_eq!(code, 0, "{stderr}");
    for name in [
        "nodegroups.nodemanager.dev",
        "refreshers.nodemanager.dev",
        "replenishers.nodemanager.dev",
    ] {
        assert!(stdout.contains(&format!("name: {name}")), "missing {name}");
    }
    assert_eq!(stdout.matches("kind: CustomResourceDefinition").count(), 3);
}

/// `iam-policy` prints the shipped policy with a cluster's values (the
/// statements alone with --statements, as kops's inlinePolicy takes them),
/// and refuses a value that cannot be in an ARN, naming the flag.
#[test]
fn iam_policy_fills_in_a_clusters_values() {
    let args = [
        "iam-policy",
        "--cluster",
        "prod.k8s.local",
        "--account",
        "210987654321",
        "--region",
        "eu-west-1",
    ];
    let (code, stdout, stderr) = run(&args);
    assert_eq!(code, 0, "{stderr}");
    let policy: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(policy["Version"], "2012-10-17");
    let text = policy.to_string();
    assert!(
        text.contains("arn:aws:sqs:eu-west-1:210987654321:prod-k8s-local-interruptions")
            && text.contains(r#""aws:ResourceTag/KubernetesCluster":"prod.k8s.local""#)
            && !text.contains("example.com")
            && !text.contains("123456789012"),
        "{text}"
    );
    let (code, stdout, stderr) = run(&[&args[..], &["--statements"]].concat());
    assert_eq!(code, 0, "{stderr}");
    let statements: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(statements, policy["Statement"]);
    let (code, _, stderr) = run(&[&args[..4], &["12345"], &args[5..]].concat());
    assert_eq!(code, 2);
    assert!(
        stderr.contains("--account: \"12345\" is not a 12-digit AWS account id"),
        "{stderr}"
    );
}
