//! A running manager process against the real apiserver: admin endpoints,
//! spec validation reported as conditions and Events, graceful shutdown.

use snm_testkit as support;

use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, Patch, PatchParams, PostParams};
use spot_node_manager::crd::condition::find;
use spot_node_manager::crd::{ConditionStatus, NodeGroup};
use std::time::Duration;
use support::{ManagerProcess, World, assert_eventually, http_get};

const WAIT: Duration = Duration::from_secs(30);

fn group(name: &str, schedule: &str, time_zone: &str) -> NodeGroup {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "nodemanager.dev/v1alpha1",
        "kind": "NodeGroup",
        "metadata": {"name": name},
        "spec": {
            "role": "Worker",
            // One ASG each: two groups naming one ASG are both invalid.
            "autoScalingGroups": [{"name": format!("{name}-asg")}],
            "desired": 3,
            "refresh": {"schedule": schedule, "timeZone": time_zone}
        }
    }))
    .expect("group")
}

async fn spec_valid(
    api: &Api<NodeGroup>,
    name: &str,
) -> Option<(ConditionStatus, String, String, Option<i64>)> {
    let g = api.get(name).await.ok()?;
    let status = g.status?;
    let c = find(&status.conditions, "SpecValid")?;
    Some((
        c.status.clone(),
        c.reason.clone(),
        c.message.clone(),
        status.observed_generation,
    ))
}

#[tokio::test]
async fn admin_endpoints_answer_on_a_running_manager() {
    let world = World::new("admin").await;
    let mut manager = ManagerProcess::start(&world, &["--leader-election", "false"]);
    let port = manager.admin_port;
    assert_eventually("readyz 200", WAIT, || async {
        matches!(http_get(port, "/readyz").await, Some((200, _))).then_some(())
    })
    .await;
    let (code, body) = http_get(port, "/healthz").await.expect("healthz answers");
    assert_eq!((code, body.as_str()), (200, "ok"));
    let metrics = manager.metrics().await.expect("metrics answer");
    assert!(metrics.contains("spot_node_manager_leader 1"), "{metrics}");
    assert!(
        metrics.contains(r#"spot_node_manager_reconciles_total{controller="inventory"}"#),
        "{metrics}"
    );
    assert!(
        metrics.trim_end().ends_with("# EOF"),
        "OpenMetrics ends with # EOF"
    );
    assert_eq!(http_get(port, "/nope").await.map(|r| r.0), Some(404));

    let status = manager.terminate();
    assert!(
        status.success(),
        "SIGTERM must shut down cleanly: {status:?}\n{}",
        manager.logs()
    );
    assert!(
        manager.logs().contains("shutting down"),
        "{}",
        manager.logs()
    );
    // A shutdown stops the controllers; it is not their crash.
    assert!(
        !manager.logs().contains("stopped unexpectedly"),
        "{}",
        manager.logs()
    );
}

#[tokio::test]
async fn invalid_specs_are_reported_as_false_conditions_and_events() {
    let world = World::new("validate").await;
    let api: Api<NodeGroup> = world.api();
    api.create(
        &PostParams::default(),
        &group("bad-cron", "every tuesday", "UTC"),
    )
    .await
    .expect("create");
    api.create(
        &PostParams::default(),
        &group("bad-zone", "0 3 * * *", "Mars/Olympus"),
    )
    .await
    .expect("create");
    api.create(
        &PostParams::default(),
        &group("good", "0 3 * * *", "Asia/Tokyo"),
    )
    .await
    .expect("create");
    let manager = ManagerProcess::start(&world, &["--leader-election", "false"]);

    let (status, reason, message, _) =
        assert_eventually("bad-cron reported", WAIT, || spec_valid(&api, "bad-cron")).await;
    assert_eq!(
        (status, reason.as_str()),
        (ConditionStatus::False, "InvalidSchedule"),
        "{message}"
    );
    assert!(message.contains("spec.refresh.schedule"), "{message}");
    let (status, reason, _, _) =
        assert_eventually("bad-zone reported", WAIT, || spec_valid(&api, "bad-zone")).await;
    assert_eq!(
        (status, reason.as_str()),
        (ConditionStatus::False, "InvalidTimeZone")
    );
    let (status, _, _, _) =
        assert_eventually("good reported", WAIT, || spec_valid(&api, "good")).await;
    assert_eq!(status, ConditionStatus::True);

    // A Warning Event explains the problem on the group.
    let events: Api<Event> = world.api();
    assert_eventually("InvalidSchedule event", WAIT, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("InvalidSchedule")
                    && e.type_.as_deref() == Some("Warning")
            })
            .then_some(())
    })
    .await;

    // Fixing the spec flips the condition and records the new generation.
    let fix = serde_json::json!({"spec": {"refresh": {"schedule": "0 3 * * Tue"}}});
    let fixed = api
        .patch("bad-cron", &PatchParams::default(), &Patch::Merge(&fix))
        .await
        .expect("fix");
    let generation = fixed.metadata.generation;
    assert_eventually("bad-cron fixed", WAIT, || async {
        let (status, _, _, observed) = spec_valid(&api, "bad-cron").await?;
        (status == ConditionStatus::True && observed == generation).then_some(())
    })
    .await;
    drop(manager);
}

