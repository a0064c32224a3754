"""The controller: the one writer of the fleet's facts, the views that follow them,
the reconcile loop that decides on them, and the HTTP API in front.

Its packages are layers; a module imports only from its own layer or the ones
below it (`tests/test_structure.py` checks this):

    main.py, migrate.py   the program: options, start, `controller migrate`
    http/                 the API: routes, handlers, auth and limits on the way in
    leadership.py         who leads, and the term and loop it runs while it does
    metrics.py            /metrics, read from the term
    loop/                 the reconcile loop: decide on a snapshot, then apply
    term.py               everything one leadership term builds
    views/                followers of the change log, each with its own cache
    state/                the facts and their one writer, with what they hold
    store/                durable state: SQLite or PostgreSQL
    core/                 values and rules every layer uses; imports no other layer
"""
