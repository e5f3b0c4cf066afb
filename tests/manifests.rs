//! Every shipped manifest applies cleanly to a real apiserver; invalid
//! NodeGroups are rejected by the CRD's schema validation.

use snm_testkit as support;

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};
use serde::Deserialize;
use spot_node_manager::crd::NodeGroup;
use std::path::Path;

fn documents(text: &str, origin: &str) -> Vec<DynamicObject> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| DynamicObject::deserialize(doc).unwrap_or_else(|e| panic!("{origin}: {e}")))
        .collect()
}

/// `kubectl kustomize <dir>`: what `kubectl apply -k <dir>` would apply.
fn kustomize(dir: &Path) -> String {
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("run kubectl kustomize (kubectl 1.21+ needed): {e}"));
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("kustomize output is UTF-8")
}

async fn discover(client: &kube::Client) -> Discovery {
    Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery")
}

async fn apply_all(
    client: &kube::Client,
    discovery: &Discovery,
    objects: Vec<DynamicObject>,
    origin: &str,
) -> Vec<String> {
    let mut applied = vec![];
    for mut obj in objects {
        let mut types = obj.types.clone().expect("apiVersion and kind");
        // The local apiserver is Debian's 1.20, which serves PodDisruptionBudget
        // only as policy/v1beta1 (same fields as the policy/v1 we ship for
        // current clusters, where v1beta1 is gone). Nothing else is rewritten.
        if types.api_version == "policy/v1"
            && types.kind == "PodDisruptionBudget"
            && discovery
                .resolve_gvk(&kube::api::GroupVersionKind::gvk(
                    "policy",
                    "v1",
                    "PodDisruptionBudget",
                ))
                .is_none()
        {
            types.api_version = "policy/v1beta1".into();
            obj.types = Some(types.clone());
        }
        let gvk = kube::api::GroupVersionKind::try_from(&types).expect("gvk");
        let (resource, caps) = discovery
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("{origin}: unknown kind {gvk:?}"));
        let name = obj.metadata.name.clone().expect("name");
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Cluster => Api::all_with(client.clone(), &resource),
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj.metadata
                    .namespace
                    .as_deref()
                    .expect("namespaced manifests name their namespace"),
                &resource,
            ),
        };
        api.patch(
            &name,
            &PatchParams::apply("snm-manifest-test").force(),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap_or_else(|e| panic!("{origin}: applying {} {name} failed: {e}", gvk.kind));
        applied.push(format!("{}/{name}", gvk.kind));
    }
    applied
}

/// Applies what `kubectl apply -k` would: the namespace and the CRDs first
/// (established before anything of their kinds), then the rest.
async fn apply_rendered(client: &kube::Client, rendered: &str, origin: &str) -> Vec<String> {
    let (first, rest): (Vec<_>, Vec<_>) = documents(rendered, origin).into_iter().partition(|o| {
        o.types
            .as_ref()
            .is_some_and(|t| t.kind == "Namespace" || t.kind == "CustomResourceDefinition")
    });
    let mut applied = apply_all(client, &discover(client).await, first, origin).await;
    support::install_crds(client).await;
    applied.extend(apply_all(client, &discover(client).await, rest, origin).await);
    applied
}

/// `.yaml` files under `dir`, relative to it.
fn yaml_files(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("read manifests") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            yaml_files(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "yaml") {
            let relative = path.strip_prefix(root).expect("under root");
            out.push(relative.to_string_lossy().into_owned());
        }
    }
}

