"""Values and rules every layer uses: records, node digests, changes, revisions,
settings, the autoscaler's and rollout's arithmetic. No I/O, and no import of any
other layer of the controller."""
