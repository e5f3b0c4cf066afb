//! docs/kops.md's snippets are real: the kops objects use only fields listed
//! in docs/kops-fields.txt (each checked against kops's v1alpha2 API types),
//! the IAM policy they carry is manifests/iam-policy.json's, our own objects
//! are accepted by the apiserver, the worked NodeGroups are the example
//! overlay's, and the repository paths the commands name exist.

use snm_testkit as support;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::Discovery;
use serde::Deserialize;
use serde_yaml::Value;
use spot_node_manager::crd::NodeGroup;
use std::collections::BTreeSet;

/// The guide's fenced blocks: (language, text).
fn blocks(markdown: &str) -> Vec<(String, String)> {
    let mut out = vec![];
    // A block inside a list item is indented: its fence's indent is taken
    // off each of its lines.
    let mut current: Option<(String, String, usize)> = None;
    for line in markdown.lines() {
        let indent = line.len() - line.trim_start().len();
        match (&mut current, line.trim_start().strip_prefix("```")) {
            (None, Some(lang)) => current = Some((lang.trim().to_string(), String::new(), indent)),
            (Some(_), Some(_)) => out.extend(current.take().map(|(lang, text, _)| (lang, text))),
            (Some((_, text, fence)), None) => {
                text.push_str(&line[indent.min(*fence)..]);
                text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(current.is_none(), "an unclosed code block in the guide");
    out
}

fn guide() -> String {
    std::fs::read_to_string(support::repo_root().join("docs/kops.md")).expect("docs/kops.md")
}

/// (kind, path) of every kops field docs/kops-fields.txt lists.
fn listed_fields() -> BTreeSet<(String, String)> {
    std::fs::read_to_string(support::repo_root().join("docs/kops-fields.txt"))
        .expect("docs/kops-fields.txt")
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut words = l.split_whitespace();
            match (words.next(), words.next()) {
                (Some(kind), Some(path)) => (kind.to_string(), path.to_string()),
                _ => panic!("not `<kind> <path> <kops field>`: {l}"),
            }
        })
        .collect()
}

/// Every leaf path under `value` (`a.b`, `a[].b` for list items).
fn paths(prefix: &str, value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Mapping(map) => {
            for (key, child) in map {
                let key = key.as_str().expect("string keys");
                paths(&format!("{prefix}.{key}"), child, out);
            }
        }
        Value::Sequence(items) if items.iter().any(|i| i.is_mapping()) => {
            for item in items {
                paths(&format!("{prefix}[]"), item, out);
            }
        }
        Value::Sequence(_) => out.push(format!("{prefix}[]")),
        _ => out.push(prefix.to_string()),
    }
}

fn documents(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("a YAML block: {e}\n{text}")))
        .collect()
}

fn is_kops(doc: &Value) -> bool {
    doc["apiVersion"].as_str() == Some("kops.k8s.io/v1alpha2")
}

#[test]
fn kops_snippets_use_only_fields_kops_has() {
    let listed = listed_fields();
    let mut used = BTreeSet::new();
    let mut kops_docs = 0;
    for (lang, text) in blocks(&guide()) {
        if lang != "yaml" {
            continue;
        }
        for doc in documents(&text).into_iter().filter(is_kops) {
            kops_docs += 1;
            let kind = doc["kind"].as_str().expect("a kops object names its kind");
            assert!(
                ["Cluster", "InstanceGroup"].contains(&kind),
                "kops kind {kind}"
            );
            assert!(
                doc["metadata"]["name"].is_string(),
                "a kops {kind} without a name"
            );
            let mut found = vec![];
            paths("spec", &doc["spec"], &mut found);
            for path in found {
                let key = (kind.to_string(), path);
                assert!(
                    listed.contains(&key),
                    "{kind} field {} is not in docs/kops-fields.txt (check it against kops's API types, then list it)",
                    key.1
                );
                used.insert(key);
            }
        }
    }
    assert!(kops_docs >= 4, "the guide shows the kops objects to edit");
    let stale: Vec<_> = listed.difference(&used).collect();
    assert!(
        stale.is_empty(),
        "listed but not used by the guide: {stale:?}"
    );
}

/// The policy the guide puts in the cluster spec is the shipped one, as kops
/// wants it: the JSON array of its statements.
#[test]
fn the_guides_iam_policy_is_the_shipped_policy() {
    let shipped: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(support::repo_root().join("manifests/iam-policy.json"))
            .expect("manifests/iam-policy.json"),
    )
    .expect("policy JSON");
    let mut policies = vec![];
    for (lang, text) in blocks(&guide()) {
        if lang != "yaml" {
            continue;
        }
        for doc in documents(&text).into_iter().filter(is_kops) {
            let spec = &doc["spec"];
            for permission in spec["iam"]["serviceAccountExternalPermissions"]
                .as_sequence()
                .into_iter()
                .flatten()
            {
                policies.push(permission["aws"]["inlinePolicy"].clone());
            }
            if let Some(p) = spec["additionalPolicies"]["control-plane"].as_str() {
                policies.push(Value::String(p.to_string()));
            }
        }
    }
    assert_eq!(policies.len(), 2, "IRSA and the node-role alternative");
    for policy in policies {
        let text = policy.as_str().expect("a policy is a string");
        let statements: serde_json::Value = serde_json::from_str(text)
            .unwrap_or_else(|e| panic!("the guide's policy is not JSON: {e}\n{text}"));
        assert_eq!(statements, shipped["Statement"]);
    }
}