#[test]
fn the_kustomize_base_installs_every_kubernetes_manifest() {
    let root = support::repo_root().join("manifests");
    let base: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(root.join("kustomization.yaml")).expect("kustomization.yaml"),
    )
    .expect("kustomization YAML");
    let mut resources: Vec<String> = base["resources"]
        .as_sequence()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().expect("a path").to_string())
        .collect();
    resources.sort();
    let mut files = vec![];
    yaml_files(&root, &root, &mut files);
    // Not Kubernetes objects of the install: the AWS side, the demo's
    // workload, and what needs the Prometheus Operator.
    let left_out = [
        "kustomization.yaml",
        "aws/interruption-queue.yaml",
        "examples/sample-app.yaml",
        "monitoring/kustomization.yaml",
        "monitoring/servicemonitor.yaml",
        "monitoring/prometheusrule.yaml",
    ];
    files.retain(|f| !left_out.contains(&f.as_str()));
    files.sort();
    assert_eq!(
        resources, files,
        "manifests/kustomization.yaml must list every manifest of the install"
    );
}

/// `kubectl apply -k manifests/monitoring` applies the ServiceMonitor,
/// the alerts and the dashboard as a ConfigMap Grafana's sidecar loads,
/// each labelled as kube-prometheus-stack selects them.
#[test]
fn the_monitoring_kit_applies_with_kustomize() {
    let root = support::repo_root().join("manifests/monitoring");
    let rendered = kustomize(&root);
    let objects: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&rendered)
        .map(|d| serde::Deserialize::deserialize(d).expect("a rendered object"))
        .collect();
    let mut kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    kinds.sort();
    assert_eq!(kinds, ["ConfigMap", "PrometheusRule", "ServiceMonitor"]);
    for o in &objects {
        assert_eq!(
            o["metadata"]["labels"]["release"].as_str(),
            Some("kube-prometheus-stack"),
            "{o:?}"
        );
        assert_eq!(
            o["metadata"]["namespace"].as_str(),
            Some("spot-node-manager")
        );
    }
    let dashboard = objects
        .iter()
        .find(|o| o["kind"].as_str() == Some("ConfigMap"))
        .expect("the dashboard's ConfigMap");
    assert_eq!(
        dashboard["metadata"]["labels"]["grafana_dashboard"].as_str(),
        Some("1")
    );
    let shipped = std::fs::read_to_string(root.join("dashboard.json")).expect("dashboard.json");
    assert_eq!(
        dashboard["data"]["dashboard.json"].as_str(),
        Some(shipped.as_str())
    );
}

/// Issue 69 item 4: the example monitoring overlay makes every alert's
/// `runbook_url` an absolute link from the one base it sets, the same
/// section as the kit's, and the base's ConfigMap stays out of the cluster.
#[test]
fn the_example_monitoring_overlay_makes_every_runbook_link_absolute() {
    let root = support::repo_root();
    let parse = |rendered: &str| -> Vec<serde_yaml::Value> {
        serde_yaml::Deserializer::from_str(rendered)
            .map(|d| serde::Deserialize::deserialize(d).expect("a rendered object"))
            .collect()
    };
    let links = |objects: &[serde_yaml::Value]| -> Vec<String> {
        let rule = objects
            .iter()
            .find(|o| o["kind"].as_str() == Some("PrometheusRule"))
            .expect("the alerts");
        rule["spec"]["groups"]
            .as_sequence()
            .expect("groups")
            .iter()
            .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
            .map(|r| {
                let link = r["annotations"]["runbook_url"].as_str();
                link.unwrap_or_else(|| panic!("no runbook_url: {r:?}"))
                    .to_string()
            })
            .collect()
    };
    let kit = parse(&kustomize(&root.join("manifests/monitoring")));
    let overlay = parse(&kustomize(&root.join("overlays/example/monitoring")));
    let (relative, absolute) = (links(&kit), links(&overlay));
    assert!(relative.len() >= 7, "{relative:?}");
    let base = "https://github.com/example/spot-node-manager/blob/v0.1.0/";
    let expected: Vec<String> = relative.iter().map(|l| format!("{base}{l}")).collect();
    assert_eq!(absolute, expected);
    let kinds = |objects: &[serde_yaml::Value]| -> Vec<String> {
        let mut k: Vec<String> = objects
            .iter()
            .filter_map(|o| o["kind"].as_str().map(str::to_string))
            .collect();
        k.sort();
        k
    };
    assert_eq!(
        kinds(&overlay),
        kinds(&kit),
        "the base's ConfigMap is local"
    );
}

