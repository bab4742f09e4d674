"""The PostgreSQL backend: a connection pool and the stores."""