/// Repository paths named in the guide's commands exist.
#[test]
fn the_guides_commands_name_files_that_exist() {
    let root = support::repo_root();
    let mut named = 0;
    for (lang, text) in blocks(&guide()) {
        if lang != "sh" {
            continue;
        }
        for word in text.split(|c: char| c.is_whitespace() || c == '"' || c == '(' || c == ')') {
            let word = word.trim_end_matches([';', ',']);
            if ["manifests/", "scripts/", "overlays/example/"]
                .iter()
                .any(|p| word.starts_with(p))
                || word == "overlays/example"
            {
                named += 1;
                assert!(root.join(word).exists(), "the guide names {word}");
            }
        }
    }
    assert!(named >= 3, "{named}");
}

/// Our own objects in the guide: accepted by the apiserver (server-side
/// apply, dry run, in a namespace of their own), valid to the manager, and the worked NodeGroups are
/// exactly the example overlay's.
#[tokio::test]
async fn the_guides_nodegroups_are_accepted_and_are_the_overlays() {
    let world = support::World::new("kops-guide").await;
    let client = world.client.clone();
    support::install_crds(&client).await;
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let overlay = documents(
        &std::fs::read_to_string(support::repo_root().join("overlays/example/nodegroups.yaml"))
            .expect("overlays/example/nodegroups.yaml"),
    );
    let mut ours = 0;
    let mut has_the_overlays = false;
    for (lang, text) in blocks(&guide()) {
        if lang != "yaml" {
            continue;
        }
        let docs: Vec<Value> = documents(&text)
            .into_iter()
            .filter(|d| !is_kops(d))
            .collect();
        has_the_overlays |= docs == overlay;
        for doc in docs {
            ours += 1;
            let obj: DynamicObject = serde_yaml::from_value(doc.clone()).expect("an object");
            let types = obj.types.clone().expect("apiVersion and kind");
            let gvk = kube::api::GroupVersionKind::try_from(&types).expect("gvk");
            let (resource, _) = discovery
                .resolve_gvk(&gvk)
                .unwrap_or_else(|| panic!("the guide shows an unknown kind {gvk:?}"));
            let name = obj.metadata.name.clone().expect("a name");
            assert!(
                obj.metadata.namespace.is_some(),
                "{name} names its namespace"
            );
            // Created (dry run) in this test's own namespace: as new objects,
            // whatever other tests left in spot-node-manager.
            let mut obj = obj;
            obj.metadata.namespace = Some(world.namespace.clone());
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &world.namespace, &resource);
            let mut params = PatchParams::apply("snm-kops-guide-test");
            params.dry_run = true;
            api.patch(&name, &params, &Patch::Apply(&obj))
                .await
                .unwrap_or_else(|e| panic!("the apiserver refused {} {name}: {e}", gvk.kind));
            if gvk.kind == "NodeGroup" {
                let group: NodeGroup = serde_yaml::from_value(doc).expect("a NodeGroup");
                let problems = group.spec.validate();
                assert!(problems.is_empty(), "{name}: {problems:?}");
            }
        }
    }
    assert!(ours >= 3, "{ours}");
    assert!(
        has_the_overlays,
        "the guide's worked NodeGroups must be overlays/example/nodegroups.yaml"
    );
}

