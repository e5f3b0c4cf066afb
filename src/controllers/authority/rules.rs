//! The rule book: which of the rules binds which reason the manager has to
//! take a node away. One table, [`binding`]; one function applies it,
//! `super::validate::validate`, which the executor asks (through each
//! path's guard) before every effect that takes capacity away, and the
//! plans ask to choose; so a row changed here changes what every path
//! does. `docs/concepts/disruption.md` shows the
//! table as [`markdown`] renders it, and a test keeps the two the same.

use crate::crd::Role;
use crate::crd::refresher::{RefreshTarget, RunTrigger, TargetPurpose};
use std::collections::BTreeMap;

/// Every reason the manager takes a node away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// A scheduled (or manual) refresh run replaces a node.
    Refresh,
    /// A drift roll replaces a node whose launch template is out of date.
    DriftRoll,
    /// A refresh run (or drift roll) takes back its own surplus.
    RefreshSurplus,
    /// The replenisher takes back a surplus after a shortage ended.
    ScaleIn,
    /// A node at risk (rebalance recommendation, `Replace`) is removed
    /// once replaced.
    AtRisk,
    /// The on-demand fallback's nodes go once spot can launch again.
    FallbackReturn,
    /// An instance that never joined is terminated.
    NeverJoined,
    /// A worker NotReady past the unhealthy timeout is replaced.
    WorkerRepair,
    /// A master NotReady past the unhealthy timeout is replaced.
    MasterRepair,
    /// A node AWS reclaims (spot warning, scheduled change) is drained.
    InterruptionDrain,
    /// A reclaimed node, replaced, is terminated before AWS takes it.
    Retirement,
}

impl Reason {
    pub const ALL: [Reason; 11] = [
        Reason::Refresh,
        Reason::DriftRoll,
        Reason::RefreshSurplus,
        Reason::ScaleIn,
        Reason::AtRisk,
        Reason::FallbackReturn,
        Reason::NeverJoined,
        Reason::WorkerRepair,
        Reason::MasterRepair,
        Reason::InterruptionDrain,
        Reason::Retirement,
    ];

    /// The repair of a node of a group of `role`.
    pub fn repair(role: Role) -> Reason {
        match role {
            Role::Master => Reason::MasterRepair,
            Role::Worker => Reason::WorkerRepair,
        }
    }

    /// The reason a label names (`label`'s inverse), for a reason carried
    /// in a status.
    pub fn from_label(label: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.label() == label)
    }

    /// For logs, messages and metric labels: a fixed set.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Refresh => "refresh",
            Reason::DriftRoll => "drift_roll",
            Reason::RefreshSurplus => "refresh_surplus",
            Reason::ScaleIn => "scale_in",
            Reason::AtRisk => "at_risk",
            Reason::FallbackReturn => "fallback_return",
            Reason::NeverJoined => "never_joined",
            Reason::WorkerRepair => "worker_repair",
            Reason::MasterRepair => "master_repair",
            Reason::InterruptionDrain => "interruption_drain",
            Reason::Retirement => "retirement",
        }
    }

    /// For the docs' table.
    fn title(self) -> &'static str {
        match self {
            Reason::Refresh => "refresh",
            Reason::DriftRoll => "drift roll",
            Reason::RefreshSurplus => "a run's surplus taken back",
            Reason::ScaleIn => "replenisher's scale-in",
            Reason::AtRisk => "node at risk removed",
            Reason::FallbackReturn => "return from on-demand",
            Reason::NeverJoined => "never-joined instance",
            Reason::WorkerRepair => "worker repair",
            Reason::MasterRepair => "master repair",
            Reason::InterruptionDrain => "interruption drain",
            Reason::Retirement => "reclaimed node retired early",
        }
    }
}

/// The rules a disruption may have to keep, in the order they are asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    /// Nothing of ours happens to a group that is suspended, whose spec is
    /// invalid, or whose nodes a kops rolling update is replacing.
    Stopped,
    /// A worker group's circuit breaker (too much of it NotReady at once:
    /// a partition or an AZ outage) is closed.
    Breaker,
    /// A master goes only while the other masters that are up number at
    /// least the expected count less one (`super::decide`).
    Masters,
    /// Only inside a maintenance window (`spec.disruption.windows`).
    Window,
    /// Never a protected node (do-not-disrupt, someone else's cordon, a
    /// pod with no controller).
    DoNotDisrupt,
    /// Holding one of the manager-wide disruption slots.
    Slot,
    /// The group keeps at least its desired count of Ready nodes besides it.
    ReadyFloor,
}

