//! Which pools to trust: a zone whose spot instances keep being reclaimed
//! gets a record (and a Warning once), and a later shortage elsewhere
//! raises the clean zone first.

use super::*;

const NO_CAPACITY: &str = "snm.test/no-capacity";

#[tokio::test]
async fn a_pool_interrupted_again_and_again_is_the_last_a_shortage_elsewhere_raises() {
    let steady = SteadyGroup::workers("int-pools")
        .interruption_queue()
        .start()
        .await;
    let (world, kops, queue) = (&steady.world, &steady.kops, steady.queue());
    let nodes: Api<Node> = Api::all(world.client.clone());
    let (a, c, d) = (
        kops.asgs[0].clone(),
        kops.asgs[1].clone(),
        kops.asgs[2].clone(),
    );
    // Zone a's spot instance is reclaimed three times in a row.
    for round in 0..3 {
        let victim = world.asg_instances(&a).await.remove(0);
        queue.send(&spot_warning(&victim, Utc::now())).await;
        assert_eventually(&format!("warning {round} marked"), WAIT, || {
            marked(&nodes, &victim)
        })
        .await;
        assert_eventually(&format!("warning {round} in the record"), WAIT, || async {
            let status = steady.groups.get("workers").await.ok()?.status?;
            let asg = status.auto_scaling_groups.iter().find(|g| g.name == a)?;
            let known = asg
                .recent
                .iter()
                .any(|e| e.instance_id.as_deref() == Some(victim.as_str()));
            known.then_some(())
        })
        .await;
        assert_eventually(&format!("{victim} replaced in zone a"), RUN, || async {
            let ids = world.asg_instances(&a).await;
            let ready = ready_count(&steady.groups, "workers").await? == 3;
            (ready && ids.len() == 1 && !ids.contains(&victim)).then_some(())
        })
        .await;
    }
    assert_eventually("the pool called unreliable once", WAIT, || async {
        (event_count(world, "UnreliablePool").await == 1).then_some(())
    })
    .await;

    // Spot runs out in zone c and its node is reclaimed: zones a and d can
    // both launch, a comes first by name and count, but d is raised.
    world.tag_asg(&c, NO_CAPACITY, "true").await;
    let lost = world.asg_instances(&c).await.remove(0);
    let before = world.asg_snapshot(&kops.asgs).await;
    world.lose_instance(&lost).await;
    let raised = assert_eventually("a raise elsewhere", WAIT, || async {
        let now = world.asg_snapshot(&kops.asgs).await;
        now.iter()
            .zip(&before)
            .find(|((name, desired, _), (_, was, _))| *name != c && desired > was)
            .map(|((name, _, _), _)| name.clone())
    })
    .await;
    assert_eq!(raised, d, "the clean zone first, not {raised}");
    assert_eventually("3 Ready again", RUN, || async {
        (ready_count(&steady.groups, "workers").await? == 3).then_some(())
    })
    .await;
    assert_eq!(event_count(world, "UnreliablePool").await, 1);
}