#[test]
fn the_roles_leases_are_the_ones_the_example_overlay_configures() {
    let overlay = kustomize(&support::repo_root().join("overlays/example"));
    let objects: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&overlay)
        .map(|d| serde::Deserialize::deserialize(d).expect("a rendered object"))
        .collect();
    let of_kind = |kind: &str| {
        objects
            .iter()
            .find(|o| o["kind"].as_str() == Some(kind))
            .unwrap_or_else(|| panic!("no {kind} rendered"))
    };
    let config: serde_yaml::Value = serde_yaml::from_str(
        of_kind("ConfigMap")["data"]["config.yaml"]
            .as_str()
            .expect("config.yaml"),
    )
    .expect("the manager's configuration");
    let lease = config["leaderElection"]["leaseName"]
        .as_str()
        .expect("leaderElection.leaseName");
    let granted = of_kind("Role")["rules"]
        .as_sequence()
        .expect("rules")
        .iter()
        .filter(|r| r["resources"][0].as_str() == Some("leases"))
        .flat_map(|r| {
            r["resourceNames"]
                .as_sequence()
                .cloned()
                .unwrap_or_default()
        })
        .map(|n| n.as_str().map(str::to_string).expect("a name"))
        .collect::<Vec<String>>();
    assert_eq!(
        granted,
        [lease.to_string(), format!("{lease}-disruptions")],
        "the Role grants the Leases the manager uses: the leader's and the disruption slots'"
    );
}