impl Rule {
    pub const ALL: [Rule; 7] = [
        Rule::Stopped,
        Rule::Breaker,
        Rule::Masters,
        Rule::Window,
        Rule::DoNotDisrupt,
        Rule::Slot,
        Rule::ReadyFloor,
    ];

    fn title(self) -> &'static str {
        match self {
            Rule::Stopped => "group not stopped",
            Rule::Breaker => "breaker",
            Rule::Masters => "masters' rule",
            Rule::Window => "window",
            Rule::DoNotDisrupt => "do-not-disrupt",
            Rule::Slot => "slot",
            Rule::ReadyFloor => "Ready floor",
        }
    }
}

/// Whether a rule binds a reason, and if not, why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    Binds,
    Free(&'static str),
}

/// The rule book. Voluntary reasons keep every rule; a repair keeps what
/// protects the control plane, not a window; an interruption cannot stop
/// its loss, but retiring a master before AWS takes it still asks the
/// masters' rule. Nothing of ours but an interruption's drain happens to a
/// stopped group.
pub fn binding(reason: Reason, rule: Rule) -> Binding {
    use Binding::{Binds, Free};
    use Reason as R;
    use Rule as U;
    match (reason, rule) {
        (R::InterruptionDrain, _) => Free("AWS takes the node anyway"),
        (_, U::Stopped) => Binds,
        (R::Refresh | R::DriftRoll | R::ScaleIn | R::AtRisk | R::FallbackReturn, _) => Binds,
        (R::RefreshSurplus, U::Window) => {
            Free("gives back the run's own raise, at a window's close too")
        }
        (R::RefreshSurplus, _) => Binds,
        (R::NeverJoined, U::Masters | U::Breaker) => Binds,
        (R::NeverJoined, _) => Free("no Node, nothing runs on it"),
        (R::WorkerRepair, U::Masters) => Free("a worker"),
        (R::WorkerRepair, U::Breaker) => Binds,
        (R::MasterRepair, U::Breaker) => {
            Free("the masters' rule counts the cluster's masters instead")
        }
        (R::WorkerRepair | R::MasterRepair, U::ReadyFloor) => {
            Free("a dead node counts for nothing")
        }
        (R::MasterRepair, U::Masters) => Binds,
        // Its master is down already: any other master's removal sees it
        // down and waits (the masters' rule, on a fresh view before every
        // effect), so no slot is needed to serialise them, and none held
        // by another group's wait can hold a dead master back.
        (R::MasterRepair, U::Slot) => {
            Free("its master is down already; the masters' rule serialises")
        }
        (R::WorkerRepair | R::MasterRepair, _) => Free("a dead kubelet does not wait"),
        (R::Retirement, U::Masters) => Binds,
        (R::Retirement, _) => Free("AWS takes the node anyway"),
    }
}

/// Why a run takes a target away, in the rule book's terms.
pub fn reason_of(target: &RefreshTarget, trigger: Option<RunTrigger>) -> Reason {
    match (target.purpose, trigger) {
        (TargetPurpose::RemoveSurplus, _) => Reason::RefreshSurplus,
        (TargetPurpose::Replace, Some(RunTrigger::Drift)) => Reason::DriftRoll,
        (TargetPurpose::Replace, _) => Reason::Refresh,
    }
}

/// Why a run started by `trigger` replaces nodes, in the rule book's terms.
pub fn run_reason(trigger: Option<RunTrigger>) -> Reason {
    match trigger {
        Some(RunTrigger::Drift) => Reason::DriftRoll,
        _ => Reason::Refresh,
    }
}

pub fn binds(reason: Reason, rule: Rule) -> bool {
    binding(reason, rule) == Binding::Binds
}

/// The protected nodes (and why) as `reason` sees them: none when
/// protection does not bind it.
pub fn protected(
    reason: Reason,
    protected: &BTreeMap<String, String>,
) -> std::borrow::Cow<'_, BTreeMap<String, String>> {
    match binds(reason, Rule::DoNotDisrupt) {
        true => std::borrow::Cow::Borrowed(protected),
        false => std::borrow::Cow::Owned(BTreeMap::new()),
    }
}

