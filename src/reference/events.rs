//! docs/reference/events.md, from `crate::events`.

use super::schema::cell;
use crate::events::{ConditionEvent, Reason};

pub fn page() -> String {
    let mut out = format!(
        "{}# Events\n\nThe manager writes `events.k8s.io/v1` Events on its NodeGroups and on Nodes (on a Node, in namespace `default`; apiservers before 1.23 refuse those, kubernetes/kubernetes#100125). A NodeGroup's Event about one node names the Node as its related object. Notes are cut to the apiserver's 1 KiB limit, saying how many bytes were left out. `kubectl -n <namespace> get events --field-selector involvedObject.kind=NodeGroup` lists a group's.\n\n| reason | type | on | meaning |\n|---|---|---|---|\n",
        super::HEADER
    );
    for r in Reason::ALL {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            r.as_str(),
            r.types(),
            r.on(),
            cell(&r.meaning())
        ));
    }
    out.push_str("\nBesides these, a NodeGroup gets a Warning Event named by a condition's own reason (e.g. `InvalidSchedule`, `NotLaunching`, `TooManyNotReady`, `KopsRollingUpdate`) with the condition's message when:\n\n");
    for (condition, when) in ConditionEvent::ALL {
        out.push_str(&format!("- `{condition}` {when};\n"));
    }
    out.push_str("\n[../operations.md](../operations.md) says what each condition reason means and what to do.\n");
    out
}