/// kops's names (its `pkg/model`: an instance group's ASG is
/// `<group>.<cluster>`, a control-plane group's `<group>.masters.<cluster>`;
/// `kops create cluster` names control-plane groups `control-plane-<zone>`
/// since kops 1.26, `master-<zone>` before, and worker groups
/// `nodes-<zone>`): the guide's instance groups, its NodeGroups and the
/// example overlay follow them, so pasted as they are they find their ASGs.
#[test]
fn the_guides_names_are_the_names_kops_gives() {
    let cluster = "example.com";
    let zones = ["ap-northeast-1a", "ap-northeast-1c", "ap-northeast-1d"];
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
    let mut instance_groups = 0;
    let mut asgs = 0;
    let overlay =
        std::fs::read_to_string(support::repo_root().join("overlays/example/nodegroups.yaml"))
            .expect("overlays/example/nodegroups.yaml");
    let yaml = blocks(&guide())
        .into_iter()
        .filter(|(lang, _)| lang == "yaml")
        .map(|(_, text)| text)
        .chain([overlay]);
    for doc in yaml.flat_map(|t| documents(&t)) {
        let name = doc.get("metadata").and_then(|m| text(m, "name"));
        let spec = doc.get("spec").cloned().unwrap_or(Value::Null);
        match text(&doc, "kind").as_deref() {
            Some("InstanceGroup") => {
                instance_groups += 1;
                let name = name.expect("a name");
                let zone = zones
                    .iter()
                    .find(|z| name.ends_with(*z))
                    .unwrap_or_else(|| panic!("{name}: one group per zone, named after it"));
                let control_plane = format!("control-plane-{zone}");
                let nodes = format!("nodes-{zone}");
                match text(&spec, "role").as_deref() {
                    // As `kops edit ig` shows it: v1alpha2 writes the
                    // control plane's role as Master in every kops version
                    // (kubernetes/kops pkg/apis/kops/v1alpha2/conversion.go,
                    // Convert_kops_InstanceGroupSpec_To_v1alpha2_InstanceGroupSpec:
                    // `if in.Role.HasControlPlane() { out.Role = "Master" }`,
                    // at 07bddb7f1fa1d5c8e3530f52ef087653ea64a7b5).
                    Some("Master") => assert_eq!(name, control_plane),
                    Some("Node") => assert_eq!(name, nodes),
                    // A snippet of an edit that leaves the role as it is.
                    None => assert!(name == control_plane || name == nodes, "{name}"),
                    Some(other) => {
                        panic!("{name}: role {other} (kops's v1alpha2 shows Master or Node)")
                    }
                }
            }
            Some("NodeGroup") => {
                let role = text(&spec, "role");
                let named = spec
                    .get("autoScalingGroups")
                    .and_then(Value::as_sequence)
                    .cloned()
                    .unwrap_or_default();
                for asg in named.iter().filter_map(|a| text(a, "name")) {
                    asgs += 1;
                    let ok = zones.iter().any(|zone| match role.as_deref() {
                        Some("Master") => asg == format!("control-plane-{zone}.masters.{cluster}"),
                        _ => asg == format!("nodes-{zone}.{cluster}"),
                    });
                    assert!(ok, "{asg}: not the ASG kops makes for a {role:?} group");
                }
            }
            _ => {}
        }
    }
    // What was checked: the guide's two instance groups, and the ASGs of its
    // NodeGroups and the overlay's.
    assert!(instance_groups >= 2, "{instance_groups} instance groups");
    assert!(asgs >= 12, "{asgs} ASG names");
}

/// What the guide says kops does, per version, each with where in kops's
/// source (github.com/kubernetes/kops, read at the tags named) it was read.
/// A fact the guide no longer states in these words fails here, naming its
/// source: read it again there before changing either.
const KOPS_FACTS: &[(&str, &str)] = &[
    (
        "kops 1.26 and later name these groups `control-plane-<zone>`",
        "upup/pkg/fi/cloudup/new_cluster.go: `\"master-\" + name` at v1.25.0, `\"control-plane-\" + name` at v1.26.0",
    ),
    (
        "Their role reads `role: Master` in every kops version",
        "pkg/apis/kops/v1alpha2/conversion.go, Convert_kops_InstanceGroupSpec_To_v1alpha2_InstanceGroupSpec: `if in.Role.HasControlPlane() { out.Role = \"Master\" }` at 07bddb7f",
    ),
    (
        "since kops 1.28 even when the spec has no `nodeTerminationHandler` at all (before 1.28 only with one, so an upgrade to 1.28 turns it on)",
        "pkg/model/components/nodeterminationhandler.go, BuildOptions: returns when NodeTerminationHandler is nil at v1.27.0; makes an empty one and defaults Enabled to true at v1.28.0",
    ),
    (
        "in queue mode whenever `enableSQSTerminationDraining` is unset",
        "pkg/apis/kops/componentconfig.go, IsQueueMode: `Enabled && (EnableSQSTerminationDraining == nil || *EnableSQSTerminationDraining)` at v1.28.0",
    ),
    (
        "kops adds the `-RebalanceRecommendation` rule only with `enableRebalanceDraining: true`, which it defaults to false",
        "pkg/model/components/nodeterminationhandler.go: EnableRebalanceDraining defaults to false at v1.26.0, v1.28.0 and 0230b21f; the rule in pkg/model/awsmodel/nodeterminationhandler.go",
    ),
    (
        "kops 1.28.5 or later, Kubernetes 1.22 or later",
        "pkg/apis/kops/v1alpha2/componentconfig.go: AdditionalServiceAccountIssuers absent at v1.28.4, present at v1.28.5; docs/operations/service_account_issuer_migration.md",
    ),
    (
        "`https://api.internal.<cluster>` (kops's `pkg/model/components/discovery.go`)",
        "pkg/model/components/discovery.go: the issuer without a discovery store, `\"https://api.internal.\" + b.ClusterName`, at 268927e2",
    ),
    (
        "what `kops create cluster` makes without `--control-plane-count` or `--control-plane-zones`",
        "upup/pkg/fi/cloudup/new_cluster.go, setupControlPlane: `controlPlaneCount = 1` when neither is given, at 268927e2",
    ),
];

#[test]
fn the_guides_kops_facts_are_stated_as_read_in_kops() {
    let guide = guide().split_whitespace().collect::<Vec<_>>().join(" ");
    for (said, source) in KOPS_FACTS {
        assert!(
            guide.contains(said),
            "docs/kops.md no longer says {said:?}; it was read in kops's {source}: check it there"
        );
    }
}
