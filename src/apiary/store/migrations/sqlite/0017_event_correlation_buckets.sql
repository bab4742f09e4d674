-- Schema version 17: the event log's correlation index leads with the event's bucket, its
-- sequence shifted right by 12 bits (4,096 events; apiary.store.sqlite.database
-- CORRELATION_BUCKET_BITS says the same). A flow's correlation key is random, so an index
-- led by it took each new event's entry on a page of its own anywhere in the index, and
-- the index grows with the log: about one page written to the WAL per event. Led by the
-- bucket, new entries all land in the newest bucket's few pages. A read by correlation_id
-- looks the key up in each bucket from the first it needs (docs/performance.md).
DROP INDEX events_by_correlation_key;
CREATE INDEX events_by_correlation_bucket ON events ((sequence >> 12), correlation_key, sequence);
