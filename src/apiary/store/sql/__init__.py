"""SQL written once for SQLite and PostgreSQL (sans-I/O, in the spirit of h11).

An aggregate's store is one class over a `SqlDatabase`: it describes each transaction as a
generator of statements (`statements`), with rows mapped from field lists (`columns`) and
the few differences of the two dialects rendered by `dialect`; a driver per database runs
that description (`sqlite`: synchronously, in the writer thread or process and the read
threads; `postgres`: on an async psycopg connection). `where` builds the WHERE clauses of
listings, `checks` holds the value checks every backend applies alike. One module per
aggregate holds its rows and its store; `store` gathers them over one database.
"""
