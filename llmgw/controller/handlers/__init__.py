"""The controller's route handlers, grouped by what they serve (llmgw.controller.routes
lists them with the roles each allows)."""
