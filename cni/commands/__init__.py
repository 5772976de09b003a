"""The verbs, one module each: add, delete (DEL), check, status and gc over the layers below; the
lone Node's bridge and gateway (gateway), their networkPolicyOnly twins chained after the primary
CNI (chained), the steps they share (steps) and the undo stack of a failed ADD (rollback). May
import every cni layer (ipam included); nothing imports it but cni.plugin, and no verb imports another."""
