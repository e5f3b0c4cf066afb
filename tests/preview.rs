//! The preview says what the manager will do before it does it, and the run
//! then does that (real apiserver + the rude emulator + simulated kubelet,
//! the manager as a process): the Refresher's `status.next`, the group's
//! `NEXT` column, and `spot-node-manager preview`, which changes nothing.

use snm_testkit as support;

use spot_node_manager::crd::next::NextDisruption;
use support::refresh::*;
use support::steady::*;
use support::windows::*;
use support::{DO_NOT_DISRUPT, assert_eventually};

#[tokio::test]
async fn a_refresh_of_six_nodes_does_what_its_preview_said_and_the_preview_changes_nothing() {
    let g = SteadyGroup::workers("pv-refresh").per_asg(2).start().await;
    let (world, groups, manager) = (&g.world, &g.groups, &g.manager);
    let mut names = node_names(world, &g.baseline().await.original).await;
    names.sort();
    assert_eq!(names.len(), 6);
    // A pod on every node; the one on the third node is do-not-disrupt.
    pods_on(world, &names).await;
    let protected = names[2].clone();
    world
        .annotate_pod("app-2", DO_NOT_DISRUPT, Some("true"))
        .await;
    // A window that opens in a minute (once, to the second) and stays open;
    // the refresh is due before it.
    let opens_at = chrono::Utc::now() + chrono::Duration::seconds(60);
    let opens = chrono::DateTime::from_timestamp(opens_at.timestamp(), 0).expect("time");
    set_windows(
        groups,
        serde_json::json!([{"schedule": once_in(60), "duration": "1h"}]),
    )
    .await;
    schedule_refresh(world, "workers", serde_json::json!({"surplusNodes": 1})).await;

    // Said before: the Refresher's status, the group's NEXT column.
    let next: NextDisruption =
        refresher_until(world, "workers", "the preview in status", WAIT, |s| {
            let next = s.next?;
            (next.what == "refresh" && next.at.is_some() && next.total == 6).then_some(next)
        })
        .await;
    let at = next.at.expect("a start");
    assert!(
        (at - opens).num_seconds().abs() <= 1,
        "starts when the window opens ({opens}): {at}"
    );
    let last = next.nodes.last().expect("nodes");
    assert_eq!(last.node, protected, "the protected node last");
    let held = last.blocked_by.as_deref().unwrap_or_default();
    assert!(held.contains("app-2") && held.contains("skipped"), "{held}");
    let order: Vec<String> = next.nodes.iter().map(|n| n.node.clone()).collect();
    let group_next = assert_eventually("the NEXT column", WAIT, || async {
        groups.get("workers").await.ok()?.status?.next
    })
    .await;
    assert!(
        group_next.starts_with("refresh 6 node(s) at"),
        "{group_next}"
    );

    // `spot-node-manager preview`: the same answer, the pods each node
    // moves, and not one AWS mutation.
    let mutations_before = world.aws_mutations().await;
    let answer = world.preview(&[]).await;
    assert_eq!(
        world.aws_mutations().await,
        mutations_before,
        "the preview mutated AWS"
    );
    let ours = support::group_in(&answer, "workers").expect("the group");
    let cli_order = previewed_nodes(&ours["next"]["nodes"]);
    assert_eq!(cli_order, order, "the subcommand says what the status says");
    let moved = ours["pods"].as_array().expect("pods");
    let on_protected = moved
        .iter()
        .find(|m| m["node"] == protected.as_str())
        .expect("the protected node's pods");
    assert!(
        on_protected["pods"]
            .as_array()
            .expect("pods")
            .iter()
            .any(|p| p["pod"].as_str().is_some_and(|n| n.ends_with("/app-2"))),
        "{on_protected}"
    );

    // The run: it starts when the window opens, drains the nodes in the
    // previewed order, and skips the protected one.
    let rf = run_finished(world, "workers").await;
    let status = assert_run_succeeded(rf, manager);
    let started = status.last_run.as_ref().expect("last run").started;
    assert!(
        // Not before it opens; and promptly (within 10 s: 3 s was seen
        // exceeded, at 3.8 s, on a loaded machine).
        started >= opens && started - opens <= chrono::Duration::seconds(10),
        "started at {started}, the window opened at {opens}"
    );
    let skipped: Vec<String> = status.skipped.iter().map(|s| s.node.clone()).collect();
    assert_eq!(skipped, vec![protected.clone()]);
    let drained: Vec<String> = drained_in_order(world)
        .await
        .into_iter()
        .filter(|n| names.contains(n))
        .collect();
    let expected: Vec<String> = order.into_iter().filter(|n| *n != protected).collect();
    assert_eq!(drained, expected, "drained in the previewed order");
    assert!(
        !world.aws_mutations().await.is_empty(),
        "the run itself acted"
    );
}

