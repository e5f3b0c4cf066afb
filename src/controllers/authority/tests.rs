use super::observe::control_plane_of;
use super::*;
use crate::cloud::AsgDescription;
use crate::controllers::group_view::GroupNode;
use crate::controllers::group_view::tests::{fresh, status_node};
use crate::controllers::inventory::plan::tests::t0;
use crate::crd::nodegroup::DEFAULT_SCHEDULED_CHANGE_LEAD;
use crate::crd::nodegroup::NodeInterruption;
use crate::crd::{NodeGroup, NodeGroupStatus};
use chrono::{DateTime, Utc};

type Groups = Vec<(NodeGroup, Vec<AsgDescription>)>;

/// The control plane at `t0()`, with every Node's control-plane pods Ready.
fn seen(groups: &[(NodeGroup, Vec<AsgDescription>)]) -> ControlPlane {
    seen_at(groups, &serving(groups, &[]), t0())
}

fn seen_at(
    groups: &[(NodeGroup, Vec<AsgDescription>)],
    serving: &crate::k8s::control_plane::Serving,
    now: DateTime<Utc>,
) -> ControlPlane {
    control_plane_of(groups, serving, now)
}

/// Every Node of the groups but `joining`: whose control-plane pods are
/// Ready, since an hour before `t0()` (settled).
fn serving(
    groups: &[(NodeGroup, Vec<AsgDescription>)],
    joining: &[&str],
) -> crate::k8s::control_plane::Serving {
    groups
        .iter()
        .flat_map(|(g, _)| g.status.iter().flat_map(|s| s.nodes.iter()))
        .map(|n| n.name.clone())
        .filter(|n| !joining.contains(&n.as_str()))
        .map(|n| (n, t0() - chrono::Duration::hours(1)))
        .collect()
}

/// Records a notice of `kind` on master `id`'s Node, due at `deadline`,
/// the instance lost at `loss_at` when AWS said so (then drained from the
/// default lead before it).
fn notice(
    groups: &mut Groups,
    id: &str,
    kind: &str,
    deadline: DateTime<Utc>,
    loss_at: Option<DateTime<Utc>>,
) {
    let lead = crate::controllers::group_view::to_chrono(DEFAULT_SCHEDULED_CHANGE_LEAD);
    let drain_from = loss_at.map(|at| at - lead);
    for (g, _) in groups.iter_mut() {
        for n in g.status.iter_mut().flat_map(|s| s.nodes.iter_mut()) {
            if n.instance_id.as_deref() == Some(id) {
                n.interruption = Some(NodeInterruption {
                    kind: kind.into(),
                    noticed: t0(),
                    deadline,
                    loss_at,
                    drain_from,
                    late: None,
                    drained: None,
                });
            }
        }
    }
}

/// A Master group `name` over `asgs`, one master each, with the inventory's
/// Nodes (name, ASG, instance, Ready).
fn masters(name: &str, asgs: &[&str], nodes: &[(&str, &str, &str, bool)]) -> NodeGroup {
    let mut g = crate::controllers::inventory::plan::tests::group(asgs, asgs.len() as i32);
    g.spec.role = Role::Master;
    g.metadata.name = Some(name.into());
    g.status = Some(NodeGroupStatus {
        nodes: nodes
            .iter()
            .map(|(n, asg, id, ready)| {
                let mut s = status_node(n, asg, id);
                s.ready = *ready;
                s
            })
            .collect(),
        ..Default::default()
    });
    g
}

fn ask(cp: &ControlPlane, reason: Reason, instance: &str) -> Result<(), Blocked> {
    decide(
        Some(cp),
        &Request {
            reason,
            role: Role::Master,
            instance,
        },
    )
}

/// One Master group over three ASGs: m-a, m-b, m-c, all Ready.
fn one_group_of_three() -> Vec<(NodeGroup, Vec<AsgDescription>)> {
    vec![(
        masters(
            "masters",
            &["a", "b", "c"],
            &[
                ("n-a", "a", "m-a", true),
                ("n-b", "b", "m-b", true),
                ("n-c", "c", "m-c", true),
            ],
        ),
        vec![
            fresh("a", &[("m-a", "InService")]),
            fresh("b", &[("m-b", "InService")]),
            fresh("c", &[("m-c", "InService")]),
        ],
    )]
}

/// Three Master groups of one (kops's per-zone instance groups).
fn three_groups_of_one() -> Vec<(NodeGroup, Vec<AsgDescription>)> {
    ["a", "b", "c"]
        .iter()
        .map(|z| {
            let (node, id) = (format!("n-{z}"), format!("m-{z}"));
            (
                masters(&format!("master-{z}"), &[z], &[(&node, z, &id, true)]),
                vec![fresh(z, &[(&id, "InService")])],
            )
        })
        .collect()
}

/// `id` is counted down as beside its place's member.
fn assert_beside(cp: &ControlPlane, id: &str) {
    assert!(
        cp.down
            .iter()
            .any(|d| d.instance.as_deref() == Some(id) && d.why == DownWhy::Beside),
        "{cp:?}"
    );
}

