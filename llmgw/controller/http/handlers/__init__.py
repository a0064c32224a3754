"""The controller's route handlers, grouped by what they serve (llmgw.controller.http.routes
lists them with the roles each allows)."""
