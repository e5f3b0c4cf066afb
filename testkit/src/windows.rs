//! Maintenance windows and disruption slots in tests: windows open now or
//! closed for the year, a run whose window closes once it has its first
//! node in hand, and the manager-wide slots all given back.

use crate::refresh::{WAIT, labelled_pods_on, schedule_refresh};
use crate::{World, assert_eventually};
use kube::api::{Api, Patch, PatchParams};
use spot_node_manager::crd::{NodeGroup, Refresher};
use std::time::Duration;

/// A window open now (for the next hour), and one only on 1 January.
pub const OPEN: &str = r#"[{"schedule": "* * * * *", "duration": "1h"}]"#;
pub const CLOSED: &str = r#"[{"schedule": "0 0 1 1 *", "duration": "1m"}]"#;

pub fn windows(json: &str) -> serde_json::Value {
    serde_json::from_str(json).expect("windows")
}

/// Sets the `workers` group's maintenance windows.
pub async fn set_windows(groups: &Api<NodeGroup>, windows: serde_json::Value) {
    groups
        .patch(
            "workers",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"disruption": {"windows": windows}}})),
        )
        .await
        .expect("set windows");
}

/// Starts a run (surplus 1, and the `extra` refresh fields) in an open
/// window and closes the window once the run has its first node in hand. A
/// budget holds that node's drain until the window is closed: its
/// replacement comes up with the surplus, so the node could otherwise be
/// done, and the next one's replacement launched (the window still open),
/// before the window closed.
pub async fn close_the_window_mid_run(
    world: &World,
    groups: &Api<NodeGroup>,
    extra: serde_json::Value,
) {
    let names: Vec<String> = world
        .nodes()
        .await
        .expect("the world's nodes")
        .iter()
        .map(|n| n.metadata.name.clone().unwrap_or_default())
        .collect();
    labelled_pods_on(world, &names, "held", &[("app", "protected")]).await;
    crate::create_pdb(world, names.len() as i32).await;
    crate::assert_pdb_allows(world, 0).await;
    let mut refresh = serde_json::json!({"surplusNodes": 1});
    if let (Some(r), Some(e)) = (refresh.as_object_mut(), extra.as_object()) {
        r.extend(e.clone());
    }
    schedule_refresh(world, "workers", refresh).await;
    let refreshers: Api<Refresher> = world.api();
    assert_eventually("the first node in hand", WAIT, || async {
        let status = refreshers.get("workers").await.ok()?.status?;
        status.current_target.map(|_| ())
    })
    .await;
    set_windows(groups, windows(CLOSED)).await;
    // The refresher sees the closed window long before the drain, let go,
    // ends (the budget's status, a drain step, the pod gone).
    tokio::time::sleep(Duration::from_secs(1)).await;
    crate::set_min_available(world, 0).await;
}

/// Waits until no group holds a manager-wide disruption slot.
pub async fn assert_slots_given_back(world: &World) {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = world.api();
    assert_eventually("every slot given back", WAIT, || async {
        let slots = leases
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|l| {
                l.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.ends_with("-disruptions"))
            })?;
        let holders = slots
            .metadata
            .annotations
            .and_then(|a| a.get("nodemanager.dev/disruption-slots").cloned())
            .unwrap_or_default();
        (holders == "[]").then_some(())
    })
    .await;
}