/// One group over three ASGs, its masters a week old, and m-a2 (Node
/// Ready, launched two hours ago) beside m-a in a's ASG.
fn a2_beside_a() -> Groups {
    let mut groups = one_group_of_three();
    groups[0].1[0]
        .instances
        .push(fresh("a", &[("m-a2", "InService")]).instances[0].clone());
    if let Some(status) = groups[0].0.status.as_mut() {
        for n in &mut status.nodes {
            n.launch_time = Some(t0() - chrono::Duration::days(7));
        }
        let mut new = status_node("n-a2", "a", "m-a2");
        new.ready = true;
        new.launch_time = Some(t0() - chrono::Duration::hours(2));
        status.nodes.push(new);
    }
    groups
}

fn set_ready(groups: &mut [(NodeGroup, Vec<AsgDescription>)], id: &str, ready: bool) {
    for (g, _) in groups.iter_mut() {
        for n in g.status.iter_mut().flat_map(|s| s.nodes.iter_mut()) {
            if n.instance_id.as_deref() == Some(id) {
                n.ready = ready;
            }
        }
    }
}

/// Master `id` terminated: its ASG lists it Terminating and (once AWS has
/// launched it) its replacement `new` Pending, with no Node yet.
fn replaced(groups: &mut [(NodeGroup, Vec<AsgDescription>)], id: &str, new: Option<&str>) {
    for (_, fresh) in groups.iter_mut() {
        for asg in fresh.iter_mut() {
            if let Some(i) = asg.instances.iter_mut().find(|i| i.instance_id == id) {
                i.lifecycle_state = "Terminating".into();
                if let Some(new) = new {
                    let mut launched = i.clone();
                    launched.instance_id = new.into();
                    launched.lifecycle_state = "Pending".into();
                    asg.instances.push(launched);
                }
                break;
            }
        }
    }
}

#[test]
fn a_worker_is_never_refused_by_the_control_plane_rule() {
    let request = Request {
        reason: Reason::WorkerRepair,
        role: Role::Worker,
        instance: "i-1",
    };
    assert_eq!(decide(None, &request), Ok(()));
}

#[test]
fn a_master_is_never_taken_without_a_view_of_the_control_plane() {
    let request = Request {
        reason: Reason::Refresh,
        role: Role::Master,
        instance: "m-a",
    };
    assert_eq!(
        decide(None, &request),
        Err(Blocked::ControlPlaneUnobserved {
            instance: "m-a".into()
        })
    );
}

#[test]
fn with_every_master_ready_any_one_may_go_in_either_layout() {
    for groups in [one_group_of_three(), three_groups_of_one()] {
        let cp = seen(&groups);
        assert_eq!(cp.expected, 3);
        assert!(cp.whole(), "{cp:?}");
        assert_eq!(ask(&cp, Reason::Refresh, "m-b"), Ok(()));
    }
}

#[test]
fn a_dead_master_is_repaired_while_the_others_are_ready_in_either_layout() {
    for mut groups in [one_group_of_three(), three_groups_of_one()] {
        set_ready(&mut groups, "m-a", false);
        let cp = seen(&groups);
        assert!(!cp.whole());
        assert_eq!(ask(&cp, Reason::MasterRepair, "m-a"), Ok(()), "{cp:?}");
        // A healthy master may not go meanwhile.
        let refused = ask(&cp, Reason::Refresh, "m-b").expect_err("m-a is down");
        assert_eq!(refused.reason(), "OtherMastersNotReady");
    }
}

/// The masters' rule is asked for exactly the reasons the rule book binds
/// to it: with m-a dead, taking m-b is refused for those and allowed for the
/// others (an interruption drain, a run's surplus).
#[test]
fn the_masters_rule_holds_for_the_reasons_the_rule_book_binds_to_it() {
    let mut groups = three_groups_of_one();
    set_ready(&mut groups, "m-a", false);
    let cp = seen(&groups);
    for reason in Reason::ALL {
        let bound = rules::binds(reason, rules::Rule::Masters);
        assert_eq!(ask(&cp, reason, "m-b").is_err(), bound, "{reason:?}");
    }
    assert!(ask(&cp, Reason::InterruptionDrain, "m-b").is_ok());
}

#[test]
fn a_second_master_waits_while_the_first_ones_replacement_boots_in_either_layout() {
    for mut groups in [one_group_of_three(), three_groups_of_one()] {
        // m-a was repaired: terminating, its replacement without a Node yet.
        // m-b's kubelet died meanwhile.
        replaced(&mut groups, "m-a", Some("m-a2"));
        set_ready(&mut groups, "m-b", false);
        let cp = seen(&groups);
        let refused = ask(&cp, Reason::MasterRepair, "m-b").expect_err("m-a's replacement boots");
        let Blocked::OtherMastersDown {
            down,
            ready_besides,
            needed,
            ..
        } = &refused
        else {
            panic!("{refused:?}");
        };
        assert_eq!((*ready_besides, *needed), (1, 2));
        let ids: Vec<_> = down.iter().map(|d| d.instance.clone()).collect();
        assert_eq!(ids, vec![Some("m-a".into()), Some("m-a2".into())]);
        assert!(!refused.needs_user(), "a replacement is on its way");
        assert_eq!(refused.reason(), "OtherMastersNotReady");
    }
}

