//! Manager-wide disruption slots: how many groups may run a voluntary
//! disruption (a refresh or a drift roll, the replenisher's removal of a
//! surplus node or of a node at risk) at once (`disruption.maxConcurrent`,
//! default 1), and never two Master groups at once, so masters kept in
//! separate groups (one per etcd member) are never disrupted together.
//!
//! Held in one Lease (`<lease name>-disruptions`, next to the leader's), as a
//! JSON list in an annotation. Taking and releasing a slot is a
//! compare-and-swap on the Lease's resourceVersion, so of two groups racing
//! for the last slot exactly one wins; a restarted manager finds its holders
//! there and resumes as them. A holder whose Refresher (or Replenisher) no
//! longer exists does not keep its slot.

use crate::context::Context;
use crate::crd::Role;
use crate::mutation::Intent;
use crate::{Error, Result};
use chrono::{DateTime, Utc};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ObjectMeta, PostParams};
use serde::{Deserialize, Serialize};

/// The annotation holding the slots' holders.
pub const ANNOTATION: &str = "nodemanager.dev/disruption-slots";

/// One group running a voluntary disruption.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SlotHolder {
    /// `<namespace>/<Refresher name>`, or `Replenisher <namespace>/<name>`.
    pub holder: String,
    pub role: Role,
    pub since: DateTime<Utc>,
}

/// The slot as a refresh plan sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotState {
    /// This group holds a slot.
    Ours,
    /// One is free for this group: take it.
    Free,
    /// None is free for this group, and why (who holds them).
    Full(String),
}

/// Pure: the slot from `me`'s side. `live` says whether a holder's
/// Refresher still exists (a gone one frees its slot).
pub fn decide(
    holders: &[SlotHolder],
    me: &str,
    role: Role,
    limit: u32,
    live: impl Fn(&SlotHolder) -> bool,
) -> SlotState {
    if holders.iter().any(|h| h.holder == me) {
        return SlotState::Ours;
    }
    let others: Vec<&SlotHolder> = holders.iter().filter(|h| live(h)).collect();
    if role == Role::Master
        && let Some(master) = others.iter().find(|h| h.role == Role::Master)
    {
        return SlotState::Full(format!(
            "{} is disrupting a control-plane node (one at a time across Master groups)",
            master.holder
        ));
    }
    if others.len() as u64 >= u64::from(limit) {
        let names: Vec<&str> = others.iter().map(|h| h.holder.as_str()).collect();
        return SlotState::Full(format!(
            "{} of {limit} disruption slot(s) held, by {} (--max-concurrent-disruptions)",
            others.len(),
            names.join(", ")
        ));
    }
    SlotState::Free
}

/// The holders recorded on a Lease. A malformed record is an error, never
/// read as "no holders": that would free every slot.
pub fn holders_of(lease: &Lease) -> Result<Vec<SlotHolder>> {
    let Some(raw) = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
    else {
        return Ok(vec![]);
    };
    serde_json::from_str(raw).map_err(|source| Error::Serialization {
        context: format!("the Lease's {ANNOTATION} annotation"),
        source,
    })
}

/// Who asks, and where the slots are kept.
pub struct Slots<'a> {
    pub ctx: &'a Context,
    /// `<namespace>/<Refresher name>`, or `Replenisher <namespace>/<name>`.
    pub me: String,
    pub role: Role,
}

/// How a Replenisher's holder name starts (a Refresher's has no prefix).
const REPLENISHER: &str = "Replenisher ";

impl<'a> Slots<'a> {
    /// The slots from a Refresher's side.
    pub fn of(ctx: &'a Context, refresher: &crate::crd::Refresher, role: Role) -> Slots<'a> {
        use kube::ResourceExt;
        Slots {
            ctx,
            me: format!(
                "{}/{}",
                refresher.namespace().unwrap_or_default(),
                refresher.name_any()
            ),
            role,
        }
    }

    /// The slots from a Replenisher's side (its removals of a surplus node
    /// or a node at risk).
    pub fn of_replenisher(
        ctx: &'a Context,
        replenisher: &crate::crd::Replenisher,
        role: Role,
    ) -> Slots<'a> {
        use kube::ResourceExt;
        Slots {
            ctx,
            me: format!(
                "{REPLENISHER}{}/{}",
                replenisher.namespace().unwrap_or_default(),
                replenisher.name_any()
            ),
            role,
        }
    }

    fn api(&self) -> Api<Lease> {
        Api::namespaced(
            self.ctx.client.clone(),
            &self.ctx.settings.leader_election.lease_namespace,
        )
    }

    fn name(&self) -> String {
        format!(
            "{}-disruptions",
            self.ctx.settings.leader_election.lease_name
        )
    }

    fn limit(&self) -> u32 {
        self.ctx.settings.max_concurrent_disruptions
    }

    async fn read(&self) -> Result<(Option<Lease>, Vec<SlotHolder>)> {
        let lease = self
            .api()
            .get_opt(&self.name())
            .await
            .map_err(Error::kube("get the disruption slots' Lease"))?;
        let holders = match &lease {
            Some(l) => holders_of(l)?,
            None => vec![],
        };
        Ok((lease, holders))
    }

