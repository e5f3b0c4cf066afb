//! The AWS mutations the child controllers make, each through the mutation
//! gate (leadership, dry-run, metrics) and nowhere else.

use super::group_view::DesiredChange;
use crate::context::Context;
use crate::error::Error;
use crate::mutation::{Applied, Intent};

/// Sets each ASG's desired capacity, in order, through the mutation gate:
/// whether every change was made (none is in a dry run).
pub async fn set_desired_capacities(
    ctx: &Context,
    cloud: &dyn crate::cloud::Cloud,
    changes: &[DesiredChange],
    why: &str,
) -> Result<bool, Error> {
    let mut made = true;
    for change in changes {
        let applied: Applied<()> = ctx
            .mutations
            .perform(
                Intent::aws(
                    "set_desired_capacity",
                    format!("asg/{}", change.asg),
                    format!("{} -> {} ({why})", change.from, change.to),
                ),
                || cloud.set_desired_capacity(&change.asg, change.to),
            )
            .await?;
        made &= applied.performed().is_some();
    }
    Ok(made)
}

/// Terminates an instance through its ASG (with or without decrementing its
/// desired count), through the mutation gate.
pub async fn terminate_in_group(
    ctx: &Context,
    cloud: &dyn crate::cloud::Cloud,
    instance_id: &str,
    decrement: bool,
    why: String,
) -> Result<Applied<()>, Error> {
    ctx.mutations
        .perform(
            Intent::aws(
                "terminate_instance_in_auto_scaling_group",
                format!("instance/{instance_id}"),
                why,
            ),
            || cloud.terminate_in_group(instance_id, decrement),
        )
        .await
}