#[test]
fn a_terminated_master_not_yet_replaced_counts_as_a_place_down() {
    let mut groups = three_groups_of_one();
    // Gone from its ASG before the replacement was launched.
    groups[0].1[0].instances.clear();
    let cp = seen(&groups);
    assert_eq!(
        cp.down,
        vec![MasterDown {
            group: "master-a".into(),
            instance: None,
            why: DownWhy::Launching
        }]
    );
    assert!(ask(&cp, Reason::MasterRepair, "m-b").is_err());
}

#[test]
fn a_master_whose_node_is_ready_but_whose_instance_is_terminating_is_down() {
    let mut groups = one_group_of_three();
    replaced(&mut groups, "m-c", None);
    let cp = seen(&groups);
    assert!(!cp.ready.contains("m-c"), "the Node lags the termination");
    assert!(ask(&cp, Reason::DriftRoll, "m-a").is_err());
}

#[test]
fn two_dead_masters_of_three_are_left_to_the_user_and_say_so() {
    for mut groups in [one_group_of_three(), three_groups_of_one()] {
        set_ready(&mut groups, "m-a", false);
        set_ready(&mut groups, "m-b", false);
        let cp = seen(&groups);
        for target in ["m-a", "m-b"] {
            let refused = ask(&cp, Reason::MasterRepair, target).expect_err("quorum at risk");
            assert!(refused.needs_user(), "{refused:?}");
            assert_eq!(refused.reason(), "ControlPlaneQuorumAtRisk");
            assert!(refused.to_string().contains("by hand"), "{refused}");
        }
    }
}

#[test]
fn an_extra_master_instance_that_never_joined_may_be_removed_while_the_rest_are_ready() {
    let mut groups = one_group_of_three();
    groups[0].1[0]
        .instances
        .push(fresh("a", &[("m-x", "InService")]).instances[0].clone());
    let cp = seen(&groups);
    assert_eq!(ask(&cp, Reason::NeverJoined, "m-x"), Ok(()));
    // An instance beyond the count (kops's etcd never lets it join) holds
    // no place: it does not hold the others back.
    assert_eq!(ask(&cp, Reason::Refresh, "m-b"), Ok(()));
}

/// A place hands over only once its predecessor is gone: while the old
/// master of a place is still in its ASG (terminating, its machine still
/// holding the place's etcd volume), its Ready replacement is no member,
/// however Ready its pods; kops points each kube-apiserver at the etcd on
/// its own machine (`--etcd-servers=https://127.0.0.1:4001`, kops's
/// `pkg/model/components/apiserver.go`), and the volume attaches to one
/// instance at a time. Gone, the replacement is the place's member.
#[test]
fn a_replacement_beside_its_terminating_predecessor_counts_only_once_the_predecessor_is_gone() {
    for mut groups in [one_group_of_three(), three_groups_of_one()] {
        replaced(&mut groups, "m-a", Some("m-a2"));
        if let Some(status) = groups[0].0.status.as_mut() {
            let mut new = status_node("n-a2", "a", "m-a2");
            new.ready = true;
            status.nodes.push(new);
        }
        groups[0].1[0].instances[1].lifecycle_state = "InService".into();
        let cp = seen(&groups);
        assert!(
            cp.down
                .iter()
                .any(|d| d.instance.as_deref() == Some("m-a2") && d.why == DownWhy::Beside),
            "{cp:?}"
        );
        let refused = ask(&cp, Reason::Refresh, "m-b").expect_err("m-a's place is handing over");
        assert!(!refused.needs_user(), "on its way: {refused:?}");
        // The predecessor gone: its replacement is the place's member.
        groups[0].1[0].instances.retain(|i| i.instance_id != "m-a");
        let cp = seen(&groups);
        assert_eq!(ask(&cp, Reason::Refresh, "m-b"), Ok(()), "{cp:?}");
    }
}

/// For the plans' scenarios: the control plane of one Master group whose
/// nodes are `nodes` (each master in its place, Ready as its node is), with
/// `desired` places.
pub(crate) fn of_nodes(desired: i32, nodes: &[GroupNode]) -> ControlPlane {
    let mut cp = ControlPlane {
        expected: desired,
        ..Default::default()
    };
    for n in nodes {
        let id = n.instance_id.clone().unwrap_or_else(|| n.name.clone());
        match n.ready {
            true => {
                cp.ready.insert(id);
            }
            false => cp.down.push(MasterDown {
                group: "masters".into(),
                instance: Some(id),
                why: DownWhy::NotReady,
            }),
        }
    }
    cp
}

#[test]
fn a_master_group_none_of_whose_asgs_exists_holds_back_no_master() {
    let mut groups = three_groups_of_one();
    // A fourth Master group naming an ASG that does not exist (a typo).
    let mut typo = groups[0].clone();
    typo.0.metadata.name = Some("typo".into());
    typo.1.clear();
    groups.push(typo);
    let cp = seen(&groups);
    assert_eq!(cp.expected, 3, "{cp:?}");
    assert!(cp.whole(), "{cp:?}");
    assert_eq!(ask(&cp, Reason::Refresh, "m-b"), Ok(()));
    // An ASG that exists with its instance gone is still a place down.
    groups[0].1[0].instances.clear();
    assert!(ask(&seen(&groups), Reason::MasterRepair, "m-b").is_err());
}