/// The table as Markdown: a row per reason, a column per rule; a rule that
/// does not bind says why.
pub fn markdown() -> String {
    let mut out = String::from("| why a node goes |");
    for rule in Rule::ALL {
        out.push_str(&format!(" {} |", rule.title()));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(Rule::ALL.len()));
    out.push('\n');
    for reason in Reason::ALL {
        out.push_str(&format!("| {} |", reason.title()));
        for rule in Rule::ALL {
            match binding(reason, rule) {
                Binding::Binds => out.push_str(" yes |"),
                Binding::Free(why) => out.push_str(&format!(" no: {why} |")),
            }
        }
        out.push('\n');
    }
    out
}

/// The markers around the table in `docs/concepts/disruption.md`.
pub const BEGIN: &str = "<!-- rule book: generated from src/controllers/authority/rules.rs by `spot-node-manager reference`; do not edit by hand -->";
pub const END: &str = "<!-- end of the rule book -->";

/// `text` with the table between the markers made [`markdown`]'s; None when
/// the markers are missing.
pub fn splice(text: &str) -> Option<String> {
    let start = text.find(BEGIN)? + BEGIN.len();
    let end = start + text[start..].find(END)?;
    Some(format!(
        "{}\n\n{}\n{}",
        &text[..start],
        markdown(),
        &text[end..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn voluntary_reasons_keep_every_rule_and_an_interruption_drain_none() {
        for reason in [Reason::Refresh, Reason::DriftRoll, Reason::ScaleIn] {
            for rule in Rule::ALL {
                assert!(binds(reason, rule), "{reason:?} {rule:?}");
            }
        }
        for rule in Rule::ALL {
            assert!(!binds(Reason::InterruptionDrain, rule), "{rule:?}");
        }
        // A master's early retirement still asks the masters' rule; a
        // repair never waits for a window.
        assert!(binds(Reason::Retirement, Rule::Masters));
        assert!(!binds(Reason::MasterRepair, Rule::Window));
        // A dead master is never held by another group's slot.
        assert!(!binds(Reason::MasterRepair, Rule::Slot));
        assert!(!binds(Reason::WorkerRepair, Rule::Slot));
        // A run's surplus master is an etcd member like any other.
        assert!(binds(Reason::RefreshSurplus, Rule::Masters));
        // A suspended group: nothing of ours but an interruption's drain.
        for reason in Reason::ALL {
            let expected = reason != Reason::InterruptionDrain;
            assert_eq!(binds(reason, Rule::Stopped), expected, "{reason:?}");
        }
    }

    #[test]
    fn a_reason_protection_does_not_bind_sees_none() {
        let mut map = BTreeMap::new();
        map.insert("n1".to_string(), "do-not-disrupt".to_string());
        assert_eq!(protected(Reason::AtRisk, &map).len(), 1);
        assert!(protected(Reason::WorkerRepair, &map).is_empty());
    }

    #[test]
    fn the_table_has_a_row_per_reason_and_a_cell_per_rule() {
        let table = markdown();
        let rows: Vec<&str> = table.lines().collect();
        assert_eq!(rows.len(), 2 + Reason::ALL.len());
        for row in &rows {
            assert_eq!(row.matches('|').count(), Rule::ALL.len() + 2, "{row}");
        }
        assert!(
            rows.iter()
                .any(|r| r.starts_with("| master repair | yes |"))
        );
    }

    #[test]
    fn splice_replaces_only_what_is_between_the_markers() {
        let text = format!("before\n{BEGIN}\nold table\n{END}\nafter\n");
        let spliced = splice(&text).expect("markers");
        assert!(spliced.starts_with(&format!("before\n{BEGIN}\n\n| why a node goes |")));
        assert!(spliced.ends_with(&format!("\n{END}\nafter\n")));
        assert!(!spliced.contains("old table"));
        assert_eq!(splice(&spliced), Some(spliced.clone()), "idempotent");
        assert_eq!(splice("no markers"), None);
    }

    #[test]
    fn a_carried_reason_reads_back_and_the_replenishers_removals_bind_alike() {
        for r in Reason::ALL {
            assert_eq!(Reason::from_label(r.label()), Some(r));
        }
        assert_eq!(Reason::from_label("nonsense"), None);
        // The replenisher's plan gives a removal recorded without a reason
        // one on its next step; whichever it gives, the rules are the same.
        for alike in [Reason::AtRisk, Reason::FallbackReturn] {
            for rule in Rule::ALL {
                assert_eq!(
                    binds(alike, rule),
                    binds(Reason::ScaleIn, rule),
                    "{alike:?} {rule:?}"
                );
            }
        }
    }
}
