//! The upgrade promise (docs/operations.md, "Upgrading"): a refresh started by the
//! release we upgrade from, whose manager is killed mid-run, is finished by
//! this tree's manager from what the old one persisted, each old node
//! terminated once. The old binary is built from git history by
//! `scripts/upgrade-from` (scripts/test exports `SNM_UPGRADE_FROM_BIN`).

use snm_testkit as support;

use kube::api::Api;
use spot_node_manager::crd::Refresher;
use spot_node_manager::crd::refresher::RefreshPhase;
use std::path::PathBuf;
use std::time::Duration;
use support::assert_eventually;
use support::refresh::*;
use support::steady::*;

fn version_of(binary: &std::path::Path) -> String {
    let out = std::process::Command::new(binary)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("run {} --version: {e}", binary.display()));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn a_refresh_started_by_the_previous_release_is_finished_by_this_one() {
    let old: PathBuf = std::env::var_os("SNM_UPGRADE_FROM_BIN")
        .expect(
            "SNM_UPGRADE_FROM_BIN: the earlier release's manager; build it with \
             scripts/upgrade-from (scripts/test does)",
        )
        .into();
    let (old_version, new_version) = (version_of(&old), version_of(&support::manager_binary()));
    assert_ne!(
        old_version, new_version,
        "the upgrade test needs two different builds"
    );
    eprintln!("upgrading from {old_version} to {new_version}");

    let g = SteadyGroup::workers("upgrade")
        .manager_binary(&old)
        .start()
        .await;
    let mut manager = g.manager;
    let (world, kops) = (&g.world, &g.kops);
    let before = world.asg_snapshot(&kops.asgs).await;
    let original = all_instances(world, &kops.asgs).await;
    // Pods make each drain take two steps, so the run is caught mid-drain.
    pods_on(world, &node_names(world, &original).await).await;
    let sampler = sample(world, &kops.asgs, 3).await;
    schedule_refresh(world, "workers", serde_json::json!({"surplusNodes": 1})).await;

    // The old release: killed (as a Deployment's rollout would, at worst)
    // while draining a node after at least one replacement.
    let refreshers: Api<Refresher> = world.api();
    let replaced = assert_eventually("the old release mid-run", RUN, || async {
        let s = refreshers.get("workers").await.ok()?.status?;
        (s.phase == RefreshPhase::Draining && s.run_start.is_some() && s.replaced >= 1)
            .then_some(s.replaced)
    })
    .await;
    manager.kill();
    eprintln!("killed {old_version} while draining, after {replaced} replacement(s)");
    tokio::time::sleep(Duration::from_secs(2)).await;

    // This release takes over from status.
    let (manager, _new_config) = world.start_manager(&[]);
    assert_taken_over_run_finished(world, &kops.asgs, &manager, sampler, &original, &before).await;
}