#[tokio::test]
async fn the_kustomize_base_and_the_example_overlay_apply_cleanly() {
    let world = support::World::new("manifests").await;
    let client = world.client.clone();
    let repo = support::repo_root();
    let base = kustomize(&repo.join("manifests"));
    let mut applied = apply_rendered(&client, &base, "kubectl kustomize manifests/").await;
    let overlay = kustomize(&repo.join("overlays/example"));
    let nodegroups: Vec<DynamicObject> = documents(&overlay, "overlays/example")
        .into_iter()
        .filter(|o| o.types.as_ref().is_some_and(|t| t.kind == "NodeGroup"))
        .collect();
    applied.extend(
        apply_all(
            &client,
            &discover(&client).await,
            nodegroups,
            "overlays/example",
        )
        .await,
    );
    for expected in [
        "Namespace/spot-node-manager",
        "CustomResourceDefinition/nodegroups.nodemanager.dev",
        "CustomResourceDefinition/refreshers.nodemanager.dev",
        "CustomResourceDefinition/replenishers.nodemanager.dev",
        "ServiceAccount/spot-node-manager",
        "ClusterRole/spot-node-manager",
        "Role/spot-node-manager",
        "ConfigMap/spot-node-manager",
        "Deployment/spot-node-manager",
        "PodDisruptionBudget/spot-node-manager",
        "NetworkPolicy/spot-node-manager",
        "Service/spot-node-manager-metrics",
        "NodeGroup/masters",
        "NodeGroup/nodes",
    ] {
        assert!(
            applied.iter().any(|a| a == expected),
            "{expected} not applied: {applied:?}"
        );
    }

    // The apiserver filled in the schema defaults the examples leave out.
    let groups: Api<NodeGroup> = Api::namespaced(client.clone(), "spot-node-manager");
    let nodes = groups.get("nodes").await.expect("nodes group");
    assert!(nodes.spec.replenish.enabled);
    assert_eq!(nodes.spec.replenish.cooldown, "5m");
    assert_eq!(nodes.spec.replenish.join_timeout, "15m");
    assert!(
        nodes.spec.validate().is_empty(),
        "{:?}",
        nodes.spec.validate()
    );
    let masters = groups.get("masters").await.expect("masters group");
    assert!(
        masters.spec.validate().is_empty(),
        "{:?}",
        masters.spec.validate()
    );

    // The shipped RBAC grants the manager's ServiceAccount every request it
    // makes (asked of the apiserver's own RBAC authorizer).
    for (verb, group, resource, namespace) in MANAGER_REQUESTS {
        support::assert_eventually(
            &format!("{verb} {group}/{resource} in {namespace:?} allowed"),
            std::time::Duration::from_secs(10),
            || async {
                allowed(&client, verb, group, resource, namespace)
                    .await
                    .then_some(())
            },
        )
        .await;
    }
    assert!(
        !allowed(
            &client,
            "delete",
            "nodemanager.dev",
            "nodegroups",
            &Some("spot-node-manager")
        )
        .await,
        "the manager must not be able to delete the user's NodeGroups"
    );
    // Verbs it never uses are not granted: it applies (patch), never
    // replaces (update), and never reads a status subresource alone.
    for (verb, resource) in [
        ("update", "refreshers"),
        ("update", "replenishers/status"),
        ("get", "nodegroups/status"),
    ] {
        assert!(
            !allowed(
                &client,
                verb,
                "nodemanager.dev",
                resource,
                &Some("spot-node-manager")
            )
            .await,
            "{verb} {resource} must not be granted"
        );
    }
    // Its own Lease, and no other one in its namespace.
    let ns = Some("spot-node-manager");
    for verb in ["get", "update"] {
        assert!(
            allowed_named(
                &client,
                verb,
                "coordination.k8s.io",
                "leases",
                &ns,
                Some("spot-node-manager")
            )
            .await,
            "{verb} its Lease"
        );
        assert!(
            !allowed_named(
                &client,
                verb,
                "coordination.k8s.io",
                "leases",
                &ns,
                Some("someone-elses")
            )
            .await,
            "{verb} another Lease must be denied"
        );
    }

    // The overlay as a whole is accepted too, and sets what it promises.
    let applied = apply_rendered(&client, &overlay, "kubectl kustomize overlays/example").await;
    assert!(applied.iter().any(|a| a == "Deployment/spot-node-manager"));
    let ns = "spot-node-manager";
    let deployment = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), ns)
        .get("spot-node-manager")
        .await
        .expect("Deployment");
    let container = deployment
        .spec
        .and_then(|s| s.template.spec)
        .map(|s| s.containers)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == "manager")
        .expect("the manager container");
    assert_eq!(
        container.image.as_deref(),
        Some("123456789012.dkr.ecr.ap-northeast-1.amazonaws.com/spot-node-manager:0.1.0")
    );
    let regions: Vec<_> = container
        .env
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.name == "AWS_REGION")
        .map(|e| e.value)
        .collect();
    assert_eq!(regions, vec![Some("ap-northeast-1".to_string())]);
    let account = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), ns)
        .get("spot-node-manager")
        .await
        .expect("ServiceAccount");
    assert_eq!(
        account.metadata.annotations.unwrap_or_default()["eks.amazonaws.com/role-arn"],
        "arn:aws:iam::123456789012:role/spot-node-manager.spot-node-manager.sa.example.com"
    );
    // The config the overlay writes is one the manager accepts, queue included.
    let config = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns)
        .get("spot-node-manager")
        .await
        .expect("ConfigMap")
        .data
        .unwrap_or_default()
        .remove("config.yaml")
        .expect("config.yaml");
    let file = spot_node_manager::config::parse_file(&config).expect("the overlay's config parses");
    let settings =
        spot_node_manager::config::Settings::resolve(&Default::default(), file, |_| None)
            .expect("the overlay's config is valid");
    assert!(
        settings
            .interruption
            .queue_url
            .is_some_and(|u| u.ends_with("/example-com-interruptions")),
        "{config}"
    );
}

