//! The committed CRD YAML must match the Rust types.

#[test]
fn committed_crds_match_the_rust_types() {
    let dir = snm_testkit::repo_root().join("manifests/crds");
    for (file, crd) in spot_node_manager::crd::all() {
        let generated = spot_node_manager::crd::to_yaml(&crd).expect("serialize CRD");
        let committed = std::fs::read_to_string(dir.join(file))
            .unwrap_or_else(|e| panic!("manifests/crds/{file} missing ({e}); run: cargo run -- crd --out-dir manifests/crds"));
        assert!(
            generated == committed,
            "manifests/crds/{file} drifted from the Rust types; regenerate with: cargo run -- crd --out-dir manifests/crds"
        );
    }
}

#[test]
fn every_crd_is_in_the_nodemanager_group_with_status_and_short_names() {
    let crds = spot_node_manager::crd::all();
    assert_eq!(crds.len(), 3);
    for (_, crd) in crds {
        assert_eq!(crd.spec.group, "nodemanager.dev");
        assert_eq!(crd.spec.scope, "Namespaced");
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        assert!(
            !crd.spec
                .names
                .short_names
                .clone()
                .unwrap_or_default()
                .is_empty()
        );
        assert!(
            version
                .additional_printer_columns
                .as_ref()
                .is_some_and(|c| c.len() >= 3)
        );
    }
}

#[test]
fn kubectl_get_nodegroups_wide_shows_the_last_interruption() {
    use kube::CustomResourceExt;
    let crd = spot_node_manager::crd::NodeGroup::crd();
    let columns = crd.spec.versions[0]
        .additional_printer_columns
        .clone()
        .unwrap_or_default();
    let column = columns
        .iter()
        .find(|c| c.name == "Last Interruption")
        .expect("the column");
    assert_eq!(column.json_path, ".status.lastInterruption.noticed");
    assert_eq!(column.type_, "date");
    assert_eq!(column.priority, Some(1), "-o wide only");
}