#[test]
fn a_replaced_master_whose_node_is_ready_is_down_until_its_control_plane_pods_are() {
    for mut groups in [one_group_of_three(), three_groups_of_one()] {
        // m-a was repaired; its replacement's Node is Ready, its etcd still
        // joining. m-b's kubelet died meanwhile.
        replaced(&mut groups, "m-a", Some("m-a2"));
        let a = groups
            .iter()
            .position(|(g, _)| g.spec.asg_names().contains(&"a".to_string()));
        let a = a.expect("a group holds a");
        for asg in groups[a].1.iter_mut() {
            for i in asg.instances.iter_mut().filter(|i| i.instance_id == "m-a2") {
                i.lifecycle_state = "InService".into();
            }
        }
        if let Some(status) = groups[a].0.status.as_mut() {
            status.nodes.push(status_node("n-a2", "a", "m-a2"));
        }
        // Its predecessor gone (until then its place hands over: beside).
        for asg in groups[a].1.iter_mut() {
            asg.instances.retain(|i| i.instance_id != "m-a");
        }
        set_ready(&mut groups, "m-b", false);
        let joining = seen_at(&groups, &serving(&groups, &["n-a2"]), t0());
        assert!(!joining.ready.contains("m-a2"), "{joining:?}");
        assert!(
            joining
                .down
                .iter()
                .any(|d| d.instance.as_deref() == Some("m-a2") && d.why == DownWhy::Joining),
            "{joining:?}"
        );
        let refused =
            ask(&joining, Reason::MasterRepair, "m-b").expect_err("etcd at 1 of 3 otherwise");
        assert_eq!(refused.reason(), "OtherMastersNotReady");
        assert!(
            !refused.needs_user(),
            "the replacement's etcd is on its way"
        );
        assert!(
            refused.to_string().contains("control plane not Ready"),
            "{refused}"
        );
        // A refresh of m-c waits as well; the cluster is not whole.
        assert!(ask(&joining, Reason::Refresh, "m-c").is_err());
        assert!(!joining.whole());
        // Its etcd joined: m-b may go.
        let joined = seen_at(&groups, &serving(&groups, &[]), t0());
        assert_eq!(
            ask(&joined, Reason::MasterRepair, "m-b"),
            Ok(()),
            "{joined:?}"
        );
    }
}

#[test]
fn a_master_retiring_in_two_days_serves_until_its_loss_is_near() {
    for mut groups in [one_group_of_three(), three_groups_of_one()] {
        let start = t0() + chrono::Duration::days(2);
        let deadline = start - chrono::Duration::seconds(90);
        notice(
            &mut groups,
            "m-c",
            "scheduled_change",
            deadline,
            Some(start),
        );
        set_ready(&mut groups, "m-a", false);
        // Days ahead: m-c still counts, so dead m-a is repaired at once.
        let cp = seen(&groups);
        assert!(cp.ready.contains("m-c"), "{cp:?}");
        assert_eq!(ask(&cp, Reason::MasterRepair, "m-a"), Ok(()), "{cp:?}");
        // From its drain start (the lead before AWS takes it), m-c is
        // leaving: m-a waits.
        let near = start - crate::controllers::group_view::to_chrono(DEFAULT_SCHEDULED_CHANGE_LEAD);
        let cp = seen_at(&groups, &serving(&groups, &[]), near);
        assert!(
            cp.down
                .iter()
                .any(|d| d.instance.as_deref() == Some("m-c") && d.why == DownWhy::Leaving),
            "{cp:?}"
        );
        assert!(ask(&cp, Reason::MasterRepair, "m-a").is_err());
        // A minute before the lead it still served.
        let before = seen_at(
            &groups,
            &serving(&groups, &[]),
            near - chrono::Duration::minutes(1),
        );
        assert!(before.ready.contains("m-c"), "{before:?}");
    }
}

/// A spot interruption warning on master `id`: drained within 90 s.
fn spot_warning(groups: &mut Groups, id: &str) {
    let deadline = t0() + chrono::Duration::seconds(90);
    notice(groups, id, "spot_interruption", deadline, None);
}

#[test]
fn a_spot_warning_makes_a_master_leave_at_once() {
    let mut groups = three_groups_of_one();
    spot_warning(&mut groups, "m-c");
    let cp = seen(&groups);
    assert!(!cp.ready.contains("m-c"), "{cp:?}");
    assert!(ask(&cp, Reason::Refresh, "m-a").is_err());
    // Its own early retirement is no second master down.
    assert_eq!(ask(&cp, Reason::Retirement, "m-c"), Ok(()));
}

#[test]
fn a_master_at_risk_of_interruption_still_serves() {
    let mut groups = three_groups_of_one();
    // A rebalance recommendation: a risk, never a loss of its own.
    notice(
        &mut groups,
        "m-c",
        "rebalance_recommendation",
        t0() + chrono::Duration::seconds(90),
        None,
    );
    let cp = seen(&groups);
    assert!(cp.whole(), "{cp:?}");
    assert_eq!(ask(&cp, Reason::Refresh, "m-a"), Ok(()));
}

