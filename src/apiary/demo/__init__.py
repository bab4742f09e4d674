"""The `apiary demo` job: an embedded coordinator and real agent processes."""
