"""The controller's HTTP API: the application (`app`), its routes and handlers,
and what every request passes on the way in (bodies, auth, rate limits)."""