#[test]
fn a_master_retirement_asks_the_masters_rule() {
    let mut groups = three_groups_of_one();
    spot_warning(&mut groups, "m-c");
    set_ready(&mut groups, "m-a", false);
    let refused = ask(&seen(&groups), Reason::Retirement, "m-c").expect_err("m-a is down");
    // AWS takes m-c at its time anyway, and nothing brings m-a back: the
    // user's to act on.
    assert_eq!(refused.check(), "refused_other_masters_down");
    assert!(refused.needs_user(), "{refused:?}");
}

/// Issue 54: a master whose etcd has just joined counts as up only after
/// its group's `masterSettleTime` (default 2m) on every path, not only
/// between a refresh's masters: a repair of another master waits for it,
/// and is allowed from the moment it has settled.
#[test]
fn a_master_whose_control_plane_just_turned_ready_settles_before_another_goes() {
    for mut groups in [one_group_of_three(), three_groups_of_one()] {
        set_ready(&mut groups, "m-b", false);
        let node_a = groups
            .iter()
            .flat_map(|(g, _)| g.status.iter().flat_map(|s| s.nodes.iter()))
            .find(|n| n.instance_id.as_deref() == Some("m-a"))
            .map(|n| n.name.clone())
            .expect("m-a's node");
        let mut serving = serving(&groups, &[]);
        // m-a's etcd joined 30 s ago.
        serving.insert(node_a.clone(), t0() - chrono::Duration::seconds(30));
        let cp = seen_at(&groups, &serving, t0());
        let until = t0() + chrono::Duration::seconds(90);
        assert!(
            cp.down
                .iter()
                .any(|d| d.instance.as_deref() == Some("m-a")
                    && d.why == DownWhy::Settling { until }),
            "{cp:?}"
        );
        let refused = ask(&cp, Reason::MasterRepair, "m-b").expect_err("m-a is settling");
        assert!(!refused.needs_user(), "m-a is on its way: {refused}");
        assert!(
            refused
                .to_string()
                .contains(&format!("settling until {}", until.to_rfc3339())),
            "{refused}"
        );
        assert!(!cp.whole());
        // A second before, still settling; from `until`, m-b may go.
        let before = seen_at(&groups, &serving, until - chrono::Duration::seconds(1));
        assert!(ask(&before, Reason::MasterRepair, "m-b").is_err());
        let settled = seen_at(&groups, &serving, until);
        assert_eq!(
            ask(&settled, Reason::MasterRepair, "m-b"),
            Ok(()),
            "{settled:?}"
        );
    }
}

/// Every group's `refresh.masterSettleTime`.
fn with_settle_time(groups: &mut Groups, settle: &str) {
    for (g, _) in groups.iter_mut() {
        g.spec.refresh = Some(
            serde_json::from_value(
                serde_json::json!({"schedule": "0 3 * * *", "masterSettleTime": settle}),
            )
            .expect("refresh"),
        );
    }
}

#[test]
fn a_group_s_own_master_settle_time_is_the_one_waited() {
    let mut groups = three_groups_of_one();
    with_settle_time(&mut groups, "10s");
    set_ready(&mut groups, "m-b", false);
    let mut serving = serving(&groups, &[]);
    for since in serving.values_mut() {
        *since = t0() - chrono::Duration::seconds(5);
    }
    let cp = seen_at(&groups, &serving, t0());
    assert!(ask(&cp, Reason::MasterRepair, "m-b").is_err(), "{cp:?}");
    let cp = seen_at(&groups, &serving, t0() + chrono::Duration::seconds(5));
    assert_eq!(ask(&cp, Reason::MasterRepair, "m-b"), Ok(()), "{cp:?}");
}

#[test]
fn a_settle_time_past_what_a_date_holds_never_ends_and_does_not_panic() {
    let mut groups = three_groups_of_one();
    with_settle_time(&mut groups, "999999999999h");
    set_ready(&mut groups, "m-b", false);
    let cp = seen_at(&groups, &serving(&groups, &[]), t0());
    assert!(ask(&cp, Reason::MasterRepair, "m-b").is_err(), "{cp:?}");
}

/// Issue 68, hole 3: a master at risk replaced first in its own ASG (max
/// 2): the replacement beside it is not an etcd member while it is there
/// (kops keeps each member on one EBS volume per master place, tagged
/// `k8s.io/etcd/main: a/a,b,c`: kops's docs "Backing up etcd" and its
/// Terraform output `ebs.tf`; an EBS volume attaches to one instance),
/// so it does not count as up. With master b dead, a may not go: only c
/// would serve etcd.
#[test]
fn a_replacement_beside_its_predecessor_is_not_up_until_the_predecessor_is_gone() {
    let mut groups = a2_beside_a();
    let cp = seen(&groups);
    assert!(!cp.ready.contains("m-a2"), "{cp:?}");
    assert_beside(&cp, "m-a2");
    set_ready(&mut groups, "m-b", false);
    let cp = seen(&groups);
    let refused = ask(&cp, Reason::AtRisk, "m-a").expect_err("only c would serve etcd");
    assert!(
        refused.to_string().contains("beside its predecessor"),
        "{refused}"
    );
    assert!(
        !refused.needs_user(),
        "a's replacement is on its way: {refused}"
    );
    // The predecessor gone: its replacement is the member, and serves.
    set_ready(&mut groups, "m-b", true);
    groups[0].1[0].instances.remove(0);
    let cp = seen(&groups);
    assert!(cp.ready.contains("m-a2"), "{cp:?}");
    assert!(cp.whole(), "{cp:?}");
}

