"""`llmgw gateway`: SMG as the data plane, its worker set kept equal to the
controller's serving endpoints (see DESIGN.md, "Gateway")."""
