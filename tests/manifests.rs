//! Every shipped manifest applies cleanly to a real apiserver; invalid
//! NodeGroups are rejected by the CRD's schema validation.

use snm_testkit as support;

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};
use serde::Deserialize;
use spot_node_manager::crd::NodeGroup;
use std::path::Path;

fn documents(path: &Path) -> Vec<DynamicObject> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            DynamicObject::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect()
}

async fn apply_file(client: &kube::Client, discovery: &Discovery, path: &Path) -> Vec<String> {
    let mut applied = vec![];
    for mut obj in documents(path) {
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
            .unwrap_or_else(|| panic!("{}: unknown kind {gvk:?}", path.display()));
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
        .unwrap_or_else(|e| {
            panic!(
                "{}: applying {} {name} failed: {e}",
                path.display(),
                gvk.kind
            )
        });
        applied.push(format!("{}/{name}", gvk.kind));
    }
    applied
}

#[tokio::test]
async fn every_manifest_applies_cleanly() {
    let world = support::World::new("manifests").await;
    let client = world.client.clone();
    let root = support::repo_root().join("manifests");
    let mut applied = vec![];
    // CRDs and the namespace first: later files depend on them.
    for file in [
        "crds/nodegroups.yaml",
        "crds/refreshers.yaml",
        "crds/replenishers.yaml",
        "namespace.yaml",
    ] {
        let discovery = Discovery::new(client.clone())
            .run()
            .await
            .expect("discovery");
        applied.extend(apply_file(&client, &discovery, &root.join(file)).await);
    }
    support::install_crds(&client).await;
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    for file in [
        "rbac.yaml",
        "deployment.yaml",
        "examples/nodegroups.yaml",
        // (Its ServiceMonitor needs the Prometheus Operator's CRD: checked
        // against the Service and the Deployment in tests/monitoring.rs.)
        "monitoring/service.yaml",
    ] {
        applied.extend(apply_file(&client, &discovery, &root.join(file)).await);
    }
    for expected in [
        "Namespace/spot-node-manager",
        "ServiceAccount/spot-node-manager",
        "ClusterRole/spot-node-manager",
        "Role/spot-node-manager",
        "Deployment/spot-node-manager",
        "PodDisruptionBudget/spot-node-manager",
        "NetworkPolicy/spot-node-manager",
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
}

/// Every (verb, API group, resource, namespace) the manager requests.
const MANAGER_REQUESTS: &[(&str, &str, &str, &Option<&str>)] = &[
    ("list", "", "nodes", &None),
    ("watch", "", "nodes", &None),
    ("patch", "", "nodes", &None),
    ("list", "", "pods", &None),
    ("create", "", "pods/eviction", &Some("default")),
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
    world.cleanup().await;
}