/// Both of the manager's clients (its own and the evictions', which does not
/// retry) speak HTTP/2 to the apiserver: requests in flight at once are
/// streams of one connection, not a connection and a TLS handshake each (a
/// burst of 150 spot warnings opened about 200 over HTTP/1.1).
#[tokio::test]
async fn the_manager_speaks_http2_to_the_apiserver() {
    use spot_node_manager::manager::{kube_client, kube_client_without_retry};
    let mut settings = spot_node_manager::config::Settings::resolve(
        &Default::default(),
        Default::default(),
        |_| None,
    )
    .expect("default settings");
    settings.kubeconfig = Some(support::control_plane().kubeconfig.clone());
    let clients = [
        kube_client(&settings).await.expect("client"),
        kube_client_without_retry(&settings)
            .await
            .expect("eviction client"),
    ];
    for client in clients {
        let sent = (0..16).map(|_| {
            let request = http::Request::get("/version")
                .body(kube::client::Body::empty())
                .expect("request");
            client.send(request)
        });
        for response in futures::future::join_all(sent).await {
            let response = response.expect("GET /version");
            assert!(response.status().is_success(), "{}", response.status());
            assert_eq!(response.version(), http::Version::HTTP_2);
        }
    }
}

/// `kubectl <args>` against the test apiserver, off the async runtime; its
/// output when it fails.
async fn kubectl(world: &World, args: &[&str]) -> Result<String, String> {
    let kubeconfig = world.kubeconfig().to_path_buf();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(&args)
            .output()
            .map_err(|e| format!("run kubectl: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        match out.status.success() {
            true => Ok(text),
            false => Err(format!("kubectl {}: {text}", args.join(" "))),
        }
    })
    .await
    .expect("kubectl task")
}

/// A running group with a refresh schedule: its NodeGroup, Refresher and
/// Replenisher, its finalizer on.
async fn a_group_with_its_finalizer(name: &str) -> support::steady::SteadyGroup {
    use kube::ResourceExt;
    let g = support::steady::SteadyGroup::workers(name).start().await;
    let spec = serde_json::json!({"spec": {"refresh": {"schedule": "0 4 * * Mon"}}});
    g.groups
        .patch("workers", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .expect("a refresh schedule");
    let refreshers: Api<spot_node_manager::crd::Refresher> = g.world.api();
    let replenishers: Api<spot_node_manager::crd::Replenisher> = g.world.api();
    assert_eventually("the finalizer on, both children made", WAIT, || async {
        let group = g.groups.get("workers").await.ok()?;
        let on = group
            .finalizers()
            .iter()
            .any(|f| f == spot_node_manager::crd::labels::FINALIZER);
        let children = refreshers.get_opt("workers").await.ok()?.is_some()
            && replenishers.get_opt("workers").await.ok()?.is_some();
        (on && children).then_some(())
    })
    .await;
    g
}

/// Issue 69: operations.md's uninstall, in its order, on the real
/// apiserver: the NodeGroups deleted while the manager runs (it releases
/// their finalizers), then the manager and its namespace, leave no group,
/// child or namespace hanging. (`kubectl delete -k` also deletes the CRDs,
/// which this shared apiserver's other tests use: the namespace stands for
/// it here.) Done the other way round, the group and the namespace hang
/// until the finalizer is removed by hand, as the page says.
#[tokio::test]
async fn the_uninstall_order_leaves_no_group_child_or_namespace_hanging() {
    let mut g = a_group_with_its_finalizer("uninstall").await;
    let ns = g.world.namespace.clone();
    // Step 1, as the page gives it (its namespace is the world's here).
    kubectl(
        &g.world,
        &[
            "delete",
            "nodegroups",
            "--all",
            "-n",
            &ns,
            "--wait",
            "--timeout=120s",
        ],
    )
    .await
    .expect("the NodeGroups deleted while the manager runs");
    // Their children follow (the garbage collector), within seconds.
    assert_eventually(
        "no NodeGroup, Refresher or Replenisher left",
        WAIT,
        || async {
            let left = kubectl(
                &g.world,
                &[
                    "get",
                    "nodegroups,refreshers,replenishers",
                    "-n",
                    &ns,
                    "-o",
                    "name",
                ],
            )
            .await
            .ok()?;
            left.trim().is_empty().then_some(())
        },
    )
    .await;
    // Step 2: the manager goes, then its namespace, at once.
    g.manager.terminate();
    kubectl(
        &g.world,
        &["delete", "namespace", &ns, "--wait", "--timeout=120s"],
    )
    .await
    .expect("the namespace deleted without hanging");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(g.world.client.clone());
    assert!(namespaces.get_opt(&ns).await.expect("get").is_none());

    // The wrong order: the manager first. The group keeps its finalizer,
    // and it and the namespace hang.
    let mut g = a_group_with_its_finalizer("uninstall-wrong").await;
    let ns = g.world.namespace.clone();
    g.manager.terminate();
    kubectl(&g.world, &["delete", "namespace", &ns, "--wait=false"])
        .await
        .expect("delete the namespace");
    let hanging = kubectl(
        &g.world,
        &[
            "delete",
            "nodegroups",
            "--all",
            "-n",
            &ns,
            "--wait",
            "--timeout=10s",
        ],
    )
    .await;
    assert!(
        hanging.is_err(),
        "a group whose manager is gone went: {hanging:?}"
    );
    let group = g.groups.get("workers").await.expect("the group hangs");
    assert!(group.metadata.deletion_timestamp.is_some());
    assert!(
        namespaces.get_opt(&ns).await.expect("get").is_some(),
        "namespace gone"
    );
    // The page's way out: the finalizer removed by hand.
    kubectl(
        &g.world,
        &[
            "patch",
            "nodegroup/workers",
            "-n",
            &ns,
            "--type",
            "json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
        ],
    )
    .await
    .expect("the finalizer removed");
    assert_eventually(
        "the group, its children and the namespace gone",
        WAIT,
        || async { namespaces.get_opt(&ns).await.ok()?.is_none().then_some(()) },
    )
    .await;
}