/// An instance beside its place's member has no etcd of its own, so in a
/// kops cluster its kube-apiserver (pointed at the etcd on its own machine)
/// never turns Ready while it waits: past its `joinTimeout` it is beside,
/// on its way, not a master "not serving" that only the user can bring
/// back; the member, crash-looping the same way, is.
#[test]
fn a_replacement_waiting_beside_its_member_without_ready_pods_is_beside_not_stuck() {
    let mut groups = a2_beside_a();
    let cp = seen_at(&groups, &serving(&groups, &["n-a2"]), t0());
    assert_beside(&cp, "m-a2");
    set_ready(&mut groups, "m-b", false);
    let cp = seen_at(&groups, &serving(&groups, &["n-a2"]), t0());
    let refused = ask(&cp, Reason::MasterRepair, "m-b");
    assert_eq!(refused, Ok(()), "two members serve: {cp:?}");
    // c dies too: one member serves, and the one beside a brings back no
    // place: the user is needed, not a wait.
    set_ready(&mut groups, "m-c", false);
    let cp = seen_at(&groups, &serving(&groups, &["n-a2"]), t0());
    let refused = ask(&cp, Reason::MasterRepair, "m-b").expect_err("etcd at 1 of 3");
    assert!(refused.needs_user(), "{refused}");
    set_ready(&mut groups, "m-c", true);
    // The member itself without Ready pods past its joinTimeout is stuck.
    let cp = seen_at(&groups, &serving(&groups, &["n-a2", "n-a"]), t0());
    assert!(
        cp.down
            .iter()
            .any(|d| d.instance.as_deref() == Some("m-a") && d.why == DownWhy::NotServing),
        "{cp:?}"
    );
}

/// A master beside a serving member (its ASG raised by its user) takes
/// nothing from a whole control plane: every place is served. Before, it
/// was "down", so no master run ever started ("not every master of the
/// cluster is Ready") while it stood there, which in kops is for good.
#[test]
fn a_master_beside_a_serving_member_leaves_the_control_plane_whole() {
    let mut groups = a2_beside_a();
    let cp = seen_at(&groups, &serving(&groups, &["n-a2"]), t0());
    assert_beside(&cp, "m-a2");
    assert!(cp.whole(), "{cp:?}");
    // A member down is not whole, with or without one beside.
    set_ready(&mut groups, "m-b", false);
    let cp = seen_at(&groups, &serving(&groups, &["n-a2"]), t0());
    assert!(!cp.whole(), "{cp:?}");
    // Nor is a place handing over: its predecessor leaving.
    set_ready(&mut groups, "m-b", true);
    groups[0].1[0].instances[0].lifecycle_state = "Terminating".into();
    let cp = seen_at(&groups, &serving(&groups, &[]), t0());
    assert!(!cp.whole(), "{cp:?}");
}

/// Hole 3, one Master group over three ASGs (one master place each): the
/// member of a place is its ASG's oldest instance, not the group's oldest
/// three. Master a has a second instance beside it (a2, launched two hours
/// ago); b was replaced an hour ago (b2, newer than a2). b2 is b's place's
/// member and serves; a2 is beside a. Counted group-wide, a2 was a member
/// and b2 beside: with b2 down, c could go while only a served etcd.
#[test]
fn in_one_group_over_three_asgs_each_asgs_oldest_master_is_its_places_member() {
    let mut groups = one_group_of_three();
    let launched = |id: &str, hours: i64| {
        let mut node = status_node(&format!("n-{id}"), &id[2..3], id);
        node.ready = true;
        node.launch_time = Some(t0() - chrono::Duration::hours(hours));
        node
    };
    groups[0].1[0]
        .instances
        .push(fresh("a", &[("m-a2", "InService")]).instances[0].clone());
    groups[0].1[1].instances = fresh("b", &[("m-b2", "InService")]).instances;
    if let Some(status) = groups[0].0.status.as_mut() {
        status.nodes.retain(|n| n.name != "n-b");
        for n in &mut status.nodes {
            n.launch_time = Some(t0() - chrono::Duration::days(7));
        }
        status.nodes.push(launched("m-a2", 2));
        status.nodes.push(launched("m-b2", 1));
    }
    let cp = seen(&groups);
    assert!(cp.ready.contains("m-b2"), "{cp:?}");
    assert!(!cp.ready.contains("m-a2"), "{cp:?}");
    assert_beside(&cp, "m-a2");
    set_ready(&mut groups, "m-b2", false);
    let cp = seen(&groups);
    assert!(
        ask(&cp, Reason::Refresh, "m-c").is_err(),
        "only a would serve etcd: {cp:?}"
    );
}