#[tokio::test]
async fn preview_file_names_exactly_the_nodes_a_drift_roll_then_replaces() {
    let g = SteadyGroup::workers("pv-drift").start().await;
    let (world, kops, groups, manager) = (&g.world, &g.kops, &g.groups, &g.manager);
    let names = node_names(world, &g.baseline().await.original).await;
    // `kops update cluster` with `drift.action: Report` (the default): the
    // nodes are reported drifted, and stay.
    world.kops_update_cluster(kops).await;
    g.status_where("workers", "the drift reported", |s| {
        s.drifted_nodes == Some(3)
    })
    .await;
    // The spec the user is about to apply: `drift.action: Replace`.
    let mut proposed = groups.get("workers").await.expect("group");
    proposed.spec.drift.action = spot_node_manager::crd::nodegroup::DriftAction::Replace;
    proposed.status = None;
    proposed.metadata.managed_fields = None;
    let file = tempfile::NamedTempFile::new().expect("file");
    std::fs::write(file.path(), serde_yaml::to_string(&proposed).expect("yaml")).expect("write");
    let path = file.path().to_str().expect("utf-8");

    let mutations_before = world.aws_mutations().await;
    let answer = world.preview(&["--file", path]).await;
    assert_eq!(
        world.aws_mutations().await,
        mutations_before,
        "the preview mutated AWS"
    );
    let ours = support::group_in(&answer, "workers").expect("the group");
    assert!(ours["next"].is_null(), "nothing comes with Report: {ours}");
    let with = &ours["proposed"];
    assert_eq!(with["next"]["what"], "drift roll", "{with}");
    assert!(with["next"]["at"].is_null(), "now: {with}");
    let change = with["change"].as_str().unwrap_or_default();
    assert!(
        change.contains("would drift roll 3 node(s) now"),
        "{change}"
    );
    let previewed = previewed_nodes(&with["next"]["nodes"]);
    let mut sorted = previewed.clone();
    sorted.sort();
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(sorted, expected, "exactly the drifted nodes");
    // A file naming a group that does not exist: refused, and why.
    let mut other = proposed.clone();
    other.metadata.name = Some("not-here".into());
    std::fs::write(file.path(), serde_yaml::to_string(&other).expect("yaml")).expect("write");
    let refused = world.preview_output(&["--file", path]).await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("NodeGroup not-here does not exist here"),
        "{stderr}"
    );

    // Applied: the roll replaces exactly those, in that order.
    let drift = serde_json::json!({"drift": {"action": "Replace"}});
    world.patch_group("workers", drift).await;
    let rf = run_finished(world, "workers").await;
    let status = assert_run_succeeded(rf, manager);
    assert_eq!(status.last_run.as_ref().map(|r| r.replaced), Some(3));
    let drained: Vec<String> = drained_in_order(world)
        .await
        .into_iter()
        .filter(|n| names.contains(n))
        .collect();
    assert_eq!(drained, previewed, "drained in the previewed order");
}

