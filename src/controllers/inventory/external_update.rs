//! The group's `ExternalUpdate` condition: a kops rolling update replacing
//! the group's nodes, seen by kops's taint and, between two of kops's
//! instance groups, by when it was last seen.

use crate::crd::NodeGroupStatus;
use crate::crd::condition::{ConditionStatus, EXTERNAL_UPDATE, set_condition};
use crate::crd::labels::SCHEDULED_FOR_UPDATE_TAINT;

/// The reason of a True `ExternalUpdate`.
pub const KOPS_ROLLING_UPDATE: &str = "KopsRollingUpdate";

/// How long a kops rolling update is taken as running after its taint was
/// last seen on a member, while the group is not whole again (members
/// drifted, or fewer Ready than desired). kops rolls one instance group
/// after another; between two it validates the cluster (twice,
/// `ValidateSuccessDuration` 10 s apart, usually done within a minute)
/// with no node tainted, and a group over several instance groups would
/// otherwise start its own drift roll of kops's next instance group in
/// that gap. With maxSurge 0 kops terminates an instance group's last
/// tainted node first and then waits for its ASG's replacement: no node
/// is tainted then either, and the replenisher would answer the shortage
/// kops is already answering. Kept short: the replenisher pauses too.
pub const KOPS_BETWEEN_GROUPS: std::time::Duration = std::time::Duration::from_secs(300);

/// What the inventory saw of a kops rolling update: members tainted
/// scheduled-for-update, members drifted, members Ready of the desired count.
#[derive(Debug, Clone, Copy)]
pub struct KopsUpdate {
    pub tainted: usize,
    pub drifted: usize,
    pub ready: i32,
    pub desired: i32,
}

impl KopsUpdate {
    /// The group is not yet what a finished update leaves.
    fn unfinished(&self) -> bool {
        self.drifted > 0 || self.ready < self.desired
    }
}

/// Sets the group's `ExternalUpdate` condition: True while members carry
/// kops's scheduled-for-update taint (kops puts it on every node of an
/// instance group it will replace, the last one goes when the group is
/// done), and for [`KOPS_BETWEEN_GROUPS`] after, while the group is not
/// whole again (kops's next instance groups, a replacement kops waits
/// for); records when the taint was last seen in `kopsUpdateSeen`.
pub fn set_external_update(
    status: &mut NodeGroupStatus,
    seen: KopsUpdate,
    generation: Option<i64>,
    now: chrono::DateTime<chrono::Utc>,
) {
    if seen.tainted > 0 {
        status.kops_update_seen = Some(now);
    }
    let hold_until = status
        .kops_update_seen
        .map(|t| crate::controllers::group_view::after(t, KOPS_BETWEEN_GROUPS))
        .filter(|until| seen.unfinished() && now < *until);
    if seen.tainted == 0 && hold_until.is_none() {
        status.kops_update_seen = None;
    }
    let (state, reason, message) = match (seen.tainted, hold_until) {
        (0, None) => (
            ConditionStatus::False,
            "NoneInProgress",
            "no member carries kops.k8s.io/scheduled-for-update".to_string(),
        ),
        (0, Some(until)) => (
            ConditionStatus::True,
            KOPS_ROLLING_UPDATE,
            format!(
                "a kops rolling update may still be running (its next instance group, or a replacement it waits for): no member is tainted {SCHEDULED_FOR_UPDATE_TAINT} now, {} drifted, {} of {} Ready; no AWS mutation of our own until {} unless kops taints its next nodes first",
                seen.drifted,
                seen.ready,
                seen.desired,
                until.to_rfc3339()
            ),
        ),
        (n, _) => (
            ConditionStatus::True,
            KOPS_ROLLING_UPDATE,
            format!(
                "a kops rolling update is in progress ({n} node(s) tainted {SCHEDULED_FOR_UPDATE_TAINT}): no AWS mutation of our own until it ends"
            ),
        ),
    };
    set_condition(
        &mut status.conditions,
        EXTERNAL_UPDATE,
        state,
        reason,
        message,
        generation,
        now,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kops rolls a group's three instance groups one after another: between
    /// two, no member is tainted, yet the update goes on. Found with the
    /// test kit rolling as kops does: a group with `drift.action: Replace`
    /// started its own roll of kops's next instance group in that gap.
    #[test]
    fn a_kops_update_holds_between_two_instance_groups_while_members_are_drifted() {
        use crate::crd::condition::find;
        let t0 = chrono::Utc::now();
        let mut status = NodeGroupStatus::default();
        let at = |secs: i64| t0 + chrono::Duration::seconds(secs);
        let holds = |status: &NodeGroupStatus| {
            let c = find(&status.conditions, EXTERNAL_UPDATE).expect("the condition");
            (c.status == ConditionStatus::True, c.message.clone())
        };
        let seen = |tainted, drifted| KopsUpdate {
            tainted,
            drifted,
            ready: 3,
            desired: 3,
        };
        // The first instance group tainted: two others still drifted.
        set_external_update(&mut status, seen(1, 3), None, t0);
        assert!(holds(&status).0);
        // Done with it; kops validates before the next: held.
        set_external_update(&mut status, seen(0, 2), None, at(30));
        let (held, message) = holds(&status);
        assert!(held, "{message}");
        assert!(message.contains("may still be running"), "{message}");
        assert_eq!(status.kops_update_seen, Some(t0));
        // The next one tainted: the gap starts again from its end.
        set_external_update(&mut status, seen(1, 2), None, at(60));
        set_external_update(&mut status, seen(0, 1), None, at(60 + 299));
        assert!(holds(&status).0);
        // kops stopped (or was stopped) with a group still drifted: the hold
        // ends, the manager's own drift roll may go.
        set_external_update(&mut status, seen(0, 1), None, at(60 + 300));
        assert!(!holds(&status).0);
        assert_eq!(status.kops_update_seen, None);
        // Nothing drifted once the last group is done: no hold at all.
        set_external_update(&mut status, seen(1, 1), None, at(400));
        set_external_update(&mut status, seen(0, 0), None, at(401));
        assert!(!holds(&status).0);
        assert_eq!(status.kops_update_seen, None);
        // maxSurge 0: kops terminated its last tainted node and waits for
        // the ASG's replacement; nothing drifted, the group short: held
        // until the replacement is Ready.
        let short = |ready| KopsUpdate {
            tainted: 0,
            drifted: 0,
            ready,
            desired: 3,
        };
        set_external_update(&mut status, seen(1, 0), None, at(500));
        set_external_update(&mut status, short(2), None, at(530));
        let (held, message) = holds(&status);
        assert!(held && message.contains("2 of 3 Ready"), "{message}");
        set_external_update(&mut status, short(3), None, at(560));
        assert!(!holds(&status).0);
    }
}