/// Every (verb, API group, resource, namespace) the manager requests.
const MANAGER_REQUESTS: &[(&str, &str, &str, &Option<&str>)] = &[
    ("list", "", "nodes", &None),
    ("watch", "", "nodes", &None),
    ("patch", "", "nodes", &None),
    ("list", "", "pods", &None),
    ("create", "", "pods/eviction", &Some("default")),
    // `spot-node-manager preview`.
    ("list", "policy", "poddisruptionbudgets", &None),
    // Karpenter's NodePools (kops's Karpenter instance groups).
    ("list", "karpenter.sh", "nodepools", &None),
    // Another termination handler in the cluster.
    ("list", "apps", "deployments", &None),
    ("list", "apps", "daemonsets", &None),
    (
        "create",
        "events.k8s.io",
        "events",
        &Some("spot-node-manager"),
    ),
    (
        "watch",
        "nodemanager.dev",
        "nodegroups",
        &Some("spot-node-manager"),
    ),
    // The finalizer that holds a deletion until the group's work is unwound.
    (
        "patch",
        "nodemanager.dev",
        "nodegroups",
        &Some("spot-node-manager"),
    ),
    (
        "patch",
        "nodemanager.dev",
        "nodegroups/status",
        &Some("spot-node-manager"),
    ),
    (
        "patch",
        "nodemanager.dev",
        "refreshers",
        &Some("spot-node-manager"),
    ),
    (
        "delete",
        "nodemanager.dev",
        "replenishers",
        &Some("spot-node-manager"),
    ),
    (
        "patch",
        "nodemanager.dev",
        "replenishers/status",
        &Some("spot-node-manager"),
    ),
    (
        "create",
        "coordination.k8s.io",
        "leases",
        &Some("spot-node-manager"),
    ),
];

async fn allowed(
    client: &kube::Client,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: &Option<&str>,
) -> bool {
    allowed_named(client, verb, group, resource, namespace, None).await
}

async fn allowed_named(
    client: &kube::Client,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: &Option<&str>,
    name: Option<&str>,
) -> bool {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_string())),
        None => (resource, None),
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some("system:serviceaccount:spot-node-manager:spot-node-manager".into()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                subresource,
                namespace: namespace.map(String::from),
                name: name.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let answer = reviews
        .create(&PostParams::default(), &review)
        .await
        .expect("SubjectAccessReview");
    answer.status.is_some_and(|s| s.allowed)
}

#[tokio::test]
async fn invalid_node_groups_are_rejected_by_schema_validation() {
    let world = support::World::new("invalid").await;
    let api: Api<NodeGroup> = world.api();
    let dir = support::repo_root().join("tests/fixtures/invalid");
    let cases = [
        ("negative-desired.yaml", "spec.desired"),
        ("unknown-role.yaml", "spec.role"),
        ("no-asgs.yaml", "spec.autoScalingGroups"),
        ("bad-duration.yaml", "spec.replenish.cooldown"),
        ("bad-drain-action.yaml", "spec.refresh.drainTimeoutAction"),
        ("missing-desired.yaml", "spec.desired"),
    ];
    for (file, field) in cases {
        let text = std::fs::read_to_string(dir.join(file)).expect("fixture");
        // Posted as raw JSON: the typed struct could not even represent these.
        let value: serde_json::Value = serde_yaml::from_str(&text).expect("yaml");
        let raw: Api<DynamicObject> = Api::namespaced_with(
            world.client.clone(),
            &world.namespace,
            &kube::api::ApiResource::erase::<NodeGroup>(&()),
        );
        let obj: DynamicObject = serde_json::from_value(value).expect("object");
        match raw.create(&PostParams::default(), &obj).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{file}: {status:?}");
                assert!(
                    status.message.contains(field),
                    "{file}: message must name {field}: {}",
                    status.message
                );
            }
            other => panic!("{file} must be rejected, got {other:?}"),
        }
    }
    // Sanity: none of them exists.
    assert!(
        api.list(&Default::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
}