/// Issue 68, hole 4: a master whose Node is Ready and whose control-plane
/// pods are not, past its group's joinTimeout from launch, is not on its
/// way: it is not serving, and a removal it holds back says only the user
/// can end it.
#[test]
fn a_master_not_serving_past_its_join_timeout_is_named_and_on_no_way_back() {
    let mut groups = three_groups_of_one();
    for (g, _) in groups.iter_mut() {
        g.spec.replenish.join_timeout = "15m".into();
        for n in g.status.iter_mut().flat_map(|s| s.nodes.iter_mut()) {
            n.launch_time = Some(t0() - chrono::Duration::minutes(10));
        }
    }
    let serving_but_c = serving(&groups, &["n-c"]);
    let cp = seen_at(&groups, &serving_but_c, t0());
    assert!(
        cp.down
            .iter()
            .any(|d| d.instance.as_deref() == Some("m-c") && d.why == DownWhy::Joining),
        "within its join timeout: joining, {cp:?}"
    );
    let later = t0() + chrono::Duration::minutes(6);
    let cp = seen_at(&groups, &serving_but_c, later);
    let down = cp
        .down
        .iter()
        .find(|d| d.instance.as_deref() == Some("m-c"))
        .expect("c down");
    assert_eq!(down.why, DownWhy::NotServing);
    assert!(down.to_string().contains("not serving"), "{down}");
    let refused = ask(&cp, Reason::Refresh, "m-a").expect_err("c does not serve");
    assert!(refused.needs_user(), "{refused}");
    assert_eq!(refused.reason(), "ControlPlaneQuorumAtRisk");
}

/// Hole 5: master-c's group names an ASG kops renamed (nothing describes),
/// so the groups alone count two masters; its Node, labelled control
/// plane, is in no described ASG.
fn with_a_renamed_asg(ready: bool) -> (Groups, Vec<crate::k8s::control_plane::MasterNode>) {
    let mut groups = three_groups_of_one();
    groups[2].1.clear();
    if let Some(s) = groups[2].0.status.as_mut() {
        s.nodes.clear();
    }
    let node = |name: &str, id: &str, ready| crate::k8s::control_plane::MasterNode {
        name: name.into(),
        instance: Some(id.into()),
        ready,
    };
    let nodes = vec![
        node("n-a", "m-a", true),
        node("n-b", "m-b", true),
        node("n-c", "m-c", ready),
    ];
    (groups, nodes)
}

fn cross_checked(groups: &Groups, nodes: &[crate::k8s::control_plane::MasterNode]) -> ControlPlane {
    let unlisted = super::observe::unlisted_of(groups, nodes);
    let mut serving = serving(groups, &[]);
    for n in &unlisted {
        serving.insert(n.name.clone(), t0() - chrono::Duration::hours(1));
    }
    let mut cp = seen_at(groups, &serving, t0());
    super::observe::count_unlisted(&mut cp, &unlisted, &serving, t0());
    cp
}

#[test]
fn a_control_plane_node_no_group_holds_counts_as_a_master_up_or_down() {
    // The groups alone: two masters expected, two up, so one may go (the
    // user allowing the outage a cluster of two would be) while the third
    // (etcd's member all the same) is dead: the hole.
    let (mut groups, nodes) = with_a_renamed_asg(false);
    for (g, _) in groups.iter_mut() {
        g.spec.disruption.allow_control_plane_outage = true;
    }
    assert_eq!(seen(&groups).expected, 2);
    assert_eq!(ask(&seen(&groups), Reason::Refresh, "m-a"), Ok(()));

    // Cross-checked: the dead Node is a master down, named, and holds
    // every other master back.
    let cp = cross_checked(&groups, &nodes);
    assert_eq!(cp.expected, 3);
    let refused = ask(&cp, Reason::Refresh, "m-a").expect_err("a master down");
    let said = refused.to_string();
    assert!(
        said.contains("m-c (a control-plane Node in no Master group's ASGs"),
        "{said}"
    );
    assert!(!refused.needs_user(), "two of three up: no quorum at risk");
    assert_eq!(refused.reason(), "OtherMastersNotReady");
    assert_eq!(
        ask(&cp, Reason::MasterRepair, "m-a").map_err(|e| e.reason()),
        Err("OtherMastersNotReady")
    );

    // Up, it counts on both sides: the decision is the groups' own.
    let (groups, nodes) = with_a_renamed_asg(true);
    let cp = cross_checked(&groups, &nodes);
    assert_eq!((cp.expected, cp.ready.len()), (3, 3));
    assert!(cp.whole(), "{cp:?}");
    assert_eq!(ask(&cp, Reason::Refresh, "m-a"), Ok(()));
}

#[test]
fn an_unlisted_master_counts_only_once_its_control_plane_has_settled() {
    let (groups, nodes) = with_a_renamed_asg(true);
    let unlisted = super::observe::unlisted_of(&groups, &nodes);
    let mut serving = serving(&groups, &[]);
    let counted = |serving: &crate::k8s::control_plane::Serving| {
        let mut cp = seen_at(&groups, serving, t0());
        super::observe::count_unlisted(&mut cp, &unlisted, serving, t0());
        cp
    };
    // Its Node Ready, no control-plane pod Ready on it: down.
    let cp = counted(&serving);
    assert_eq!(cp.down.len(), 1, "{cp:?}");
    assert!(ask(&cp, Reason::Refresh, "m-a").is_err());
    // Ready a minute ago: settling (the default settle time is longer).
    serving.insert("n-c".into(), t0() - chrono::Duration::minutes(1));
    let cp = counted(&serving);
    assert_eq!(cp.down.len(), 1, "{cp:?}");
    assert!(ask(&cp, Reason::Refresh, "m-a").is_err());
    // Settled: up.
    serving.insert("n-c".into(), t0() - chrono::Duration::hours(1));
    assert!(counted(&serving).whole());
}

