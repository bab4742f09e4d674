"""Coordinator configuration: defaults < TOML file < environment < command-line flags.

`loader.load_config` merges the layers into a `server.ServerConfig`; each table of the file
has the module of its name (router.py parses [router], and so on), over the typed-value
checks of values.py, so that every error names the setting and where it came from.

TOML (`--config FILE` or APIARY_CONFIG):

    [server]
    data_dir = ".apiary"
    grpc = "127.0.0.1:50051"
    http = "127.0.0.1:8080"
    store = "postgresql://..."      # optional; default SQLite under data_dir
    log_level = "INFO"

Further tables: [router], [hitl] (+ [[hitl.operators]]), [scheduler] (docs/scheduler.md,
"Configuration"), [handoff] (docs/handoff.md), [worktrees] (+ [[worktrees.repos]],
docs/worktrees.md), [rooms] (docs/negotiation-rooms.md, "Configuration"), [tools]
(docs/tools.md, "Configuration"), [negotiation] (docs/negotiation.md) and [swarm]
(docs/swarm.md: a swarm peer inside the coordinator) and [cluster] (docs/cluster.md).

Environment: APIARY_DATA_DIR, APIARY_GRPC, APIARY_HTTP, APIARY_STORE, APIARY_LOG_LEVEL.
"""
