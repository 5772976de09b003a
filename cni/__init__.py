"""Ferry's CNI plugin and what it shares with route-sync. Standard library only on the per-Pod path."""