#[tokio::test]
async fn a_budget_that_allows_no_disruption_is_named_before_the_run_starts() {
    let g = SteadyGroup::workers("pv-pdb").start().await;
    let (world, manager) = (&g.world, &g.manager);
    let mut names = node_names(world, &g.baseline().await.original).await;
    names.sort();
    // The pod on the first node is governed by a budget that lets none go.
    labelled_pods_on(world, &names[..1], "db", &[("app", "protected")]).await;
    pods_on(world, &names[1..]).await;
    support::cluster::create_pdb(world, 1).await;
    support::cluster::assert_pdb_allows(world, 0).await;
    schedule_refresh(
        world,
        "workers",
        serde_json::json!({"schedule": once_in(40), "drainTimeout": "5s", "drainTimeoutAction": "Proceed"}),
    )
    .await;
    let ours = assert_eventually("the run previewed", WAIT, || async {
        let ours = world.preview_of("workers").await?;
        ours["next"]["nodes"].is_array().then_some(ours)
    })
    .await;
    let held: Vec<(String, String)> = ours["next"]["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| {
            Some((
                n["node"].as_str()?.to_string(),
                n["blockedBy"].as_str()?.to_string(),
            ))
        })
        .collect();
    assert_eq!(held.len(), 1, "{ours}");
    assert_eq!(held[0].0, names[0], "the node whose pod the budget holds");
    assert!(
        held[0].1.contains("/protected allows 0 disruptions now"),
        "{}",
        held[0].1
    );
    let status = refresher_status(world, "workers").await;
    assert!(status.run_start.is_none(), "said before the run starts");
    // The status says it too (the preview's own words on the same node),
    // before the run starts.
    let in_status = refresher_until(
        world,
        "workers",
        "the budget in status.next",
        WAIT,
        |status| {
            let node = status
                .next?
                .nodes
                .into_iter()
                .find(|n| n.node == names[0])?;
            let held = node.blocked_by?;
            (status.run_start.is_none() && held.contains("/protected allows 0 disruptions now"))
                .then_some(held)
        },
    )
    .await;
    assert_eq!(in_status, held[0].1);
    // The run then meets that budget on that node (and, with Proceed,
    // terminates it after drainTimeout).
    let rf = run_finished(world, "workers").await;
    assert_run_succeeded(rf, manager);
    let blocked = events_with_reason(world, "DrainBlocked").await;
    assert!(
        blocked.iter().any(|e| e
            .note
            .as_deref()
            .is_some_and(|n| n.contains(&names[0]) && n.contains("PodDisruptionBudget"))),
        "{blocked:?}"
    );
}

/// Issue 54, hole 9: a run whose surplus cannot be added (every instance
/// group at its max, as kops's often are) is skipped when due; the preview
/// said nothing of it. Now the preview and `status.next` say it will be
/// skipped and why, before it is due; then it is skipped for that reason,
/// nothing raised or removed.
#[tokio::test]
async fn a_run_whose_surplus_cannot_be_added_is_previewed_as_skipped_and_is_skipped() {
    let steady = SteadyGroup::workers("pv-skip").start().await;
    let (world, kops) = (&steady.world, &steady.kops);
    steady.every_asg_at_max("workers").await;
    let before = world.asg_snapshot(&kops.asgs).await;
    schedule_refresh(
        world,
        "workers",
        serde_json::json!({"schedule": once_in(40), "surplusNodes": 1}),
    )
    .await;
    let said = "skipped when due: cannot add 1 surplus node(s)";
    let previewed = assert_eventually("the skip previewed", WAIT, || async {
        let ours = world.preview_of("workers").await?;
        let held = ours["next"]["blockedBy"].as_str()?.to_string();
        held.starts_with(said).then_some(held)
    })
    .await;
    let in_status = refresher_until(
        world,
        "workers",
        "the skip in status.next",
        WAIT,
        |status| {
            let held = status.next?.blocked_by?;
            let before_it = status.run_start.is_none() && status.last_run.is_none();
            (before_it && held.starts_with(said)).then_some(held)
        },
    )
    .await;
    assert_eq!(in_status, previewed);
    // Then, when due, it is skipped for that reason.
    let rf = run_finished(world, "workers").await;
    let skipped = spot_node_manager::crd::refresher::RunResult::Skipped;
    let last = assert_run_ended(rf, skipped, &steady.manager).last_run;
    let reason = last.and_then(|l| l.reason).unwrap_or_default();
    assert!(reason.contains("cannot add 1 surplus node(s)"), "{reason}");
    assert_eq!(world.asg_snapshot(&kops.asgs).await, before);
    let metrics = steady.manager.assert_metrics().await;
    assert_eq!(
        support::performed(&metrics, "set_desired_capacity"),
        0,
        "{metrics}"
    );
}