    /// The holders whose Refresher or Replenisher still exists, besides `me`.
    async fn live_others(&self, holders: &[SlotHolder]) -> Result<Vec<SlotHolder>> {
        let mut live = vec![];
        for h in holders.iter().filter(|h| h.holder != self.me) {
            let (replenisher, at) = match h.holder.strip_prefix(REPLENISHER) {
                Some(at) => (true, at),
                None => (false, h.holder.as_str()),
            };
            let (namespace, name) = at.split_once('/').unwrap_or(("", at));
            let client = self.ctx.client.clone();
            let found = match replenisher {
                true => exists::<crate::crd::Replenisher>(client, namespace, name).await?,
                false => exists::<crate::crd::Refresher>(client, namespace, name).await?,
            };
            if found {
                live.push(h.clone());
            }
        }
        Ok(live)
    }

    /// The slot from our side, as a plan sees it.
    pub async fn observe(&self) -> Result<SlotState> {
        let (_, holders) = self.read().await?;
        if holders.iter().any(|h| h.holder == self.me) {
            return Ok(SlotState::Ours);
        }
        let live = self.live_others(&holders).await?;
        Ok(decide(&live, &self.me, self.role, self.limit(), |_| true))
    }

    /// Takes a slot if one is free for us. Ok(true) when we hold one.
    pub async fn take(&self, now: DateTime<Utc>) -> Result<bool> {
        let (lease, holders) = self.read().await?;
        if holders.iter().any(|h| h.holder == self.me) {
            return Ok(true);
        }
        let mut live = self.live_others(&holders).await?;
        if decide(&live, &self.me, self.role, self.limit(), |_| true) != SlotState::Free {
            return Ok(false);
        }
        live.push(SlotHolder {
            holder: self.me.clone(),
            role: self.role,
            since: now,
        });
        self.write(lease, &live, "take_disruption_slot").await
    }

    /// Gives our slot back, if we hold one. Ok(false) on a lost race.
    pub async fn release(&self) -> Result<bool> {
        let (lease, mut holders) = self.read().await?;
        if !holders.iter().any(|h| h.holder == self.me) {
            return Ok(true);
        }
        holders.retain(|h| h.holder != self.me);
        self.write(lease, &holders, "release_disruption_slot").await
    }

    /// Writes the holders, only if the Lease is still as read (or, absent,
    /// still absent). Ok(false) when another writer got there first.
    async fn write(
        &self,
        lease: Option<Lease>,
        holders: &[SlotHolder],
        action: &'static str,
    ) -> Result<bool> {
        let value = serde_json::to_string(holders).map_err(|source| Error::Serialization {
            context: "disruption slots".into(),
            source,
        })?;
        let name = self.name();
        let mut lease = lease.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        });
        let create = lease.metadata.resource_version.is_none();
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(ANNOTATION.into(), value);
        let api = self.api();
        let target = format!(
            "lease/{}/{name}",
            self.ctx.settings.leader_election.lease_namespace
        );
        let result = self
            .ctx
            .mutations
            .perform(Intent::own(action, target), || async {
                let written = match create {
                    true => api.create(&PostParams::default(), &lease).await,
                    false => api.replace(&name, &PostParams::default(), &lease).await,
                };
                match written {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(Error::kube(format!("{action} on Lease {name}"))(e)),
                }
            })
            .await?;
        Ok(result.performed().unwrap_or(false))
    }
}

/// Whether the holder exists: metadata only, whatever its spec says.
async fn exists<K>(client: kube::Client, namespace: &str, name: &str) -> Result<bool>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    Api::<K>::namespaced(client, namespace)
        .get_metadata_opt(name)
        .await
        .map(|o| o.is_some())
        .map_err(Error::kube("get a disruption slot's holder"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn held(holder: &str, role: Role) -> SlotHolder {
        SlotHolder {
            holder: holder.into(),
            role,
            since: Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap(),
        }
    }

    #[test]
    fn a_slot_is_free_under_the_limit_and_full_at_it() {
        let one = [held("ns/a", Role::Worker)];
        assert_eq!(
            decide(&one, "ns/b", Role::Worker, 2, |_| true),
            SlotState::Free
        );
        let SlotState::Full(why) = decide(&one, "ns/b", Role::Worker, 1, |_| true) else {
            panic!("a second worker group under a limit of 1");
        };
        assert!(why.contains("ns/a"), "{why}");
    }

    #[test]
    fn a_restarted_holder_finds_its_slot() {
        let one = [held("ns/a", Role::Worker)];
        assert_eq!(
            decide(&one, "ns/a", Role::Worker, 1, |_| true),
            SlotState::Ours
        );
    }

    #[test]
    fn two_master_groups_never_hold_slots_together_whatever_the_limit() {
        let one = [held("ns/masters-a", Role::Master)];
        assert!(matches!(
            decide(&one, "ns/masters-b", Role::Master, 10, |_| true),
            SlotState::Full(_)
        ));
        // A worker group may run beside a master group under a higher limit.
        assert_eq!(
            decide(&one, "ns/nodes", Role::Worker, 2, |_| true),
            SlotState::Free
        );
    }

    #[test]
    fn a_holder_whose_refresher_is_gone_frees_its_slot() {
        let one = [held("ns/gone", Role::Master)];
        assert_eq!(
            decide(&one, "ns/masters", Role::Master, 1, |h| h.holder
                != "ns/gone"),
            SlotState::Free
        );
    }

    #[test]
    fn a_malformed_record_is_an_error_not_free_slots() {
        let mut lease = Lease::default();
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(ANNOTATION.into(), "not json".into());
        assert!(holders_of(&lease).is_err());
        assert_eq!(holders_of(&Lease::default()).ok(), Some(vec![]));
    }
}
