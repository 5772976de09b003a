"""The verbs: ADD, DEL, CHECK, STATUS and GC over the layers below (verbs), their networkPolicyOnly
twins chained after the primary CNI (chained), the steps both share (steps) and the undo stack of
a failed ADD (rollback). May import every cni layer and ipam; nothing imports it but cni.plugin."""
