"""The controller's state and its one writer (`facts.Facts`): store first, then
memory, then the change log. Approvals, events, credentials and client keys are
held here too, each by the module that owns it."""
