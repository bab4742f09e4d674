"""The SQLite backend (the default): the database and its writer (thread or process),
checkpoints and the stores."""
