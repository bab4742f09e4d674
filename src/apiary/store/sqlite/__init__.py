"""The SQLite backend (the default): the database and its writer (on the event loop, a
thread or a process), checkpoints and the stores."""