#[test]
fn nodes_the_groups_hold_are_not_unlisted() {
    // Held by a described ASG, or listed by name in a group's inventory
    // (a Node whose providerID says nothing), or neither.
    let groups = three_groups_of_one();
    let node = |name: &str, id: Option<&str>| crate::k8s::control_plane::MasterNode {
        name: name.into(),
        instance: id.map(Into::into),
        ready: true,
    };
    let nodes = vec![
        node("n-a", Some("m-a")),
        node("n-b", None),
        node("x", Some("m-x")),
        node("y", None),
    ];
    let unlisted: Vec<String> = super::observe::unlisted_of(&groups, &nodes)
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(unlisted, ["x", "y"]);
    // A group naming an ASG that was never made, with no Node of its own:
    // no master counted for it, as before.
    let mut groups = three_groups_of_one();
    groups.push((masters("typo", &["nope"], &[]), vec![]));
    let cp = cross_checked(&groups, &[node("n-a", Some("m-a"))]);
    assert_eq!(cp.expected, 3);
    assert!(cp.whole(), "{cp:?}");
}

/// Issue 69 item 6: with one master (kops's default, `kops create cluster`
/// without `--control-plane-zones` makes one: kops's
/// `upup/pkg/fi/cloudup/new_cluster.go` `setupControlPlane` at 268927e2)
/// or two, etcd keeps no quorum without the one taken: every reason that
/// asks the masters' rule is refused unless every Master group allows the
/// outage, while a second instance beside the member (a never-joined one,
/// a surplus) may still go, and a cluster of three is as before.
#[test]
fn a_master_whose_loss_stops_the_api_goes_only_when_every_master_group_allows_it() {
    let one = |allow: bool| {
        let mut g = masters("masters", &["a"], &[("n-a", "a", "m-a", true)]);
        g.spec.disruption.allow_control_plane_outage = allow;
        vec![(g, vec![fresh("a", &[("m-a", "InService")])])]
    };
    let cp = seen(&one(false));
    assert_eq!((cp.expected, cp.ready.len()), (1, 1), "{cp:?}");
    for reason in [
        Reason::Refresh,
        Reason::DriftRoll,
        Reason::AtRisk,
        Reason::MasterRepair,
        Reason::Retirement,
    ] {
        let refused = ask(&cp, reason, "m-a").expect_err("the only master");
        assert_eq!(refused.reason(), "ControlPlaneOutage", "{reason:?}");
        assert!(!refused.needs_user(), "a setting ends it, not a repair");
        let said = refused.to_string();
        assert!(
            said.contains("1 master(s)") && said.contains("allowControlPlaneOutage"),
            "{said}"
        );
    }
    // A reason free of the masters' rule is not asked.
    assert_eq!(ask(&cp, Reason::InterruptionDrain, "m-a"), Ok(()));
    // Allowed: the only master may go (never two down: the rule as before).
    let allowed = seen(&one(true));
    assert!(allowed.outage_allowed && allowed.outage().is_none());
    assert_eq!(ask(&allowed, Reason::Refresh, "m-a"), Ok(()));

    // An instance beside the member (a user's raise, one never joined):
    // the member stays up, so it may go; the member may not.
    let mut beside = one(false);
    beside[0].1[0] = fresh("a", &[("m-a", "InService"), ("m-b", "InService")]);
    let cp = seen(&beside);
    assert_eq!(ask(&cp, Reason::ScaleIn, "m-b"), Ok(()), "{cp:?}");
    assert_eq!(ask(&cp, Reason::NeverJoined, "m-b"), Ok(()), "{cp:?}");
    assert!(ask(&cp, Reason::ScaleIn, "m-a").is_err());

    // Two masters: one left is no quorum of two, whatever the reason.
    let two = |allow: [bool; 2]| -> Groups {
        ["a", "b"]
            .iter()
            .zip(allow)
            .map(|(z, allow)| {
                let (node, id) = (format!("n-{z}"), format!("m-{z}"));
                let mut g = masters(&format!("master-{z}"), &[z], &[(&node, z, &id, true)]);
                g.spec.disruption.allow_control_plane_outage = allow;
                (g, vec![fresh(z, &[(&id, "InService")])])
            })
            .collect()
    };
    let refused = ask(&seen(&two([false, false])), Reason::Refresh, "m-a").expect_err("two");
    assert!(refused.to_string().contains("needs 2 of 2"), "{refused}");
    // Only when every Master group allows it.
    assert!(ask(&seen(&two([true, false])), Reason::Refresh, "m-a").is_err());
    assert!(ask(&seen(&two([false, true])), Reason::Refresh, "m-b").is_err());
    assert_eq!(
        ask(&seen(&two([true, true])), Reason::Refresh, "m-a"),
        Ok(())
    );

    // Three: one down leaves the quorum; unchanged, with or without it.
    let cp = seen(&three_groups_of_one());
    assert!(!cp.outage_allowed && cp.outage().is_none());
    assert_eq!(ask(&cp, Reason::Refresh, "m-a"), Ok(()));
}
