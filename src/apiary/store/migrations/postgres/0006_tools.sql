-- Schema version 6: tool providers and their descriptors (RFC 18.1), so that the catalogue
-- DescribeTools serves survives a restart. One row per provider, one per tool; a provider's
-- registration replaces all of its tools at once.
CREATE TABLE tool_providers (
    -- COLLATE "C": listings are in code point order, as SQLite's.
    provider_id   TEXT COLLATE "C" PRIMARY KEY,
    kind          TEXT             NOT NULL,
    registered_at DOUBLE PRECISION NOT NULL,
    updated_at    DOUBLE PRECISION NOT NULL,
    registered_by TEXT             NOT NULL DEFAULT '',
    -- How to start the provider again (an MCP server's command line).
    config        JSONB            NOT NULL DEFAULT '{}'
);

-- position keeps the provider's order; (provider_id, position) is the listing order.
CREATE TABLE tools (
    provider_id       TEXT COLLATE "C" NOT NULL
                      REFERENCES tool_providers (provider_id) ON DELETE CASCADE,
    position          BIGINT           NOT NULL,
    tool_name         TEXT             NOT NULL,
    input_schema      TEXT             NOT NULL DEFAULT '',
    output_schema     TEXT             NOT NULL DEFAULT '',
    idempotent        BOOLEAN          NOT NULL DEFAULT FALSE,
    needs_worktree    BOOLEAN          NOT NULL DEFAULT FALSE,
    default_timeout_s BIGINT           NOT NULL DEFAULT 0,
    max_concurrency   BIGINT           NOT NULL DEFAULT 0,
    side_effects      TEXT             NOT NULL DEFAULT '',
    description       TEXT             NOT NULL DEFAULT '',
    PRIMARY KEY (provider_id, position),
    UNIQUE (provider_id, tool_name)
);
