"""The reconcile loop: each step decides on one snapshot of the facts
(`fleet_snapshot`) and returns a plan (`plans`); `apply` writes every plan
through the facts in one place; `reconcile` runs the steps, pass after pass."""
